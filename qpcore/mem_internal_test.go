package qpcore

import (
	"testing"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// TestMemCacheBoundedInBytes registers buffers of growing sizes through the
// automatic cache and checks that the bytes it holds never exceed the
// bound, that a buffer larger than the bound is registered for its
// operation only, and that every registration is gone once released and
// evicted (the device's MR count).
func TestMemCacheBoundedInBytes(t *testing.T) {
	dev, pd := testDevice(t)
	const bound = 1 << 20
	c := newMemCache(pd, 1024, bound)
	var bufs [][]byte
	for i := range 64 {
		b := make([]byte, 4096<<(i%8)) // 4 KiB .. 512 KiB
		bufs = append(bufs, b)
		e, _, err := c.get(b)
		if err != nil {
			t.Fatal(err)
		}
		c.put(e)
		if c.bytes > bound {
			t.Fatalf("after %d buffers the cache holds %d bytes, bound %d", i+1, c.bytes, bound)
		}
	}
	if c.stats.evictions == 0 {
		t.Error("no evictions although 64 buffers exceed the byte bound")
	}
	// A hit keeps its entry; the most recent buffer is still cached.
	last := bufs[len(bufs)-1]
	hits := c.stats.hits
	e, _, err := c.get(last)
	if err != nil {
		t.Fatal(err)
	}
	c.put(e)
	if c.stats.hits != hits+1 {
		t.Error("the most recently used buffer was not a cache hit")
	}

	// Larger than the bound: registered, usable, not cached, deregistered
	// by put.
	mrs := dev.Stats().MRs
	huge := make([]byte, bound+1)
	e, _, err = c.get(huge)
	if err != nil {
		t.Fatal(err)
	}
	if dev.Stats().MRs != mrs+1 || c.auto[addrOf(huge)] != nil {
		t.Fatalf("a buffer over the bound: MRs %d -> %d, cached %v", mrs, dev.Stats().MRs, c.auto[addrOf(huge)] != nil)
	}
	c.put(e)
	if dev.Stats().MRs != mrs || c.stats.uncached != 1 {
		t.Errorf("after put: MRs %d (want %d), uncached %d (want 1)", dev.Stats().MRs, mrs, c.stats.uncached)
	}
	// The device's MRs are exactly the cached entries.
	if dev.Stats().MRs != c.lru.Len() {
		t.Errorf("device has %d MRs, the cache %d entries", dev.Stats().MRs, c.lru.Len())
	}
	c.close()
	if dev.Stats().MRs != 0 || c.bytes != 0 {
		t.Errorf("after close: %d MRs, %d bytes", dev.Stats().MRs, c.bytes)
	}
}

// TestMemCacheRegistersUpToCapacity: a reused buffer (go-fuse's request
// buffer, whose WRITE payloads all start at one address) is registered
// once up to its capacity, so later uses of any length hit, and the cache
// counts the capacity, which is what the entry keeps reachable. A slice
// whose capacity is over the byte bound is registered for its length.
func TestMemCacheRegistersUpToCapacity(t *testing.T) {
	dev, pd := testDevice(t)
	const bound = 1 << 20
	c := newMemCache(pd, 1024, bound)
	defer c.close()
	reqBuf := make([]byte, 256<<10)
	for i, n := range []int{512, 100 << 10, 4096, 256 << 10, 1} {
		e, off, err := c.get(reqBuf[:n])
		if err != nil {
			t.Fatal(err)
		}
		if off != 0 || e.n != len(reqBuf) {
			t.Fatalf("use %d (%d bytes): offset %d, entry of %d bytes, want the buffer's capacity %d", i, n, off, e.n, len(reqBuf))
		}
		c.put(e)
	}
	if c.stats.misses != 1 || c.stats.hits != 4 || c.bytes != len(reqBuf) || dev.Stats().MRs != 1 {
		t.Fatalf("misses %d hits %d bytes %d MRs %d; want one registration of %d bytes and four hits",
			c.stats.misses, c.stats.hits, c.bytes, dev.Stats().MRs, len(reqBuf))
	}
	big := make([]byte, 2*bound)
	e, _, err := c.get(big[:4096])
	if err != nil {
		t.Fatal(err)
	}
	if e.n != 4096 || c.bytes != len(reqBuf)+4096 {
		t.Fatalf("a slice of a %d-byte array: entry of %d bytes, cache %d bytes", len(big), e.n, c.bytes)
	}
	c.put(e)
}

// TestMemCacheLetsIdleEntriesGo: an automatic entry nobody used for
// memIdleLookups lookups is let go (deregistered, its buffer no longer
// kept reachable), even when every lookup since hit an explicit
// registration and nothing else would have evicted it; an entry in use
// meanwhile stays.
func TestMemCacheLetsIdleEntriesGo(t *testing.T) {
	dev, pd := testDevice(t)
	c := newMemCache(pd, 1024, 1<<20)
	defer c.close()
	pool := make([]byte, 64<<10)
	if err := c.register(pool); err != nil {
		t.Fatal(err)
	}
	idle, busy := make([]byte, 4096), make([]byte, 4096)
	for _, b := range [][]byte{idle, busy} {
		e, _, err := c.get(b)
		if err != nil {
			t.Fatal(err)
		}
		c.put(e)
	}
	for i := range memIdleLookups + 1 {
		if i%100 == 0 {
			e, _, _ := c.get(busy)
			c.put(e)
		}
		e, _, err := c.get(pool[i%16*4096 : i%16*4096+4096])
		if err != nil {
			t.Fatal(err)
		}
		c.put(e)
	}
	if c.auto[addrOf(idle)] != nil || c.auto[addrOf(busy)] == nil {
		t.Fatalf("after %d lookups: idle entry cached %v, busy entry cached %v", memIdleLookups+1, c.auto[addrOf(idle)] != nil, c.auto[addrOf(busy)] != nil)
	}
	if c.bytes != 4096 || dev.Stats().MRs != 2 || c.stats.evictions != 1 {
		t.Fatalf("cache %d bytes, %d MRs on the device (want the pool and busy), %d evictions", c.bytes, dev.Stats().MRs, c.stats.evictions)
	}
}

// testDevice is a device on an in-memory network and a protection domain
// of it, closed when the test ends.
func testDevice(t *testing.T) (*softnic.Device, verbs.PD) {
	t.Helper()
	net := softnictest.NewNetwork(softnictest.Config{})
	t.Cleanup(func() { net.Close() })
	dev, err := softnic.Open(softnic.Config{Link: net.NewLink()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	return dev, pd
}
