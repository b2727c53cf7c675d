package fs_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/fusetest"
)

// regBackend is the fake backend as a BufferRegistrar: it records the
// registered I/O buffers, and whether every READ destination lies in them.
type regBackend struct {
	*fakeBackend

	mu           sync.Mutex
	pool         *fs.IOBuffers // registered now
	registered   int
	unregistered int
	gone         chan struct{} // closed by UnregisterIOBuffers, if set
}

func (b *regBackend) RegisterIOBuffers(p *fs.IOBuffers) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pool = p
	b.registered++
	return nil
}

func (b *regBackend) UnregisterIOBuffers(p *fs.IOBuffers) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p != b.pool {
		panic("unregistering buffers that were not registered")
	}
	b.pool = nil
	b.unregistered++
	if b.gone != nil {
		close(b.gone)
	}
	return nil
}

// inPool reports whether p lies inside the registered buffers.
func (b *regBackend) inPool(p []byte) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pool == nil {
		return false
	}
	m := b.pool.Memory()
	lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(m))), uintptr(unsafe.Pointer(unsafe.SliceData(m)))+uintptr(len(m))
	s := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	return s >= lo && s+uintptr(len(p)) <= hi
}

// Rule: the daemon's memory for reads does not grow with the I/O: every
// READ of a remote file lands in the registered I/O buffers (no buffer to
// register per request), whose bytes in use never pass their size, and
// all of it is back once the mount is gone. Reads and writes of 512 B to
// 1 MiB at random offsets, from 4 threads, return the right bytes.
func TestReadsLandInTheBoundedRegisteredBuffers(t *testing.T) {
	fusetest.Require(t)
	const size = 8 << 20
	f := newFake(1)
	f.addPeer(2, size)
	b := &regBackend{fakeBackend: f, gone: make(chan struct{})}
	var inPool, outside int
	var hookMu sync.Mutex
	f.fault = func(write bool, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
		if !write {
			in := b.inPool(p)
			hookMu.Lock()
			if in {
				inPool++
			} else {
				outside++
			}
			hookMu.Unlock()
		}
		return do(p, off)
	}
	dir := t.TempDir()
	srv, err := fs.Mount(dir, b, fusetest.Options(fs.Options{Timeout: 5 * time.Second, IOBufferBytes: 4 << 20}))
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	mounted := true
	defer func() {
		if mounted {
			srv.Unmount()
		}
	}()
	b.mu.Lock()
	pool := b.pool
	b.mu.Unlock()
	if pool == nil || len(pool.Memory()) != 4<<20 {
		t.Fatalf("the mount registered no 4 MiB I/O buffers: %v", pool)
	}

	want := make([]byte, size)
	pattern(want, 3)
	path := filepath.Join(dir, "peers/2/mem")
	const workers = 4
	// Writes: each worker fills its quarter with pieces of random sizes.
	run := func(work func(w int, file *os.File, r *rand.Rand)) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				file, err := os.OpenFile(path, os.O_RDWR, 0)
				if err != nil {
					t.Error(err)
					return
				}
				defer file.Close()
				work(w, file, rand.New(rand.NewPCG(uint64(w), 7)))
			}()
		}
		wg.Wait()
	}
	run(func(w int, file *os.File, r *rand.Rand) {
		lo, hi := w*size/workers, (w+1)*size/workers
		for off := lo; off < hi; {
			n := min(512*(1+r.IntN(2048)), hi-off)
			if _, err := file.WriteAt(want[off:off+n], int64(off)); err != nil {
				t.Errorf("write %d at %d: %v", n, off, err)
				return
			}
			off += n
		}
	})
	// Reads: random sizes and offsets anywhere, checked byte for byte.
	var reads int
	var readsMu sync.Mutex
	run(func(w int, file *os.File, r *rand.Rand) {
		buf := make([]byte, 1<<20)
		for range 200 {
			n := 512 * (1 + r.IntN(2048))
			off := 512 * r.IntN((size-n)/512+1)
			if _, err := file.ReadAt(buf[:n], int64(off)); err != nil {
				t.Errorf("read %d at %d: %v", n, off, err)
				return
			}
			if !bytes.Equal(buf[:n], want[off:off+n]) {
				t.Errorf("read %d at %d: wrong bytes", n, off)
				return
			}
			readsMu.Lock()
			reads++
			readsMu.Unlock()
		}
	})
	if err := srv.Unmount(); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	mounted = false
	srv.Wait() // every request handled: their blocks are back
	select {   // the server unregisters the buffers after its loops end
	case <-b.gone:
	case <-time.After(time.Minute):
		t.Fatal("the I/O buffers were not unregistered after unmount")
	}

	s := pool.Stats()
	t.Logf("%d reads: %d READs in the pool, %d outside; pool %+v", reads, inPool, outside, s)
	if s.Peak > s.Bytes || s.Bytes != 4<<20 {
		t.Errorf("pool: peak %d bytes of %d", s.Peak, s.Bytes)
	}
	if s.InUse != 0 {
		t.Errorf("%d bytes of the pool still in use after unmount", s.InUse)
	}
	// Every READ went to the pool unless the pool was full (counted).
	if uint64(inPool) != s.Gets || uint64(outside) != s.Overflows || inPool < reads/2 {
		t.Errorf("READs: %d in the pool (pool counted %d), %d outside (overflows %d), of %d reads", inPool, s.Gets, outside, s.Overflows, reads)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.registered != 1 || b.unregistered != 1 {
		t.Errorf("registered %d times, unregistered %d times; want once each", b.registered, b.unregistered)
	}
}

