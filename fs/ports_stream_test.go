package fs_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/fusetest"
)

// guard bounds a wait for an event that must come; it is a failure
// report, not a timing assumption.
const guard = 30 * time.Second

func bindPort(t *testing.T, f *fakeBackend, dir string, num uint32) (string, *fakePort) {
	t.Helper()
	port := filepath.Join(dir, fmt.Sprintf("ports/%d", num))
	pf, err := os.Create(port)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	f.mu.Lock()
	p := f.ports[num]
	f.mu.Unlock()
	return port, p
}

func sendTo(t *testing.T, dir string, num uint32, msgs ...string) {
	t.Helper()
	for _, m := range msgs {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("peers/1/ports/%d", num)), []byte(m), 0); err != nil {
			t.Fatalf("send %q: %v", m, err)
		}
	}
}

// drain reads a port through an O_NONBLOCK descriptor until EAGAIN.
func drain(t *testing.T, port string) []string {
	t.Helper()
	fd, err := syscall.Open(port, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	var got []string
	buf := make([]byte, 4096)
	for {
		n, err := syscall.Read(fd, buf)
		if errors.Is(err, syscall.EAGAIN) {
			return got
		}
		if err != nil || n == 0 {
			t.Fatalf("draining %s after %q: %d %v", port, got, n, err)
		}
		got = append(got, string(buf[:n]))
	}
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(guard):
		t.Fatalf("%s: not within %v", what, guard)
	}
}

// A reader killed while it waits on a port loses no message: the message
// taken for it as the kernel interrupted its read (the fake port hands it
// over after the read's context ended, the race a real port can lose) goes
// back to the head of the queue, and the next reader gets every message,
// in order.
func TestPortReaderKilledLosesNoMessage(t *testing.T) {
	f := newFake(1)
	dir := mountFake(t, f)
	port, p := bindPort(t, f, dir, 9)
	waiting, gaveUp := make(chan struct{}), make(chan struct{})
	p.mu.Lock()
	p.takeLate, p.waiting, p.gaveUp = true, waiting, gaveUp
	p.mu.Unlock()

	reader := exec.Command("dd", "if="+port, "bs=64k", "count=1", "status=none")
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = reader.Wait(); close(exited) }()
	waitFor(t, waiting, "the reader waiting on the port")
	if err := reader.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, gaveUp, "the killed reader's read interrupted")
	want := []string{"m0", "m1", "m2", "m3", "m4"}
	sendTo(t, dir, 9, want...)
	waitFor(t, exited, "the killed reader gone")
	p.mu.Lock()
	p.takeLate = false
	p.mu.Unlock()
	if got := drain(t, port); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("after a reader was killed: the next reader got %q, want %q", got, want)
	}
}

// A port reads like a file being appended to: read() until 0 returns
// the messages queued (waiting for the first), the read after the 0
// waits again, and st_size is the bytes queued plus the bytes read
// through descriptors still open, so it grows by each message. cat
// prints what is queued and exits.
func TestPortReadsToEndOfFileAndSizeGrows(t *testing.T) {
	f := newFake(1)
	dir := mountFake(t, f)
	port, _ := bindPort(t, f, dir, 9)
	size := func() int64 {
		t.Helper()
		st, err := os.Stat(port)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	sendTo(t, dir, 9, "one", "two!")
	if s := size(); s != 7 {
		t.Fatalf("size with 7 bytes queued: %d", s)
	}
	r, err := os.Open(port)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	for _, want := range []string{"one", "two!", ""} {
		n, err := syscall.Read(int(r.Fd()), buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("read: %q %v, want %q", buf[:max(n, 0)], err, want)
		}
		if s := size(); s != 7 {
			t.Fatalf("size after reading %q: %d, want 7 (read through an open descriptor, or queued)", want, s)
		}
	}
	if st, err := r.Stat(); err != nil || st.Size() != 7 {
		t.Fatalf("fstat: %v %v, want size 7", st, err)
	}
	// After the end of file, a read waits for the next message.
	got := make(chan string, 1)
	go func() {
		n, err := syscall.Read(int(r.Fd()), buf)
		got <- fmt.Sprintf("%q %v", buf[:max(n, 0)], err)
	}()
	sendTo(t, dir, 9, "three")
	select {
	case g := <-got:
		if g != `"three" <nil>` {
			t.Fatalf("read after the end of file: %s", g)
		}
	case <-time.After(guard):
		t.Fatal("read after the end of file did not return the next message")
	}
	if s := size(); s != 12 {
		t.Fatalf("size: %d, want 12", s)
	}
	r.Close()
	// Close is asynchronous in FUSE (RELEASE): wait for the size to drop.
	deadline := time.Now().Add(guard)
	for size() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("size after the descriptor closed: %d, want 0", size())
		}
		time.Sleep(10 * time.Millisecond)
	}
	sendTo(t, dir, 9, "x\n", "y\n")
	cat := exec.Command("cat", port)
	out, err := cat.Output()
	if err != nil || string(out) != "x\ny\n" {
		t.Fatalf("cat: %q %v", out, err)
	}
}

