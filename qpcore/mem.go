package qpcore

import (
	"container/list"
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"github.com/krfs/krfs/verbs"
)

// memEntry is one registration of caller memory for local use (READ
// destinations, WRITE and SEND sources).
type memEntry struct {
	mr   verbs.MR
	base uintptr
	n    int
	refs int    // operations using it; guarded by memCache.mu
	auto bool   // in the automatic cache (else registered explicitly)
	dead bool   // evicted or unregistered: deregister when refs drops to 0
	used uint64 // memCache.lookups at its last use (auto entries)
	elem *list.Element
}

// memIdleLookups is how many lookups an automatic entry may go unused
// before the cache lets it go. A cached buffer is kept reachable by its
// registration, so an entry whose buffer its owner dropped (a request
// buffer go-fuse's pool let go at a collection) would otherwise stay
// pinned until other buffers evict it, which a run of reads into
// registered memory never does.
const memIdleLookups = 1024

// memCache finds the MR behind a caller's []byte. Explicit registrations
// (Node.Register) are kept sorted and must not overlap; any other buffer
// is registered on first use and cached by its base address, LRU-bounded
// in entries (max) and in bytes (maxBytes). An automatic registration
// covers the buffer up to its capacity (when that fits maxBytes), so that
// the next use of the same buffer with another length hits. A cached
// registration keeps its buffer reachable, so the address cannot be reused
// for other memory while the entry lives, and so the byte bound is what
// keeps a node's memory from growing with the sizes of the buffers it was
// handed (FUSE request and reply buffers, application slices). A buffer
// larger than maxBytes is registered for its operation only
// (stats.uncached).
type memCache struct {
	pd       verbs.PD
	max      int
	maxBytes int

	mu       sync.Mutex // guards everything below and memEntry.refs/dead
	explicit []*memEntry
	auto     map[uintptr]*memEntry
	lru      list.List // auto entries, front = most recent
	bytes    int       // sum of the auto entries' lengths
	lookups  uint64    // get calls
	stats    struct{ hits, misses, evictions, uncached uint64 }
}