// Rule: a READ that finds the I/O buffers full is not refused or delayed:
// it lands in go-fuse's own buffer, is counted as an overflow, and returns
// the right bytes. Two 1 MiB reads hold both blocks of a 2 MiB pool while
// a third arrives.
func TestReadOverflowingTheBuffersIsServedAndCounted(t *testing.T) {
	fusetest.Require(t)
	const size = 4 << 20
	f := newFake(1)
	f.addPeer(2, size)
	want := make([]byte, size)
	pattern(want, 9)
	copy(f.peers[2]["mem"].data, want)
	b := &regBackend{fakeBackend: f}
	release := make(chan struct{})
	var hookMu sync.Mutex
	var held, overflowed int
	f.fault = func(write bool, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
		if b.inPool(p) {
			hookMu.Lock()
			held++
			hookMu.Unlock()
			select { // the pool's two blocks stay taken until the third read came
			case <-release:
			case <-time.After(30 * time.Second):
				t.Error("the third read never reached the backend")
			}
		} else {
			hookMu.Lock()
			overflowed++
			hookMu.Unlock()
			close(release)
		}
		return do(p, off)
	}
	dir := mountFakeWith(t, b, fs.Options{Timeout: time.Minute, IOBufferBytes: 2 << 20})
	path := filepath.Join(dir, "peers/2/mem")
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			file, err := os.Open(path)
			if err != nil {
				t.Error(err)
				return
			}
			defer file.Close()
			buf := pageAligned(t, 1<<20) // one FUSE request
			if _, err := file.ReadAt(buf, int64(i)<<20); err != nil {
				t.Errorf("read %d: %v", i, err)
				return
			}
			if !bytes.Equal(buf, want[i<<20:(i+1)<<20]) {
				t.Errorf("read %d: wrong bytes", i)
			}
		}()
	}
	wg.Wait()
	b.mu.Lock()
	s := b.pool.Stats()
	b.mu.Unlock()
	if held != 2 || overflowed != 1 || s.Overflows != 1 || s.Gets != 2 {
		t.Fatalf("%d reads held pool blocks, %d overflowed; pool counted %+v", held, overflowed, s)
	}
}