// tail -f prints each message as it arrives, and once killed leaves the
// messages it did not print on the port. tail sees a FUSE file as
// remote: it reads to the end of file once, then follows st_size with
// fstat (every 0.1 s here), reading the bytes by which it grew.
func TestTailFollowsAPort(t *testing.T) {
	if _, err := exec.LookPath("tail"); err != nil {
		t.Skip("no tail")
	}
	f := newFake(1)
	dir := mountFake(t, f)
	port, _ := bindPort(t, f, dir, 9)
	sendTo(t, dir, 9, "a1\n", "a2\n")
	tail := exec.Command("tail", "-f", "-s", "0.1", port)
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	tail.Stderr = &stderr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	defer func() {
		_ = tail.Process.Kill()
		_ = tail.Wait()
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok || l != want {
				t.Fatalf("tail printed %q (open %v), want %q; stderr %q", l, ok, want, stderr.String())
			}
		case <-time.After(guard):
			t.Fatalf("tail printed nothing for %v, want %q; stderr %q", guard, want, stderr.String())
		}
	}
	expect("a1")
	expect("a2")
	for i := range 5 {
		m := fmt.Sprintf("b%d", i)
		sendTo(t, dir, 9, m+"\n")
		expect(m)
	}
	sendTo(t, dir, 9, "b5\n", "b6\n", "b7\n")
	expect("b5")
	expect("b6")
	expect("b7")
	if err := tail.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = tail.Wait()
	for l := range lines {
		t.Fatalf("tail printed %q more", l)
	}
	want := []string{"c0\n", "c1\n", "c2\n"}
	sendTo(t, dir, 9, want...)
	if got := drain(t, port); strings.Join(got, "") != strings.Join(want, "") {
		t.Fatalf("after tail was killed: %q, want %q", got, want)
	}
}

// inPoll waits until process pid sleeps in poll(2) or ppoll(2).
func inPoll(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for time.Now().Before(deadline) {
		sc, err1 := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
		st, err2 := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err1 != nil || err2 != nil {
			t.Skipf("cannot see the poller's system call: %v %v", err1, err2)
		}
		f := strings.Fields(string(sc))
		s := string(st)
		if len(f) > 0 && (f[0] == "7" || f[0] == "271") && strings.Contains(s[strings.LastIndexByte(s, ')'):], " S ") {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("process %d not waiting in poll within %v", pid, guard)
}

// With Options.Poll on krfs's own transport, poll(2) on a port file
// waits for a message: an empty port is not ready, a message wakes the
// poller, and after a read that returned a message the port is ready
// (its next read returns 0) until that read. Go-fuse's server (the dev
// transport) answers FUSE_POLL with ENOSYS and cannot do this.
func TestPollWaitsForAPortMessage(t *testing.T) {
	fusetest.RequireURing(t) // krfs's own server; go-fuse's answers ENOSYS
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	f := newFake(1)
	// This process opens files of the mount through syscall only (os.Open
	// would register them with the runtime's netpoller, whose FUSE_POLL
	// requests the polling mount answers: see fuseserve.Poller).
	dir := fusetest.Mount(t, f, fs.Options{Timeout: time.Second, Transport: fs.TransportURing, Poll: true})
	port := filepath.Join(dir, "ports/9")
	fd, err := syscall.Open(port, syscall.O_RDONLY|syscall.O_CREAT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd)
	send := func(m string) {
		t.Helper()
		fd, err := syscall.Open(filepath.Join(dir, "peers/1/ports/9"), syscall.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		if _, err := syscall.Write(fd, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	py := `import os, select, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
p = select.poll()
p.register(fd, select.POLLIN)
print("empty", [e for _, e in p.poll(0)], flush=True)
print("waiting", flush=True)
print("woken", [e for _, e in p.poll(30000)], flush=True)
print("got", os.read(fd, 100).decode(), flush=True)
print("after", [e for _, e in p.poll(0)], flush=True)
print("eof", len(os.read(fd, 100)), flush=True)
print("drained", [e for _, e in p.poll(0)], flush=True)
`
	cmd := exec.Command("python3", "-c", py, port)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case l := <-lines:
			if l != want {
				t.Fatalf("poller: %q, want %q; stderr %q", l, want, stderr.String())
			}
		case <-time.After(guard):
			t.Fatalf("poller said nothing for %v, want %q; stderr %q", guard, want, stderr.String())
		}
	}
	expect("empty []")
	expect("waiting")
	inPoll(t, cmd.Process.Pid)
	send("hi")
	expect("woken [1]")
	expect("got hi")
	expect("after [1]")
	expect("eof 0")
	expect("drained []")
}