func newMemCache(pd verbs.PD, max, maxBytes int) *memCache {
	return &memCache{pd: pd, max: max, maxBytes: maxBytes, auto: make(map[uintptr]*memEntry)}
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// get returns a referenced registration covering buf and buf's offset in
// it. Release it with put.
func (c *memCache) get(buf []byte) (*memEntry, uint64, error) {
	if len(buf) == 0 {
		return nil, 0, ErrLocalLength
	}
	p := addrOf(buf)
	var victims []*memEntry
	defer func() {
		for _, v := range victims {
			v.mr.Dereg()
		}
	}()
	c.mu.Lock()
	c.lookups++
	if idle := c.lru.Back(); idle != nil && c.lookups-idle.Value.(*memEntry).used > memIdleLookups {
		c.expireLocked(&victims)
	}
	if i := sort.Search(len(c.explicit), func(i int) bool { return c.explicit[i].base > p }); i > 0 {
		e := c.explicit[i-1]
		if p+uintptr(len(buf)) <= e.base+uintptr(e.n) {
			e.refs++
			c.stats.hits++
			c.mu.Unlock()
			return e, uint64(p - e.base), nil
		}
	}
	if e := c.auto[p]; e != nil && e.n >= len(buf) {
		e.refs++
		e.used = c.lookups
		c.lru.MoveToFront(e.elem)
		c.stats.hits++
		c.mu.Unlock()
		return e, 0, nil
	}
	c.stats.misses++
	c.mu.Unlock()
	// Register up to the buffer's capacity: a reused buffer (go-fuse's
	// request buffer, whose WRITE payloads start at the same address with
	// every length) then hits whatever length comes next, and the cache
	// counts what its entry keeps reachable, not just one use's length.
	reg := buf
	if cap(buf) > len(buf) && cap(buf) <= c.maxBytes {
		reg = buf[:cap(buf)]
	}
	mr, err := c.pd.RegMR(reg, verbs.AccessLocalWrite)
	if err != nil {
		return nil, 0, fmt.Errorf("qpcore: registering a local buffer: %w", err)
	}
	e := &memEntry{mr: mr, base: p, n: len(reg), refs: 1, auto: true}
	if len(reg) > c.maxBytes {
		// Too large to keep: this operation's put deregisters it.
		e.dead = true
		c.mu.Lock()
		c.stats.uncached++
		c.mu.Unlock()
		return e, 0, nil
	}
	c.mu.Lock()
	if old := c.auto[p]; old != nil {
		c.dropLocked(old, &victims)
	}
	c.auto[p] = e
	e.used = c.lookups
	e.elem = c.lru.PushFront(e)
	c.bytes += e.n
	for c.lru.Len() > c.max || c.bytes > c.maxBytes {
		c.dropLocked(c.lru.Back().Value.(*memEntry), &victims)
		c.stats.evictions++
	}
	c.mu.Unlock()
	return e, 0, nil
}

// expireLocked lets go of the automatic entries unused for more than
// memIdleLookups lookups (counted in evictions); those no operation uses
// are added to victims, for the caller to deregister once c.mu is
// released (an entry in use is deregistered by its last put).
func (c *memCache) expireLocked(victims *[]*memEntry) {
	for back := c.lru.Back(); back != nil; back = c.lru.Back() {
		e := back.Value.(*memEntry)
		if c.lookups-e.used <= memIdleLookups {
			return
		}
		c.dropLocked(e, victims)
		c.stats.evictions++
	}
}

// dropLocked removes an auto entry from the cache; it is deregistered now
// (added to victims) or by the last put.
func (c *memCache) dropLocked(e *memEntry, victims *[]*memEntry) {
	delete(c.auto, e.base)
	c.lru.Remove(e.elem)
	c.bytes -= e.n
	e.dead = true
	if e.refs == 0 {
		*victims = append(*victims, e)
	}
}

func (c *memCache) put(e *memEntry) {
	if e == nil {
		return
	}
	c.mu.Lock()
	e.refs--
	dead := e.dead && e.refs == 0
	c.mu.Unlock()
	if dead {
		e.mr.Dereg()
	}
}

// register adds an explicit registration.
func (c *memCache) register(buf []byte) error {
	if len(buf) == 0 {
		return ErrLocalLength
	}
	p := addrOf(buf)
	c.mu.Lock()
	i := sort.Search(len(c.explicit), func(i int) bool { return c.explicit[i].base >= p })
	overlap := (i > 0 && c.explicit[i-1].base+uintptr(c.explicit[i-1].n) > p) ||
		(i < len(c.explicit) && c.explicit[i].base < p+uintptr(len(buf)))
	c.mu.Unlock()
	if overlap {
		return fmt.Errorf("%w: buffer overlaps a registered one", verbs.ErrInvalidArg)
	}
	mr, err := c.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	e := &memEntry{mr: mr, base: p, n: len(buf)}
	c.mu.Lock()
	i = sort.Search(len(c.explicit), func(i int) bool { return c.explicit[i].base >= p })
	c.explicit = append(c.explicit, nil)
	copy(c.explicit[i+1:], c.explicit[i:])
	c.explicit[i] = e
	c.mu.Unlock()
	return nil
}

// unregister removes the explicit registration that starts at buf.
func (c *memCache) unregister(buf []byte) error {
	p := addrOf(buf)
	c.mu.Lock()
	i := sort.Search(len(c.explicit), func(i int) bool { return c.explicit[i].base >= p })
	if i == len(c.explicit) || c.explicit[i].base != p {
		c.mu.Unlock()
		return fmt.Errorf("%w: buffer was not registered", verbs.ErrInvalidArg)
	}
	e := c.explicit[i]
	c.explicit = append(c.explicit[:i], c.explicit[i+1:]...)
	e.dead = true
	dead := e.refs == 0
	c.mu.Unlock()
	if dead {
		return e.mr.Dereg()
	}
	return nil
}

func (c *memCache) close() {
	c.mu.Lock()
	all := append([]*memEntry(nil), c.explicit...)
	for _, e := range c.auto {
		all = append(all, e)
	}
	c.explicit, c.auto = nil, map[uintptr]*memEntry{}
	c.lru.Init()
	c.bytes = 0
	c.mu.Unlock()
	for _, e := range all {
		e.mr.Dereg()
	}
}

// sinkPool hands out registered 8-byte slots for atomics' original
// values. It grows by slabs and never shrinks; its size follows the
// atomics in flight, which VQPDepth bounds per VQP.
type sinkPool struct {
	pd verbs.PD

	mu    sync.Mutex // guards the fields below
	slabs []sinkSlab
	free  []int32 // slot numbers: slab<<16 | index
}

type sinkSlab struct {
	mr  verbs.MR
	mem []byte
}

const sinkSlabSlots = 512

func (s *sinkPool) get() (int32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) == 0 {
		if len(s.slabs) >= 1<<15 {
			return 0, fmt.Errorf("%w: too many atomics in flight", ErrWouldBlock)
		}
		mem := make([]byte, sinkSlabSlots*8)
		mr, err := s.pd.RegMR(mem, verbs.AccessLocalWrite)
		if err != nil {
			return 0, err
		}
		k := int32(len(s.slabs))
		s.slabs = append(s.slabs, sinkSlab{mr, mem})
		for i := sinkSlabSlots - 1; i >= 0; i-- {
			s.free = append(s.free, k<<16|int32(i))
		}
	}
	x := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	return x, nil
}

func (s *sinkPool) sge(x int32) verbs.SGE {
	s.mu.Lock()
	sl := s.slabs[x>>16]
	s.mu.Unlock()
	return verbs.SGE{MR: sl.mr, Offset: uint64(x&0xffff) * 8, Length: 8}
}

func (s *sinkPool) value(x int32) uint64 {
	s.mu.Lock()
	sl := s.slabs[x>>16]
	s.mu.Unlock()
	off := int(x&0xffff) * 8
	return binary.NativeEndian.Uint64(sl.mem[off:])
}

func (s *sinkPool) put(x int32) {
	s.mu.Lock()
	s.free = append(s.free, x)
	s.mu.Unlock()
}

func (s *sinkPool) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sl := range s.slabs {
		sl.mr.Dereg()
	}
	s.slabs, s.free = nil, nil
}