// Rule: IOBufferBytes < 0 turns the pool off: nothing is registered and
// reads land in go-fuse's buffers.
func TestIOBuffersOff(t *testing.T) {
	f := newFake(1)
	b := &regBackend{fakeBackend: f}
	dir := mountFakeWith(t, b, fs.Options{Timeout: time.Second, IOBufferBytes: -1})
	if got, err := os.ReadFile(filepath.Join(dir, "peers/1/mem")); err != nil || len(got) != 4096 {
		t.Fatalf("read: %d bytes, %v", len(got), err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.registered != 0 {
		t.Fatalf("registered I/O buffers %d times with the pool off", b.registered)
	}
}

// memBackend is regBackend that also registers the FUSE transport's
// reply memory (fs.MemoryRegistrar).
type memBackend struct {
	*regBackend

	memMu       sync.Mutex
	mem         []byte // registered now
	memGone     chan struct{}
	memRegs     int
	memUnregs   int
	wrongUnregs int
}

func (b *memBackend) RegisterMemory(m []byte) error {
	b.memMu.Lock()
	defer b.memMu.Unlock()
	b.mem = m
	b.memRegs++
	return nil
}

func (b *memBackend) UnregisterMemory(m []byte) error {
	b.memMu.Lock()
	defer b.memMu.Unlock()
	if b.mem == nil || unsafe.SliceData(m) != unsafe.SliceData(b.mem) {
		b.wrongUnregs++
		return nil
	}
	b.mem = nil
	b.memUnregs++
	close(b.memGone)
	return nil
}

func (b *memBackend) inMem(p []byte) bool {
	b.memMu.Lock()
	defer b.memMu.Unlock()
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b.mem)))
	s := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	return b.mem != nil && s >= lo && s+uintptr(len(p)) <= lo+uintptr(len(b.mem))
}

// Rule: on FUSE over io_uring the ring entries' payload buffers are
// registered with the backend once, every READ of a remote file lands in
// the entry's buffer itself (no fallback copy, no I/O buffer) and every
// WRITE leaves from it; they are unregistered once the mount is gone.
func TestRingBuffersAreRegisteredAndReadsLandInThem(t *testing.T) {
	fusetest.RequireURing(t)
	const size = 4 << 20
	f := newFake(1)
	f.addPeer(2, size)
	want := make([]byte, size)
	pattern(want, 5)
	b := &memBackend{regBackend: &regBackend{fakeBackend: f}, memGone: make(chan struct{})}
	var inMem, outside int
	var hookMu sync.Mutex
	f.fault = func(write bool, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
		in := b.inMem(p)
		hookMu.Lock()
		if in {
			inMem++
		} else {
			outside++
		}
		hookMu.Unlock()
		return do(p, off)
	}
	dir := t.TempDir()
	srv, err := fs.Mount(dir, b, fs.Options{Timeout: 5 * time.Second, Transport: fs.TransportURing})
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	mounted := true
	defer func() {
		if mounted {
			srv.Unmount()
		}
	}()
	b.memMu.Lock()
	registered := len(b.mem)
	b.memMu.Unlock()
	if registered == 0 {
		t.Fatal("the mount registered no ring buffers")
	}
	file, err := os.OpenFile(filepath.Join(dir, "peers/2/mem"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < size; off += 256 << 10 {
		if _, err := file.WriteAt(want[off:off+256<<10], int64(off)); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	buf := make([]byte, 1<<20)
	reads := 0
	for _, n := range []int{8, 4096, 100000, 1 << 20} {
		for off := 0; off+n <= size; off += size / 4 {
			if _, err := file.ReadAt(buf[:n], int64(off)); err != nil {
				t.Fatalf("read %d at %d: %v", n, off, err)
			}
			if !bytes.Equal(buf[:n], want[off:off+n]) {
				t.Fatalf("read %d at %d: wrong bytes", n, off)
			}
			reads++
		}
	}
	file.Close()
	st := srv.Stats()
	if err := srv.Unmount(); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	mounted = false
	select {
	case <-b.memGone:
	case <-time.After(time.Minute):
		t.Fatal("the ring buffers were not unregistered after unmount")
	}
	t.Logf("%d reads; %d transfers in the ring buffers, %d outside; fuse %+v", reads, inMem, outside, st)
	if st.Transport != "io_uring" {
		t.Fatalf("transport %q", st.Transport)
	}
	if outside != 0 || inMem < reads+size/(256<<10) {
		t.Errorf("%d transfers outside the ring buffers, %d inside (%d reads, %d writes)", outside, inMem, reads, size/(256<<10))
	}
	if st.FallbackCopies != 0 {
		t.Errorf("%d READ replies copied into the ring buffers (%d bytes)", st.FallbackCopies, st.FallbackBytes)
	}
	b.memMu.Lock()
	defer b.memMu.Unlock()
	if b.memRegs != 1 || b.memUnregs != 1 || b.wrongUnregs != 0 {
		t.Errorf("ring buffers registered %d times, unregistered %d (%d wrong)", b.memRegs, b.memUnregs, b.wrongUnregs)
	}
}
