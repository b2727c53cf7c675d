package fs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/fusetest"
)

// ringBackend is the fake with the FUSE ring's buffers registered
// (fs.MemoryRegistrar), so that READs over io_uring land in them.
type ringBackend struct {
	*fakeBackend
	mu         sync.Mutex
	registered int
}

func (b *ringBackend) RegisterMemory([]byte) error {
	b.mu.Lock()
	b.registered++
	b.mu.Unlock()
	return nil
}

func (b *ringBackend) UnregisterMemory([]byte) error { return nil }

// TestReadsIntoTheRingAreStarted: over FUSE over io_uring a READ into a
// ring entry's buffer is posted (fs.ReadStarter) and its reply waits for
// it; a READ the peer refuses as stale when it completes reads the
// directory again and is read once more.
func TestReadsIntoTheRingAreStarted(t *testing.T) {
	fusetest.RequireURing(t)
	f := newFake(1)
	f.addPeer(2, 64<<10)
	want := make([]byte, 64<<10)
	pattern(want, 3)
	copy(f.peers[2]["mem"].data, want)
	b := &ringBackend{fakeBackend: f}
	dir := mountFakeWith(t, b, fs.Options{Timeout: time.Minute})
	if b.registered == 0 {
		t.Skip("the ring's buffers were not registered (no FUSE over io_uring)")
	}
	file, err := os.Open(filepath.Join(dir, "peers/2/mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	buf := make([]byte, 16<<10)
	read := func(off int64) int {
		t.Helper()
		n, err := file.ReadAt(buf, off)
		if err != nil && n == 0 {
			t.Fatalf("read at %d: %v", off, err)
		}
		if !bytes.Equal(buf[:n], want[off:off+int64(n)]) {
			t.Fatalf("read at %d: wrong bytes", off)
		}
		return n
	}
	read(4096)
	f.mu.Lock()
	started, dirs := f.started, f.dirReads
	f.stale = 1
	f.mu.Unlock()
	if started == 0 {
		t.Fatal("a READ into the ring's buffer was not started")
	}
	read(8192)
	f.mu.Lock()
	if f.started != started+1 || f.dirReads <= dirs {
		t.Fatalf("a stale READ: %d started (was %d), %d directory reads (was %d)", f.started, started, f.dirReads, dirs)
	}
	f.mu.Unlock()
}
