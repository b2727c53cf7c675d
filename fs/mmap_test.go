package fs_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestMmapPeerFile pins down what mmap(2) of a peer's region does, which
// docs/operations.md ("mmap") describes. A peer's files are opened with
// FOPEN_DIRECT_IO and the mount does not ask the kernel for
// FUSE_DIRECT_IO_ALLOW_MMAP, so:
//   - MAP_SHARED fails with ENODEV in the kernel (fuse_file_mmap); the
//     daemon gets no request for it at all, so it cannot log or refuse it;
//   - MAP_PRIVATE succeeds and gives a private copy: the kernel fills the
//     pages with ordinary READs when they are first touched, and later
//     changes on the peer are not seen through the mapping.
func TestMmapPeerFile(t *testing.T) {
	b := newFake(1)
	b.addPeer(7, 64)
	b.setPeerRegion(7, "r", []byte("before.."))
	dir := mountFake(t, b)
	for _, name := range []string{"mem", "mr/r"} {
		f, err := os.OpenFile(filepath.Join(dir, "peers", "7", name), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, prot := range []int{syscall.PROT_READ, syscall.PROT_READ | syscall.PROT_WRITE} {
			if m, err := syscall.Mmap(int(f.Fd()), 0, 8, prot, syscall.MAP_SHARED); !errors.Is(err, syscall.ENODEV) {
				if err == nil {
					syscall.Munmap(m)
				}
				t.Fatalf("mmap MAP_SHARED (prot %#x) of peers/7/%s: %v, want ENODEV", prot, name, err)
			}
		}
	}

	f, err := os.Open(filepath.Join(dir, "peers", "7", "mr", "r"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, 8, syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap MAP_PRIVATE of a peer's region: %v", err)
	}
	defer syscall.Munmap(m)
	if got := string(m); got != "before.." {
		t.Fatalf("MAP_PRIVATE mapping holds %q, want the region's bytes %q", got, "before..")
	}
	// The peer changes the region in place: the mapping keeps its copy,
	// a read(2) sees the change.
	b.mu.Lock()
	copy(b.peers[7]["r"].data, "after...")
	b.mu.Unlock()
	if got := string(m); got != "before.." {
		t.Fatalf("MAP_PRIVATE mapping changed to %q after the peer wrote: not a private copy", got)
	}
	buf := make([]byte, 8)
	if n, err := f.ReadAt(buf, 0); n != 8 || err != nil || string(buf) != "after..." {
		t.Fatalf("read(2) after the peer wrote: %q %v", buf[:n], err)
	}
}
