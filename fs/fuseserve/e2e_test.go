package fuseserve_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/fs/fuseserve"
	"github.com/krfs/krfs/internal/fusetest"
)

// A tiny tree: "fast" answers reads at once, "slow" never does.
type dir struct{ gofs.Inode }

type file struct {
	gofs.Inode
	slow bool
}

func (d *dir) OnAdd(ctx context.Context) {
	for _, slow := range []bool{false, true} {
		name := "fast"
		if slow {
			name = "slow"
		}
		d.AddChild(name, d.NewPersistentInode(ctx, &file{slow: slow}, gofs.StableAttr{Mode: syscall.S_IFREG}), false)
	}
}

func (f *file) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode, out.Size = 0o644, 4096
	return 0
}

func (f *file) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *file) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f.slow {
		select {} // a request in flight for good
	}
	const size = 4096 // direct_io: the kernel does not clip reads at the size
	if off >= size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(len(dest), int(size-off))]
	for i := range dest {
		dest[i] = byte(off) + byte(i)
	}
	return fuse.ReadResultData(dest), 0
}

var _ = (gofs.NodeOnAdder)((*dir)(nil))
var _ = (gofs.NodeReader)((*file)(nil))

func mount(t testing.TB, mnt string) (*fuseserve.Server, error) {
	n := fuseserve.NewNotifier()
	sec := time.Second
	raw := gofs.NewNodeFS(&dir{}, &gofs.Options{EntryTimeout: &sec, AttrTimeout: &sec, ServerCallbacks: n})
	return fuseserve.Mount(mnt, raw, fuseserve.Options{Name: "fuseservetest", Mode: fuseserve.Uring, Notifier: n})
}

// TestMain runs the test binary as a FUSE daemon when asked to
// (FUSESERVE_DAEMON=mountpoint): it mounts, says "ready" and serves.
func TestMain(m *testing.M) {
	if mnt := os.Getenv("FUSESERVE_DAEMON"); mnt != "" {
		srv, err := mount(nil, mnt)
		if err != nil {
			fmt.Println("mount:", err)
			os.Exit(1)
		}
		fmt.Println("ready", srv.Stats().Transport)
		srv.Wait()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func startDaemon(t *testing.T, mnt string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FUSESERVE_DAEMON="+mnt)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A failed test must not leave its readers waiting on a daemon
		// that will never answer.
		cmd.Process.Kill()
		cmd.Wait()
	})
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	if got := strings.TrimSpace(string(buf[:n])); got != "ready io_uring" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("daemon said %q", got)
	}
	return cmd
}

// Rule: kill -9 of a daemon with requests in flight on the rings: the
// readers get ENOTCONN within 2 s, no thread stays stuck, and a new mount
// on the same mount point works.
func TestKill9WithRequestsInFlight(t *testing.T) {
	fusetest.RequireURing(t)
	mnt := t.TempDir()
	daemon := startDaemon(t, mnt)
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	const readers = 4
	errs := make(chan error, readers)
	var started sync.WaitGroup
	for range readers {
		started.Add(1)
		go func() {
			f, err := os.Open(filepath.Join(mnt, "slow"))
			started.Done()
			if err != nil {
				errs <- err
				return
			}
			_, err = f.ReadAt(make([]byte, 8), 0)
			f.Close() // before reporting: an open file keeps the dead mount busy (EBUSY at unmount)
			errs <- err
		}()
	}
	started.Wait()
	// The reads are in the daemon once its fast file reads: the rings
	// serve in order per entry, and there are entries to spare.
	fast, err := os.ReadFile(filepath.Join(mnt, "fast"))
	if err != nil || len(fast) != 4096 {
		t.Fatalf("fast read: %d bytes, %v", len(fast), err)
	}
	waitInFlight(t, mnt, readers)
	killed := time.Now()
	if err := daemon.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = daemon.Wait()
	for range readers {
		select {
		case err := <-errs:
			if !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) {
				t.Errorf("reader got %v, want ENOTCONN", err)
			}
		case <-time.After(2*time.Second - time.Since(killed)):
			t.Fatal("a reader is still blocked 2 s after kill -9")
		}
	}
	if _, err := os.Stat(filepath.Join(mnt, "fast")); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("stat of the dead mount: %v, want ENOTCONN", err)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("unmount of the dead mount: %v", err)
	}
	startDaemon(t, mnt) // killed at cleanup
	if b, err := os.ReadFile(filepath.Join(mnt, "fast")); err != nil || len(b) != 4096 {
		t.Errorf("read after remount: %d bytes, %v", len(b), err)
	}
}

