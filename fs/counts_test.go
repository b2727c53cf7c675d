package fs_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/fs"
	"golang.org/x/sys/unix"
)

// pattern fills p with bytes that depend on their offset, seeded by seed.
func pattern(p []byte, seed byte) {
	for i := range p {
		p[i] = byte(i*7+i>>9) ^ seed
	}
}

// pageAligned returns n bytes of page-aligned memory, so that the kernel
// sends a transfer of up to fs.MaxIO bytes as one FUSE request.
func pageAligned(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// Rule: a write that straddles the end of a region writes every byte in
// range and reports that count; the next write, at the end, gets EFBIG.
// The 2 MiB buffer is not page-aligned, so the kernel splits it into three
// FUSE requests and the second one straddles the end. A local region grows
// on writes past its end, so its end here is the size limit
// (Options.MaxRegionSize).
func TestWriteAcrossTheEndWritesEverythingInRange(t *testing.T) {
	const size = 3 << 20
	f := newFake(1)
	f.addPeer(2, size)
	dir := mountFakeWith(t, f, fs.Options{Timeout: time.Second, MaxRegionSize: size})
	if err := os.WriteFile(filepath.Join(dir, "regions/big"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "regions/big"), size); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"peers/2/mem", "regions/big"} {
		t.Run(filepath.Base(filepath.Dir(name))+"-"+filepath.Base(name), func(t *testing.T) {
			file, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer file.Close()
			buf := make([]byte, 2<<20+1)[1:] // not page-aligned
			pattern(buf, 0x5a)
			const off = size - 1<<20
			n, err := unix.Pwrite(int(file.Fd()), buf, off)
			if err != nil || n != 1<<20 {
				t.Fatalf("pwrite of 2 MiB at 1 MiB before the end: %d %v, want %d", n, err, 1<<20)
			}
			if _, err := unix.Pwrite(int(file.Fd()), buf[n:], off+int64(n)); !errors.Is(err, syscall.EFBIG) {
				t.Fatalf("pwrite at the end: %v, want EFBIG", err)
			}
			got := make([]byte, 1<<20)
			if n, err := file.ReadAt(got, off); err != nil || n != len(got) {
				t.Fatalf("read back: %d %v", n, err)
			}
			if !bytes.Equal(got, buf[:1<<20]) {
				t.Fatal("the bytes in range are not what was written")
			}
		})
	}
}

