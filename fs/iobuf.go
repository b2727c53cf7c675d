package fs

import (
	"fmt"
	"math/bits"
	"os"
	"sync"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// The filesystem's I/O buffers.
//
// go-fuse hands Read a reply buffer from its own pool, one sync.Pool per
// page count. Reads of assorted sizes (fio's 512 B..1 MiB) rarely find a
// buffer of their page count there, so nearly every READ allocated a
// fresh one, and registering those buffers for the NIC meant a
// registration (and an eviction) per READ, with the registration cache
// keeping up to its byte bound of otherwise dead buffers reachable.
//
// Instead a remote file's READ lands in IOBuffers: one slab, allocated and
// registered with the backend once, cut into power-of-two blocks of 4 KiB
// to MaxIO by a buddy allocator. The reply is written to /dev/fuse from the
// block itself (a ReadResult whose Done returns the block), so the only
// copies are still the kernel's. The slab is the pool's whole memory: it
// never grows, and a READ that finds no free block of its size (more
// concurrent reads than the slab holds) lands in go-fuse's buffer as
// before, counted in Overflows.

const (
	ioMinShift = 12 // the smallest block, 4 KiB
	ioMaxShift = 20 // the largest block, MaxIO
	ioOrders   = ioMaxShift - ioMinShift + 1
)

// DefaultIOBufferBytes is Options.IOBufferBytes when left zero: eight reads
// of MaxIO bytes at once, or hundreds of small ones.
const DefaultIOBufferBytes = 8 << 20

// IOBuffers is the filesystem's pool of registered I/O buffers (see
// Options.IOBufferBytes). Methods may be called concurrently.
type IOBuffers struct {
	slab []byte

	mu sync.Mutex // guards the fields below
	// free[o] has bit i set when block i of size 4 KiB<<o is free (and
	// not part of a larger free block).
	free [ioOrders][]uint64
	// held[k] is 1 + the order of the block handed out at 4 KiB page k
	// of the slab, 0 where no block starts that is handed out.
	held  []uint8
	stats IOBufferStats
}

// IOBufferStats describe an IOBuffers pool.
type IOBufferStats struct {
	Bytes     int    // the slab: all the memory the pool ever holds
	InUse     int    // bytes of the blocks handed out now
	Peak      int    // the most InUse has been
	Gets      uint64 // blocks handed out
	Overflows uint64 // requests that found no free block (served elsewhere)
}

// pageAligned returns n zeroed bytes that start on a page boundary (as
// verbs.PageAligned does; fs imports nothing of krfs).
func pageAligned(n int) []byte {
	page := os.Getpagesize()
	b := make([]byte, n+page-1)
	off := (page - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(page))) % page
	return b[off : off+n : off+n]
}

// NewIOBuffers returns a pool of size bytes, rounded down to a multiple of
// MaxIO (at least MaxIO).
func NewIOBuffers(size int) *IOBuffers {
	size = max(size/MaxIO, 1) * MaxIO
	// Page-aligned, so that every block starts on a page too: an MR
	// over the slab is then zero-based (verbs.MR.IOVA 0) and a block is
	// never split across more pages than its size needs.
	p := &IOBuffers{slab: pageAligned(size), held: make([]uint8, size>>ioMinShift)}
	for o := range p.free {
		p.free[o] = make([]uint64, (size>>(ioMinShift+o)+63)/64)
	}
	for i := 0; i < size/MaxIO; i++ {
		p.setFree(ioOrders-1, i, true)
	}
	p.stats.Bytes = size
	return p
}

// Memory is the slab, to register once with the NIC. It starts on a page
// boundary.
func (p *IOBuffers) Memory() []byte { return p.slab }

// Stats returns the pool's figures.
func (p *IOBuffers) Stats() IOBufferStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

func (p *IOBuffers) setFree(order, i int, free bool) {
	w, b := i/64, uint64(1)<<(i%64)
	if free {
		p.free[order][w] |= b
	} else {
		p.free[order][w] &^= b
	}
}

