package fs

import (
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/krfs/krfs/verbs"
)

// Rule: the I/O buffers never hold more than their slab. Concurrent
// readers of sizes 1 B..MaxIO get blocks that fit, never overlap (each
// reader stamps its block and finds its stamp intact when it gives it
// back), and the bytes in use never pass the slab; once everything is
// back, the slab is whole again (it hands out MaxIO blocks to its size).
func TestIOBuffersStayWithinTheirSlab(t *testing.T) {
	const slab = 4 << 20
	p := NewIOBuffers(slab)
	if got := len(p.Memory()); got != slab {
		t.Fatalf("slab of %d bytes, want %d", got, slab)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got, overflow int
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 3000 {
				n := 1 + r.IntN(MaxIO)
				if r.IntN(4) == 0 {
					n = 1 + r.IntN(8192) // plenty of small ones too
				}
				b := p.Get(n)
				if b == nil {
					mu.Lock()
					overflow++
					mu.Unlock()
					continue
				}
				if len(b) != n || cap(b) < n || cap(b) > 2*max(n, 1<<ioMinShift) {
					t.Errorf("Get(%d): len %d cap %d", n, len(b), cap(b))
				}
				off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(p.Memory())))
				if off%uintptr(cap(b)) != 0 || int(off)+cap(b) > slab {
					t.Errorf("block at %d of capacity %d: not aligned or past the slab", off, cap(b))
				}
				stamp := byte(w + 1)
				b[0], b[len(b)-1], b[cap(b)-1 : cap(b)][0] = stamp, stamp, stamp
				if s := p.Stats(); s.InUse > s.Bytes || s.Peak > s.Bytes {
					t.Errorf("in use %d, peak %d: more than the slab's %d", s.InUse, s.Peak, s.Bytes)
				}
				if b[0] != stamp || b[len(b)-1] != stamp || b[cap(b)-1 : cap(b)][0] != stamp {
					t.Errorf("block at %d (cap %d) was written by another holder", off, cap(b))
				}
				p.Put(b)
				mu.Lock()
				got++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	s := p.Stats()
	if s.InUse != 0 || s.Gets != uint64(got) || s.Overflows != uint64(overflow) {
		t.Fatalf("after the run: %+v; %d gets, %d overflows counted by the test", s, got, overflow)
	}
	if s.Peak == 0 || s.Peak > s.Bytes {
		t.Fatalf("peak %d of a %d-byte slab", s.Peak, s.Bytes)
	}
	// Whole again: the slab's MaxIO blocks, then nothing.
	var whole [][]byte
	for range slab / MaxIO {
		b := p.Get(MaxIO)
		if b == nil {
			t.Fatalf("only %d blocks of MaxIO after every block came back: the buddies did not merge", len(whole))
		}
		whole = append(whole, b)
	}
	if p.Get(1) != nil {
		t.Fatal("a full slab handed out one more block")
	}
	if s := p.Stats(); s.InUse != slab || s.Overflows != uint64(overflow)+1 {
		t.Fatalf("full slab: %+v", s)
	}
	for _, b := range whole {
		p.Put(b)
	}
}

// Rule: blocks are powers of two from 4 KiB to MaxIO; requests outside
// 1..MaxIO get nothing.
func TestIOBuffersBlockSizes(t *testing.T) {
	p := NewIOBuffers(MaxIO)
	for _, c := range []struct{ n, cap int }{{1, 4096}, {4096, 4096}, {4097, 8192}, {512 << 10, 512 << 10}, {512<<10 + 1, MaxIO}, {MaxIO, MaxIO}} {
		b := p.Get(c.n)
		if b == nil || len(b) != c.n || cap(b) != c.cap {
			t.Errorf("Get(%d): len %d cap %d, want cap %d", c.n, len(b), cap(b), c.cap)
		}
		p.Put(b)
	}
	if p.Get(0) != nil || p.Get(MaxIO+1) != nil {
		t.Error("Get outside 1..MaxIO returned a block")
	}
	// The slab, and so every block, starts on a page boundary.
	q := NewIOBuffers(2 * MaxIO)
	if off := verbs.PageOffset(q.Memory()); off != 0 {
		t.Errorf("the slab starts %d bytes into a page", off)
	}
	for _, n := range []int{1, 5000, 300 << 10} {
		b := q.Get(n)
		if off := verbs.PageOffset(b); off != 0 {
			t.Errorf("a block of %d bytes starts %d bytes into a page", n, off)
		}
		defer q.Put(b)
	}
	// Rounded down to whole MaxIO blocks, at least one.
	if n := len(NewIOBuffers(MaxIO + 4096).Memory()); n != MaxIO {
		t.Errorf("a pool of MaxIO+4096 bytes has a %d-byte slab", n)
	}
	if n := len(NewIOBuffers(1).Memory()); n != MaxIO {
		t.Errorf("a pool of 1 byte has a %d-byte slab", n)
	}
}

// Rule: giving back a block twice, or memory the pool did not hand out,
// panics instead of handing one block to two readers.
func TestIOBuffersRefuseForeignAndDoublePut(t *testing.T) {
	p := NewIOBuffers(MaxIO)
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", what)
			}
		}()
		f()
	}
	b := p.Get(100)
	p.Put(b)
	mustPanic("a second Put", func() { p.Put(b) })
	mustPanic("Put of foreign memory", func() { p.Put(make([]byte, 4096)) })
	c := p.Get(8192)
	mustPanic("Put of a block's tail", func() { p.Put(c[4096:]) })
	p.Put(c)
	if s := p.Stats(); s.InUse != 0 {
		t.Fatalf("in use %d after everything came back", s.InUse)
	}
}