// Rule: a read that fails returns an error and no bytes, even if the
// backend filled part of the buffer; a backend that returns fewer bytes
// than asked without an error gets EIO, not a short count that would look
// like the end of the region.
func TestFailedReadReturnsAnErrorNotAShortCount(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 1<<20)
	dir := mountFake(t, f)
	file, err := os.Open(filepath.Join(dir, "peers/2/mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	buf := pageAligned(t, 64<<10)
	for _, tc := range []struct {
		name  string
		fault func(bool, []byte, int64, func([]byte, int64) (int, error)) (int, error)
		want  syscall.Errno
	}{
		{"half then timeout", func(w bool, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
			n, _ := do(p[:len(p)/2], off)
			return n, syscall.ETIMEDOUT
		}, syscall.ETIMEDOUT},
		{"half without error", func(w bool, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
			return do(p[:len(p)/2], off)
		}, syscall.EIO},
	} {
		f.mu.Lock()
		f.fault = tc.fault
		f.mu.Unlock()
		n, err := unix.Pread(int(file.Fd()), buf, 0)
		if n > 0 || !errors.Is(err, tc.want) {
			t.Errorf("%s: pread returned %d %v, want no bytes and %v", tc.name, n, err, tc.want)
		}
	}
}

// Rule: a write that fails reports exactly the prefix that landed, or the
// error when nothing did.
func TestFailedWriteReportsThePrefixThatLanded(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 1<<20)
	dir := mountFake(t, f)
	file, err := os.OpenFile(filepath.Join(dir, "peers/2/mem"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	buf := pageAligned(t, 64<<10)
	pattern(buf, 3)
	var landedV atomic.Int64
	f.mu.Lock()
	f.fault = func(w bool, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
		landed := landedV.Load()
		if landed == 0 {
			return 0, syscall.EHOSTDOWN
		}
		n, _ := do(p[:landed], off)
		return n, syscall.ETIMEDOUT
	}
	f.mu.Unlock()
	if n, err := unix.Pwrite(int(file.Fd()), buf, 0); n > 0 || !errors.Is(err, syscall.EHOSTDOWN) {
		t.Fatalf("nothing landed: pwrite returned %d %v, want EHOSTDOWN", n, err)
	}
	const landed = 5000
	landedV.Store(landed)
	if n, err := unix.Pwrite(int(file.Fd()), buf, 0); n != landed || err != nil {
		t.Fatalf("%d bytes landed: pwrite returned %d %v", landed, n, err)
	}
	f.mu.Lock()
	f.fault = nil
	f.mu.Unlock()
	got := make([]byte, len(buf))
	f.peers[2]["mem"].ReadAt(got, 0)
	if !bytes.Equal(got[:landed], buf[:landed]) || bytes.ContainsFunc(got[landed:], func(r rune) bool { return r != 0 }) {
		t.Fatal("the peer's memory does not hold exactly the reported prefix")
	}
}

// Rule: when the kernel splits a transfer into several FUSE requests and a
// later one fails, the count returned is exactly the bytes of the requests
// that completed, those bytes are right, and the next call reports the
// error.
func TestSplitReadFailingHalfWayReturnsTheExactPrefix(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4<<20)
	want := make([]byte, 4<<20)
	pattern(want, 9)
	f.peers[2]["mem"].WriteAt(want, 0)
	dir := mountFake(t, f)
	file, err := os.Open(filepath.Join(dir, "peers/2/mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	// The kernel sends the 1 MiB read below into a buffer 100 bytes into a
	// page as two requests: 256 pages (1 MiB - 100 bytes), then 100 bytes.
	// Reads that reach past cut fail: the second request.
	const cut = fs.MaxIO - 50
	f.mu.Lock()
	f.fault = func(w bool, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
		if off+int64(len(p)) > cut {
			return 0, syscall.EHOSTDOWN
		}
		return do(p, off)
	}
	f.mu.Unlock()
	// 1 MiB into an unaligned buffer: the kernel sends requests of at most
	// fs.MaxIO bytes that end on the buffer's page boundaries.
	buf := make([]byte, fs.MaxIO+100)[100:]
	n, err := unix.Pread(int(file.Fd()), buf, 0)
	if err != nil {
		t.Fatalf("pread: %v, want the prefix of the first request", err)
	}
	if n <= 0 || n > cut || !bytes.Equal(buf[:n], want[:n]) {
		t.Fatalf("pread returned %d bytes (cut at %d); prefix correct: %v", n, cut, bytes.Equal(buf[:n], want[:n]))
	}
	t.Logf("a 1 MiB pread cut at %d bytes returned %d bytes", cut, n)
	if _, err := unix.Pread(int(file.Fd()), buf[n:], int64(n)); !errors.Is(err, syscall.EHOSTDOWN) {
		t.Fatalf("the read after the prefix: %v, want EHOSTDOWN", err)
	}
}

// Rule: an atomic writes, so it needs a descriptor opened for writing:
// EBADF through O_RDONLY, on a peer's region and on a local one, and the
// word is unchanged; O_WRONLY and O_RDWR work.
func TestAtomicsNeedADescriptorOpenForWriting(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	dir := mountFake(t, f)
	if err := os.WriteFile(filepath.Join(dir, "regions/r"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "regions/r"), 4096); err != nil {
		t.Fatal(err)
	}
	// The descriptor that created a region is writable too.
	created, err := os.Create(filepath.Join(dir, "regions/new"))
	if err != nil {
		t.Fatal(err)
	}
	if err := created.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	var out fs.AtomicArg
	if old, err := ioctlAtomic(created, fs.IoctlFetchAdd, &fs.AtomicArg{Offset: 16, A: 3}, &out); err != nil || old != 0 {
		t.Errorf("FETCH_ADD through the descriptor that created the region: %d %v", old, err)
	}
	created.Close()
	for _, name := range []string{"peers/2/mem", "regions/r", "regions/mem"} {
		path := filepath.Join(dir, name)
		ro, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var out fs.AtomicArg
		if _, err := ioctlAtomic(ro, fs.IoctlFetchAdd, &fs.AtomicArg{Offset: 8, A: 1}, &out); !errors.Is(err, syscall.EBADF) {
			t.Errorf("%s: FETCH_ADD through O_RDONLY: %v, want EBADF", name, err)
		}
		if _, err := ioctlAtomic(ro, fs.IoctlCompareAndSwap, &fs.AtomicArg{Offset: 8, A: 0, B: 7}, &out); !errors.Is(err, syscall.EBADF) {
			t.Errorf("%s: CMP_SWAP through O_RDONLY: %v, want EBADF", name, err)
		}
		ro.Close()
		for i, flag := range []int{os.O_WRONLY, os.O_RDWR} {
			w, err := os.OpenFile(path, flag, 0)
			if err != nil {
				t.Fatal(err)
			}
			if old, err := ioctlAtomic(w, fs.IoctlFetchAdd, &fs.AtomicArg{Offset: 8, A: 1}, &out); err != nil || old != uint64(i) {
				t.Errorf("%s: FETCH_ADD through flags %#x: old %d %v, want %d (the O_RDONLY tries changed nothing)", name, flag, old, err, i)
			}
			w.Close()
		}
	}
}