// waitInFlight waits until the kernel counts n requests of the mount at
// mnt waiting for their answer (fusectl's "waiting").
func waitInFlight(t *testing.T, mnt string, n int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	const ctl = "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(ctl, "1")); err != nil {
		_ = unix.Mount("fusectl", ctl, "fusectl", 0, "") // already mounted: EBUSY
	}
	path := filepath.Join(ctl, strconv.Itoa(int(unix.Minor(st.Dev))), "waiting")
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("fusectl: %v", err)
		}
		if w, _ := strconv.Atoi(strings.TrimSpace(string(b))); w >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s requests in flight after 10 s, want %d", strings.TrimSpace(string(b)), n)
		}
		time.Sleep(time.Millisecond) // polling the kernel's counter, not timing
	}
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func countThreads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads: in /proc/self/status")
	return 0
}

// Rule: mounting and unmounting leaks no descriptors and no threads: a
// ring's threads exit with it (KRFS_FUSE_CYCLES cycles, default 100).
func TestMountUnmountCyclesLeakNothing(t *testing.T) {
	fusetest.RequireURing(t)
	cycles := 100
	if v, err := strconv.Atoi(os.Getenv("KRFS_FUSE_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	mnt := t.TempDir()
	cycle := func() {
		srv, err := mount(t, mnt)
		if err != nil {
			t.Fatal(err)
		}
		if st := srv.Stats(); st.Transport != "io_uring" {
			t.Fatalf("transport %s", st.Transport)
		}
		if b, err := os.ReadFile(filepath.Join(mnt, "fast")); err != nil || len(b) != 4096 {
			t.Fatalf("read: %d bytes, %v", len(b), err)
		}
		if err := srv.Unmount(); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // the runtime's own threads and descriptors settle
	fds, threads, heap := countFDs(t), countThreads(t), liveHeap()
	start := time.Now()
	for range cycles {
		cycle()
	}
	perCycle := time.Since(start) / time.Duration(cycles)
	gotFDs, gotThreads, gotHeap := countFDs(t), countThreads(t), liveHeap()
	t.Logf("%d cycles, %v each; descriptors %d -> %d, threads %d -> %d, live heap %d -> %d KiB", cycles, perCycle, fds, gotFDs, threads, gotThreads, heap>>10, gotHeap>>10)
	// Each mount's ring buffers are 16 MiB of Go memory: one kept per
	// cycle would add up to gigabytes.
	if gotHeap > heap+32<<20 {
		t.Errorf("live heap: %d KiB before, %d KiB after %d cycles", heap>>10, gotHeap>>10, cycles)
	}
	if gotFDs != fds {
		t.Errorf("descriptors: %d before, %d after %d cycles", fds, gotFDs, cycles)
	}
	// Idle runtime threads may come and go; a ring's would add up.
	if gotThreads > threads+4 {
		t.Errorf("threads: %d before, %d after %d cycles", threads, gotThreads, cycles)
	}
}

// liveHeap returns the bytes of Go heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// Rule: requests that wait for the rings at mount are all answered. A
// caller on each CPU stats a file of the mount while it is being made:
// their requests wait in the kernel until the last queue registered,
// which then hands them to entries at once, while the entries' threads
// are still setting up. (A thread that dropped such a completion left
// its request waiting for good.) Each cycle's callers must finish.
func TestRequestsWaitingForTheRingsAreServed(t *testing.T) {
	fusetest.RequireURing(t)
	cycles := 30
	if v, err := strconv.Atoi(os.Getenv("KRFS_FUSE_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	cpus := runtime.NumCPU()
	for c := range cycles {
		mnt := t.TempDir()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var served atomic.Int64
		for cpu := range cpus {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread() // the thread ends with the goroutine
				var set unix.CPUSet
				set.Set(cpu)
				_ = unix.SchedSetaffinity(0, &set)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := os.Stat(filepath.Join(mnt, "fast")); err == nil {
						served.Add(1)
					}
				}
			}()
		}
		srv, err := mount(t, mnt)
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
		// Let every caller finish some requests on the rings.
		want, deadline := served.Load()+int64(4*cpus), time.Now().Add(20*time.Second)
		for served.Load() < want && time.Now().Before(deadline) {
			runtime.Gosched()
		}
		close(stop)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("cycle %d: a caller's request is still waiting after 20 s (stats %+v)", c, srv.Stats())
		}
		if err := srv.Unmount(); err != nil {
			t.Fatal(err)
		}
		<-done
	}
}