// isFree reports whether block i of order is free as a whole.
func (p *IOBuffers) isFree(order, i int) bool {
	return p.free[order][i/64]&(uint64(1)<<(i%64)) != 0
}

// firstFree returns a free block of order, or -1.
func (p *IOBuffers) firstFree(order int) int {
	for w, word := range p.free[order] {
		if word != 0 {
			return w*64 + bits.TrailingZeros64(word)
		}
	}
	return -1
}

// orderOf is the order of the smallest block that holds n bytes.
func orderOf(n int) int {
	if n <= 1<<ioMinShift {
		return 0
	}
	return bits.Len(uint(n-1)) - ioMinShift
}

// Get returns a block of n bytes (1..MaxIO) from the slab, with the
// block's size as capacity, or nil when no block is free. Give it back
// with Put.
func (p *IOBuffers) Get(n int) []byte {
	if n <= 0 || n > MaxIO {
		return nil
	}
	want := orderOf(n)
	p.mu.Lock()
	defer p.mu.Unlock()
	o := want
	i := -1
	for ; o < ioOrders; o++ {
		if i = p.firstFree(o); i >= 0 {
			break
		}
	}
	if i < 0 {
		p.stats.Overflows++
		return nil
	}
	p.setFree(o, i, false)
	// Split down to the wanted order, freeing the upper halves.
	for ; o > want; o-- {
		i *= 2
		p.setFree(o-1, i+1, true)
	}
	size := 1 << (ioMinShift + want)
	off := i * size
	p.held[off>>ioMinShift] = uint8(want + 1)
	p.stats.Gets++
	p.stats.InUse += size
	p.stats.Peak = max(p.stats.Peak, p.stats.InUse)
	return p.slab[off : off+n : off+size]
}

// get is Get on a pool that may be nil (no pool: nil).
func (p *IOBuffers) get(n int) []byte {
	if p == nil {
		return nil
	}
	return p.Get(n)
}

// Put returns a block that Get handed out; anything else is a bug and
// panics (a block freed twice would be handed to two readers at once).
func (p *IOBuffers) Put(b []byte) {
	size := cap(b)
	off := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(p.slab))))
	if size < 1<<ioMinShift || size > MaxIO || size&(size-1) != 0 || off < 0 || off+size > len(p.slab) || off%size != 0 {
		panic(fmt.Sprintf("fs: IOBuffers.Put of a buffer the pool did not hand out (offset %d, capacity %d)", off, size))
	}
	o := bits.Len(uint(size)) - 1 - ioMinShift
	i := off / size
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[off>>ioMinShift] != uint8(o+1) {
		panic(fmt.Sprintf("fs: IOBuffers.Put of a block not handed out (offset %d, capacity %d)", off, size))
	}
	p.held[off>>ioMinShift] = 0
	p.stats.InUse -= size
	// Merge with the buddy while it is free.
	for ; o < ioOrders-1 && p.isFree(o, i^1); o++ {
		p.setFree(o, i^1, false)
		i /= 2
	}
	p.setFree(o, i, true)
}

// poolRead is a READ reply held in an IOBuffers block; go-fuse writes it
// to /dev/fuse from the block (Slices: one writev, no copy into its own
// buffer) and then calls Done, which gives the block back.
type poolRead struct {
	p *IOBuffers
	b []byte
}

var _ fuse.ReadResult = (*poolRead)(nil)

func (r *poolRead) Size() int                              { return len(r.b) }
func (r *poolRead) Bytes(buf []byte) ([]byte, fuse.Status) { return r.b, fuse.OK }

// Slices makes go-fuse write the reply with writev straight from the
// block, and call Done only after that write (a ReadResult without it is
// flattened with Bytes, and Done called, before the write).
func (r *poolRead) Slices() ([][]byte, fuse.Status) { return [][]byte{r.b}, fuse.OK }

func (r *poolRead) Done() {
	if r.b != nil {
		r.p.Put(r.b)
		r.b = nil
	}
}
