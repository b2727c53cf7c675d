package tests

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/krfs/krfs/fs"
	"golang.org/x/sys/unix"
)

// Hardening (issue 11): permission-checked atomics, region memory that
// cannot fault, exact byte counts, on the real binary. Each test runs its
// daemons in a network namespace of its own (named after the test
// process's pid), so that their loopback ports collide with nothing.

// privateNS creates network namespace kh<pid>-<tag> with its loopback up;
// it is deleted at cleanup.
func privateNS(t *testing.T, tag string) string {
	t.Helper()
	if top, err := filepath.Abs(".."); err == nil {
		sweepStale(t, top)
	}
	name := fmt.Sprintf("kh%d-%s", os.Getpid()%100000, tag)
	exec.Command("ip", "netns", "del", name).Run() // leftovers of a crashed run
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v %s", name, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v %s", name, err, out)
	}
	return name
}

// nsDaemon is a `krfs mount` running in a namespace.
type nsDaemon struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startNSMount runs `krfs mount MNT ARGS...` in namespace ns (with
// nsenter --net, so that the mount is visible to the test) and waits
// until it is mounted. It is interrupted and unmounted at cleanup.
func startNSMount(t *testing.T, bin, ns, mnt string, args ...string) *nsDaemon {
	t.Helper()
	logPath := mnt + ".log"
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, bin, "mount", mnt}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	d := &nsDaemon{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-d.done
		}
		if isMounted(mnt) {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s (tail):\n%s", logPath, tail(b, 30))
		}
	})
	deadline := time.Now().Add(hangGuard)
	for !isMounted(mnt) {
		select {
		case <-d.done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("krfs mount %s exited: %s", mnt, b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("%s did not mount: %s", mnt, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return d
}

// alive reports whether the daemon still runs.
func (d *nsDaemon) alive() bool {
	select {
	case <-d.done:
		return false
	default:
		return syscall.Kill(d.cmd.Process.Pid, 0) == nil
	}
}

func (d *nsDaemon) logText() string {
	b, _ := os.ReadFile(d.log)
	return string(b)
}

// atomicOn runs one atomic ioctl on an open file and returns the old value.
func atomicOn(f *os.File, cmd uint32, off, a, b uint64) (uint64, error) {
	var buf [fs.AtomicArgSize]byte
	arg := fs.AtomicArg{Offset: off, A: a, B: b}
	arg.Encode(buf[:])
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(cmd), uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return 0, e
	}
	arg.Decode(buf[:])
	return arg.Old, nil
}

// nobodyAtomics is run by python3 as user nobody: it opens argv[1] with
// the mode argv[2] (ro or rw) and tries a FETCH_ADD and a CMP_SWAP on the
// word at offset argv[5], printing the outcome of each (ok:OLD or the errno
// name).
const nobodyAtomics = `
import errno, fcntl, os, struct, sys
path, mode, faa, cas, off = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def op(fd, cmd, a, b):
    buf = bytearray(struct.pack('=QQQQ', off, a, b, 0))
    try:
        fcntl.ioctl(fd, cmd, buf, True)
        return 'ok:%d' % struct.unpack('=QQQQ', buf)[3]
    except OSError as e:
        return errno.errorcode[e.errno]
try:
    fd = os.open(path, os.O_RDONLY if mode == 'ro' else os.O_RDWR)
except OSError as e:
    print('open:' + errno.errorcode[e.errno])
    sys.exit(0)
print('faa:' + op(fd, faa, 1, 0), 'cas:' + op(fd, cas, 123, 456))
`

// TestAtomicsNeedAWritableDescriptor: with --allow-other
// --default-permissions, user nobody may open a root-owned 0644 region
// (the default mode of regions/mem) read-only, but its atomics through
// that descriptor fail with EBADF and change nothing, on a peer file and
// on local regions; it cannot open them for writing; on a region of its
// own, opened for writing, atomics work.
func TestAtomicsNeedAWritableDescriptor(t *testing.T) {
	requireE2E(t)
	requireSetpriv(t)
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3 for user nobody")
	}
	bin := build(t, mustAbs(t, ".."))
	dir := opsDir(t)
	ns := privateNS(t, "perm")
	mnt := mkdir(t, filepath.Join(dir, "m"))
	startNSMount(t, bin, ns, mnt, "--listen", "127.0.0.1:4900", "--gid", "7", "--shm-dir", filepath.Join(dir, "shm"),
		"--mem-size", "1M", "--allow-other", "--default-permissions")
	script := filepath.Join(dir, "atomics.py")
	if err := os.WriteFile(script, []byte(nobodyAtomics), 0o644); err != nil {
		t.Fatal(err)
	}

	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(mnt, "regions/mem"), &st); err != nil || st.Mode&0o7777 != 0o644 || st.Uid != 0 {
		t.Fatalf("regions/mem: mode %o uid %d (%v); want the documented default 0644 owned by the mounting user", st.Mode&0o7777, st.Uid, err)
	}
	r := filepath.Join(mnt, "regions/r")
	if err := os.WriteFile(r, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(r, 4096); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(r, 0o644); err != nil {
		t.Fatal(err)
	}
	asNobodyAtomics := func(path, mode string, off int) string {
		out, err := asNobody(t, fmt.Sprintf("%s %s %s %s %d %d %d", py, script, path, mode, fs.IoctlFetchAdd, fs.IoctlCompareAndSwap, off))
		if err != nil {
			t.Fatalf("python as nobody: %v %s", err, out)
		}
		return strings.TrimSpace(out)
	}
	// peers/7/mem and regions/mem are the same memory: each file gets a
	// word of its own.
	for i, name := range []string{"peers/7/mem", "regions/mem", "regions/r"} {
		path := filepath.Join(mnt, name)
		off := 64 + 8*i
		if got := asNobodyAtomics(path, "ro", off); got != "faa:EBADF cas:EBADF" {
			t.Errorf("%s: nobody's atomics through O_RDONLY: %s; want EBADF for both", name, got)
		}
		if got := asNobodyAtomics(path, "rw", off); got != "open:EACCES" {
			t.Errorf("%s: nobody opening a root 0644 region for writing: %s; want EACCES", name, got)
		}
		// Root's writable descriptor works, and finds the word untouched.
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if old, err := atomicOn(f, fs.IoctlFetchAdd, uint64(off), 1, 0); err != nil || old != 0 {
			t.Errorf("%s: root's FETCH_ADD: old %d %v; want 0 (nobody's tries changed nothing)", name, old, err)
		}
		// And root, too, gets EBADF through a read-only descriptor.
		ro, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := atomicOn(ro, fs.IoctlCompareAndSwap, uint64(off), 1, 5); !errors.Is(err, syscall.EBADF) {
			t.Errorf("%s: root's CMP_SWAP through O_RDONLY: %v; want EBADF", name, err)
		}
		ro.Close()
		f.Close()
	}
	// nobody's own region, opened for writing: atomics work.
	if err := os.Chown(r, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(r, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := asNobodyAtomics(r, "rw", 80); got != "faa:ok:1 cas:ok:2" {
		t.Errorf("nobody on its own region through O_RDWR: %s; want faa:ok:1 cas:ok:2", got)
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// smallTmpfs mounts a tmpfs of the given size at dir/name, unmounted at
// cleanup.
func smallTmpfs(t *testing.T, dir, name, size string) string {
	t.Helper()
	p := mkdir(t, filepath.Join(dir, name))
	if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
	return p
}

// TestFullRegionMemory: region memory lives on a small tmpfs. A mount
// whose --mem-size does not fit it fails clearly; a region that does not
// fit is refused with ENOSPC and a line in the log; once the tmpfs is
// full, a peer writing every page of the region and doing atomics on
// every page leaves the daemon alive and its data right.
func TestFullRegionMemory(t *testing.T) {
	requireE2E(t)
	bin := build(t, mustAbs(t, ".."))
	dir := opsDir(t)
	ns := privateNS(t, "full")
	shm := smallTmpfs(t, dir, "tmpfs", "8m")

	// --mem-size larger than the filesystem: refused before anything.
	start := time.Now()
	out, err := exec.Command("nsenter", "--net=/run/netns/"+ns, bin, "mount", mkdir(t, filepath.Join(dir, "big")),
		"--listen", "127.0.0.1:4909", "--gid", "9", "--mem-size", "64M", "--shm-dir", filepath.Join(shm, "big")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "do not fit") || !strings.Contains(string(out), "--mem-size") {
		t.Errorf("--mem-size 64M on an 8 MiB tmpfs: %v %q; want a failure that says it does not fit", err, out)
	}
	t.Logf("the refused mount took %v", time.Since(start)) // a load-dependent figure, not a verdict
	if isMounted(filepath.Join(dir, "big")) {
		t.Fatal("the refused mount is mounted")
	}

	const memSize = 4 << 20
	a := mkdir(t, filepath.Join(dir, "a"))
	b := mkdir(t, filepath.Join(dir, "b"))
	da := startNSMount(t, bin, ns, a, "--listen", "127.0.0.1:4910", "--gid", "1", "--mem-size", "4M", "--shm-dir", filepath.Join(shm, "a"))
	startNSMount(t, bin, ns, b, "--listen", "127.0.0.1:4911", "--gid", "2", "--mem-size", "1M", "--shm-dir", filepath.Join(dir, "shm-b"),
		"--meta", "127.0.0.1:4910")

	// A region that does not fit: ENOSPC, logged, nothing half-made.
	big := filepath.Join(a, "regions/big")
	if err := os.WriteFile(big, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 8<<20); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("growing a region to 8 MiB with 4 MiB free: %v; want ENOSPC", err)
	}
	if !strings.Contains(da.logText(), "do not fit") {
		t.Errorf("no log line for the refused region:\n%s", tail([]byte(da.logText()), 10))
	}
	if st, err := os.Stat(big); err != nil || st.Size() != 0 {
		t.Errorf("the refused region: %v size %d; want it kept empty", err, st.Size())
	}
	// Fill the tmpfs to the last page.
	filler, err := os.Create(filepath.Join(shm, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 64<<10)
	for {
		if _, err := filler.Write(page); err != nil {
			break
		}
	}
	filler.Close()
	var sfs unix.Statfs_t
	unix.Statfs(shm, &sfs)
	t.Logf("tmpfs full: %d bytes free", int64(sfs.Bavail)*sfs.Bsize)

	// Host 2 writes every page of host 1's region and does atomics on
	// every page: WRITEs and atomics land in memory that must not fault.
	peer, err := os.OpenFile(filepath.Join(b, "peers/1/mem"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	want := make([]byte, memSize)
	for i := range want {
		want[i] = byte(i*13 + i>>12)
	}
	for off := 0; off < memSize; off += 256 << 10 {
		if n, err := peer.WriteAt(want[off:off+256<<10], int64(off)); err != nil || n != 256<<10 {
			t.Fatalf("peer write at %d: %d %v", off, n, err)
		}
	}
	for off := 0; off < memSize; off += 4096 {
		w := uint64(off + 8)
		old, err := atomicOn(peer, fs.IoctlFetchAdd, w, 1, 0)
		if err != nil {
			t.Fatalf("peer FETCH_ADD at %d: %v", w, err)
		}
		if exp := leUint64(want[w:]); old != exp {
			t.Fatalf("peer FETCH_ADD at %d: old %#x, want %#x", w, old, exp)
		}
		putLeUint64(want[w:], old+1)
	}
	if !da.alive() {
		t.Fatalf("host 1's daemon died:\n%s", tail([]byte(da.logText()), 20))
	}
	got, err := os.ReadFile(filepath.Join(a, "regions/mem"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("host 1's region after the peer's writes and atomics: %v, equal %v", err, bytes.Equal(got, want))
	}
}

func leUint64(b []byte) uint64 { return *(*uint64)(unsafe.Pointer(&b[0])) }
func putLeUint64(b []byte, v uint64) {
	*(*uint64)(unsafe.Pointer(&b[0])) = v
}

// nft runs an nft command in namespace ns.
func nft(t *testing.T, ns string, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v in %s: %v %s", args, ns, err, out)
	}
}

func requireNft(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("KRFS_E2E") == "required" {
			t.Fatal("nft (nftables) missing")
		}
		t.Skip("nft (nftables) missing")
	}
}

// TestExactByteCounts: a 2 MiB pwrite that straddles the end of a peer's
// region writes the whole 1 MiB in range and reports it; the next write,
// at the end, gets EFBIG. 1 MiB preads into an unaligned buffer while the
// peer is cut off and back either fail or return exactly a prefix the
// peer holds, never wrong bytes or an unexplained count.
func TestExactByteCounts(t *testing.T) {
	requireE2E(t)
	requireNft(t)
	bin := build(t, mustAbs(t, ".."))
	dir := opsDir(t)
	ns := privateNS(t, "count")
	a := mkdir(t, filepath.Join(dir, "a"))
	b := mkdir(t, filepath.Join(dir, "b"))
	startNSMount(t, bin, ns, a, "--listen", "127.0.0.1:4920", "--gid", "1", "--mem-size", "3M", "--shm-dir", filepath.Join(dir, "shm-a"))
	startNSMount(t, bin, ns, b, "--listen", "127.0.0.1:4921", "--gid", "2", "--mem-size", "1M", "--shm-dir", filepath.Join(dir, "shm-b"),
		"--meta", "127.0.0.1:4920", "--timeout", "1s")

	peer, err := os.OpenFile(filepath.Join(b, "peers/1/mem"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	const size = 3 << 20
	buf := make([]byte, 2<<20+1)[1:] // not page-aligned: the kernel splits it
	for i := range buf {
		buf[i] = byte(i*7 + i>>10)
	}
	n, err := unix.Pwrite(int(peer.Fd()), buf, size-1<<20)
	if err != nil || n != 1<<20 {
		t.Fatalf("2 MiB pwrite straddling the end: %d %v; want all %d bytes in range", n, err, 1<<20)
	}
	if _, err := unix.Pwrite(int(peer.Fd()), buf[n:], size); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("pwrite at the end: %v; want EFBIG", err)
	}
	got := make([]byte, 1<<20)
	local, err := os.Open(filepath.Join(a, "regions/mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	if _, err := local.ReadAt(got, size-1<<20); err != nil || !bytes.Equal(got, buf[:1<<20]) {
		t.Fatalf("the peer's memory after the straddling write: %v, equal %v", err, bytes.Equal(got, buf[:1<<20]))
	}
	want := make([]byte, size)
	if _, err := local.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}

	// Preads of 1 MiB into an unaligned buffer while host 1's port is cut
	// off for 3 s and then restored.
	rd := make([]byte, 1<<20+100)[100:]
	var mu sync.Mutex
	var full, failed, short int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := unix.Pread(int(peer.Fd()), rd, 0)
			mu.Lock()
			switch {
			case err != nil:
				failed++
			case n == len(rd):
				full++
			default:
				short++
			}
			mu.Unlock()
			if n > 0 && !bytes.Equal(rd[:n], want[:n]) {
				t.Errorf("a pread returned %d bytes that are not the peer's", n)
			}
			if n > 0 && n < len(rd) {
				// A short count is the prefix of the requests that
				// completed; the rest must not read as the end.
				m, err := unix.Pread(int(peer.Fd()), rd[n:], int64(n))
				if err == nil && m == 0 {
					t.Errorf("a pread returned %d of %d bytes and the next one 0: an unexplained short count", n, len(rd))
				}
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	nft(t, ns, "add", "table", "inet", "cut")
	nft(t, ns, "add", "chain", "inet", "cut", "input", "{ type filter hook input priority 0; }")
	nft(t, ns, "add", "rule", "inet", "cut", "input", "udp", "dport", "4920", "drop")
	time.Sleep(3 * time.Second)
	nft(t, ns, "delete", "table", "inet", "cut")
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("1 MiB preads: %d whole, %d failed, %d returned a prefix", full, failed, short)
	if full == 0 || failed == 0 {
		t.Logf("the cut did not interrupt the reads (%d whole, %d failed)", full, failed)
	}
}

// TestMetaHealsAfterLoopbackLoss: the meta service's own loopback UDP (its
// table writer, from its port to its port) is dropped for 3 s while a
// node registers; once the loss ends, a new node joins within 10 s, and
// the one that registered during the loss is up or gave up during it.
func TestMetaHealsAfterLoopbackLoss(t *testing.T) {
	requireE2E(t)
	requireNft(t)
	bin := build(t, mustAbs(t, ".."))
	dir := opsDir(t)
	ns := privateNS(t, "meta")
	// Node 1 runs the meta service, embedded, on its NIC at :4930; the
	// table writer's packets go from that port to itself.
	a := mkdir(t, filepath.Join(dir, "a"))
	startNSMount(t, bin, ns, a, "--listen", "127.0.0.1:4930", "--gid", "1", "--mem-size", "1M",
		"--shm-dir", filepath.Join(dir, "shm-a"))

	nft(t, ns, "add", "table", "inet", "chaos")
	nft(t, ns, "add", "chain", "inet", "chaos", "input", "{ type filter hook input priority 0; }")
	nft(t, ns, "add", "rule", "inet", "chaos", "input", "udp", "sport", "4930", "udp", "dport", "4930", "drop")
	// Node 2 registers during the loss: its mount waits on the meta.
	b := mkdir(t, filepath.Join(dir, "b"))
	bLog, _ := os.Create(b + ".log")
	bCmd := exec.Command("nsenter", "--net=/run/netns/"+ns, bin, "mount", b, "--listen", "127.0.0.1:4932", "--gid", "2",
		"--mem-size", "1M", "--shm-dir", filepath.Join(dir, "shm-b"), "--meta", "127.0.0.1:4930")
	bCmd.Stdout, bCmd.Stderr = bLog, bLog
	if err := bCmd.Start(); err != nil {
		t.Fatal(err)
	}
	bLog.Close()
	bExited := make(chan struct{})
	var bExitedAt time.Time
	go func() { bCmd.Wait(); bExitedAt = time.Now(); close(bExited) }()
	t.Cleanup(func() {
		bCmd.Process.Signal(os.Interrupt)
		select {
		case <-bExited:
		case <-time.After(10 * time.Second):
			bCmd.Process.Kill()
			<-bExited
		}
		if isMounted(b) {
			syscall.Unmount(b, syscall.MNT_DETACH)
		}
	})
	time.Sleep(3 * time.Second)
	nft(t, ns, "delete", "table", "inet", "chaos")
	end := time.Now()

	// A new node joins after the loss (startNSMount fails if its mount
	// command gives up on the meta service; how long it took on a loaded
	// machine is logged below, not judged).
	c := mkdir(t, filepath.Join(dir, "c"))
	startNSMount(t, bin, ns, c, "--listen", "127.0.0.1:4933", "--gid", "3", "--mem-size", "1M",
		"--shm-dir", filepath.Join(dir, "shm-c"), "--meta", "127.0.0.1:4930")
	t.Logf("node 3 joined %v after the loss ended", time.Since(end))
	// Node 2, which registered during the loss, is up too: its mount
	// keeps trying the meta service for its whole start budget (10 s),
	// longer than the loss.
	gids := []string{"1", "2", "3"}
	for !isMounted(b) {
		select {
		case <-bExited:
			lb, _ := os.ReadFile(b + ".log")
			t.Fatalf("the node that registered during the loss exited %v after it ended: %s", bExitedAt.Sub(end), lb)
		default:
		}
		if time.Since(end) > hangGuard {
			lb, _ := os.ReadFile(b + ".log")
			t.Fatalf("the node that registered during the loss is not up %v after it ended: %s", hangGuard, lb)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("nodes %v up %v after the loss ended", gids, time.Since(end))
	for _, gid := range gids {
		if b, err := os.ReadFile(filepath.Join(c, "peers", gid, "info")); err != nil || !strings.Contains(string(b), "gid "+gid) {
			t.Errorf("node 3 does not see node %s: %v %q", gid, err, b)
		}
	}
}
