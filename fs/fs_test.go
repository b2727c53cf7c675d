package fs_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/fusetest"
	"golang.org/x/sys/unix"
)

func mountFake(t *testing.T, b fs.Backend) string {
	t.Helper()
	return fusetest.Mount(t, b, fs.Options{Timeout: time.Second})
}

func TestPeerMemory(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 10000)
	dir := mountFake(t, f)

	ents, err := os.ReadDir(filepath.Join(dir, "peers"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "1,2" {
		t.Fatalf("peers/ lists %v", names)
	}
	mem := filepath.Join(dir, "peers/2/mem")
	st, err := os.Stat(mem)
	if err != nil || st.Size() != 10000 {
		t.Fatalf("stat mem: %v size %d", err, st.Size())
	}
	file, err := os.OpenFile(mem, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	msg := []byte("hello from pwrite")
	if n, err := file.WriteAt(msg, 9000); err != nil || n != len(msg) {
		t.Fatalf("pwrite: %d %v", n, err)
	}
	peerMem := make([]byte, len(msg))
	f.mu.Lock()
	r2 := f.peers[2]["mem"]
	f.mu.Unlock()
	r2.ReadAt(peerMem, 9000)
	if !bytes.Equal(peerMem, msg) {
		t.Fatal("pwrite did not reach the peer's memory")
	}
	got := make([]byte, len(msg))
	if n, err := file.ReadAt(got, 9000); err != nil || n != len(msg) || !bytes.Equal(got, msg) {
		t.Fatalf("pread: %d %v %q", n, err, got)
	}
	// Short read at the end, EOF past it.
	buf := make([]byte, 100)
	if n, _ := file.ReadAt(buf, 9950); n != 50 {
		t.Fatalf("read across the end returned %d bytes, want 50", n)
	}
	if n, err := file.ReadAt(buf, 10000); n != 0 || err == nil {
		t.Fatalf("read at the end: %d %v, want EOF", n, err)
	}
	// Write past the end fails with EFBIG.
	if n, err := unix.Pwrite(int(file.Fd()), []byte("xx"), 9999); n != 1 || err != nil {
		t.Fatalf("write across the end: %d %v, want the 1 byte in range", n, err)
	}
	if _, err := unix.Pwrite(int(file.Fd()), []byte("x"), 10000); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("write at the end: %v, want EFBIG", err)
	}
	// Atomics through the ioctl.
	var arg fs.AtomicArg
	if old, err := ioctlAtomic(file, fs.IoctlFetchAdd, &fs.AtomicArg{Offset: 64, A: 5}, &arg); err != nil || old != 0 {
		t.Fatalf("fetch-add: %d %v", old, err)
	}
	if old, err := ioctlAtomic(file, fs.IoctlCompareAndSwap, &fs.AtomicArg{Offset: 64, A: 5, B: 9}, &arg); err != nil || old != 5 {
		t.Fatalf("cmp-swap: %d %v", old, err)
	}
	if _, err := ioctlAtomic(file, fs.IoctlFetchAdd, &fs.AtomicArg{Offset: 60, A: 1}, &arg); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("misaligned atomic: %v, want EINVAL", err)
	}
	// Unknown gid and region: ENOENT.
	if _, err := os.Stat(filepath.Join(dir, "peers/77")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unknown gid: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "peers/2/mr/nope")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unknown region: %v", err)
	}
	// A dead peer: EHOSTDOWN.
	f.mu.Lock()
	f.down[2] = true
	f.mu.Unlock()
	if _, err := file.ReadAt(buf[:8], 0); !errors.Is(err, syscall.EHOSTDOWN) {
		t.Fatalf("read from a dead peer: %v, want EHOSTDOWN", err)
	}
}

func ioctlAtomic(f *os.File, cmd uint32, in, out *fs.AtomicArg) (uint64, error) {
	var b [fs.AtomicArgSize]byte
	in.Encode(b[:])
	_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(cmd), uintptr(unsafe.Pointer(&b[0])))
	if e != 0 {
		return 0, e
	}
	if err := out.Decode(b[:]); err != nil {
		return 0, err
	}
	return out.Old, nil
}

func TestLocalRegionsAndPorts(t *testing.T) {
	f := newFake(1)
	dir := mountFake(t, f)
	reg := filepath.Join(dir, "regions/cache")
	file, err := os.Create(reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := file.Truncate(1 << 16); err != nil {
		t.Fatal(err)
	}
	if _, err := file.WriteAt([]byte("local"), 100); err != nil {
		t.Fatal(err)
	}
	file.Close()
	if st, err := os.Stat(reg); err != nil || st.Size() != 1<<16 {
		t.Fatalf("stat: %v", err)
	}
	// Peers see it under peers/<self>/mr/.
	b, err := os.ReadFile(filepath.Join(dir, "peers/1/mr/cache"))
	if err != nil || len(b) != 1<<16 || string(b[100:105]) != "local" {
		t.Fatalf("peers/1/mr/cache: %v len %d", err, len(b))
	}
	if err := os.Chmod(reg, 0o600); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(reg); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v after chmod", st.Mode())
	}
	if err := os.Remove(reg); err != nil {
		t.Fatal(err)
	}
	// The default region keeps its size: a shell redirection's truncation
	// is ignored, a resize refused.
	if err := os.WriteFile(filepath.Join(dir, "regions/mem"), []byte("shell"), 0); err != nil {
		t.Fatalf("echo > regions/mem: %v", err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "regions/mem")); st.Size() != 4096 {
		t.Fatalf("regions/mem resized to %d by a redirection", st.Size())
	}
	if err := os.Truncate(filepath.Join(dir, "regions/mem"), 100); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("truncate regions/mem: %v, want EPERM", err)
	}
	if _, err := os.Stat(reg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("removed region still there: %v", err)
	}
	// Ports: bind by creating, each read returns one message.
	port := filepath.Join(dir, "ports/7")
	pf, err := os.Create(port)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	// touch on an existing port works (times are accepted and ignored).
	if err := os.Chtimes(port, time.Now(), time.Now()); err != nil {
		t.Fatalf("touch a port: %v", err)
	}
	w, err := os.OpenFile(filepath.Join(dir, "peers/1/ports/7"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"one", "two!"} {
		if _, err := w.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	r, err := os.Open(port)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 100)
	for _, want := range []string{"one", "two!"} {
		n, err := r.Read(buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("read port: %q %v, want %q", buf[:n], err, want)
		}
	}
	// stats is readable.
	if s, err := os.ReadFile(filepath.Join(dir, "stats")); err != nil || !strings.Contains(string(s), "connects") {
		t.Fatalf("stats: %q %v", s, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.connect != f.closed {
		t.Errorf("%d connects, %d closes: a VQP leaked", f.connect, f.closed)
	}
}
