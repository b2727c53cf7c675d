package node

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/qpcore"
)

// Rule (issue 10, bounded memory): whatever the sizes and the history of
// the I/O, the memory a node keeps for the buffers it is handed stays
// within its bounds. READs and WRITEs of 512 B to 1 MiB go through the
// filesystem's seam (fs.Conn) the way a mount sends them: reads into the
// registered I/O buffers, or, when those are full, into a fresh buffer of
// go-fuse's; writes from fresh request buffers. After every operation the
// registration cache holds at most its byte bound, the NIC's registered
// bytes at most what was registered for good plus that bound, and the
// I/O buffers at most their slab; a read into the I/O buffers never
// registers anything. The bytes read are the bytes written.
func TestMemoryBoundedWhateverTheIO(t *testing.T) {
	const (
		region   = 4 << 20
		cacheMax = 2 << 20
		poolSize = 2 << 20
	)
	n, err := startAt(t, Config{ShmDir: t.TempDir(), MemSize: region, QPCore: qpcore.Config{MemCacheSize: cacheMax}})
	if err != nil {
		t.Fatalf("starting a node: %v", err)
	}
	defer n.Close()
	pool := fs.NewIOBuffers(poolSize)
	var reg fs.BufferRegistrar = n
	if err := reg.RegisterIOBuffers(pool); err != nil {
		t.Fatal(err)
	}
	fixed := n.Device().Stats().MRBytes // regions, directories, the I/O buffers
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := n.Connect(ctx, n.Self())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	shadow := make([]byte, region) // what the region holds
	r := rand.New(rand.NewPCG(1, 2))
	var poolReads, freshReads, writes int
	check := func(what string) {
		t.Helper()
		s, d, p := n.Core().Stats(), n.Device().Stats(), pool.Stats()
		if s.MemCachedBytes > cacheMax {
			t.Fatalf("after %s: the registration cache holds %d bytes, bound %d", what, s.MemCachedBytes, cacheMax)
		}
		if d.MRBytes > fixed+cacheMax {
			t.Fatalf("after %s: %d bytes registered on the NIC, want at most %d fixed + %d cache", what, d.MRBytes, fixed, cacheMax)
		}
		if p.InUse > p.Bytes || p.Peak > p.Bytes {
			t.Fatalf("after %s: I/O buffers %+v", what, p)
		}
	}
	var held [][]byte // pool blocks held across operations, as by concurrent readers
	for i := range 300 {
		size := 512 * (1 + r.IntN(2048))
		off := 512 * r.IntN((region-size)/512+1)
		switch r.IntN(3) {
		case 0: // a WRITE from a fresh request buffer
			src := make([]byte, size, size+r.IntN(8192))
			for j := range src {
				src[j] = byte(r.Uint32())
			}
			if _, err := c.WriteAt(ctx, "mem", src, int64(off)); err != nil {
				t.Fatalf("write %d at %d: %v", size, off, err)
			}
			copy(shadow[off:], src)
			writes++
			check("a write")
		default: // a READ into the I/O buffers, or a fresh buffer when full
			dst := pool.Get(size)
			fresh := dst == nil
			if fresh {
				dst = make([]byte, size)
			}
			misses := n.Core().Stats().MemMisses
			if _, err := c.ReadAt(ctx, "mem", dst, int64(off)); err != nil {
				t.Fatalf("read %d at %d: %v", size, off, err)
			}
			if !bytes.Equal(dst, shadow[off:off+size]) {
				t.Fatalf("read %d at %d (%d): wrong bytes", size, off, i)
			}
			if fresh {
				freshReads++
			} else {
				poolReads++
				if got := n.Core().Stats().MemMisses; got != misses {
					t.Fatalf("a read into the registered I/O buffers registered memory (%d cache misses)", got-misses)
				}
				held = append(held, dst)
			}
			check("a read")
			// Give blocks back now and then, so the pool is sometimes full.
			for len(held) > 0 && r.IntN(2) == 0 {
				pool.Put(held[0])
				held = held[1:]
			}
		}
	}
	for _, b := range held {
		pool.Put(b)
	}
	s, p := n.Core().Stats(), pool.Stats()
	t.Logf("%d writes, %d reads into the I/O buffers, %d into fresh buffers; cache %d bytes (%d misses, %d evictions); pool %+v",
		writes, poolReads, freshReads, s.MemCachedBytes, s.MemMisses, s.MemEvictions, p)
	if poolReads == 0 || freshReads == 0 || s.MemEvictions == 0 {
		t.Fatalf("the run did not exercise the bounds: %d pool reads, %d fresh reads, %d evictions", poolReads, freshReads, s.MemEvictions)
	}
	if p.InUse != 0 || p.Overflows != uint64(freshReads) {
		t.Fatalf("pool after the run: %+v, %d overflows expected", p, freshReads)
	}

	// The pool shows in the stats file, and goes away with the mount.
	var w strings.Builder
	if err := n.Stats(&w, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(w.String(), "iobuf.Bytes 2097152\n") || !strings.Contains(w.String(), "iobuf.Overflows ") {
		t.Fatalf("stats without the I/O buffers:\n%s", w.String())
	}
	if err := reg.UnregisterIOBuffers(pool); err != nil {
		t.Fatal(err)
	}
	if got := n.Device().Stats().MRBytes; got > fixed+cacheMax-poolSize {
		t.Fatalf("after unregistering the I/O buffers %d bytes are registered, want at most %d", got, fixed+cacheMax-poolSize)
	}
	w.Reset()
	n.Stats(&w, false)
	if strings.Contains(w.String(), "iobuf.") {
		t.Fatal("stats still show the I/O buffers after they were unregistered")
	}
}

// The I/O buffers may be unregistered by the mount after the node closed
// (at unmount both happen, in either order): no error either way, and
// never twice.
func TestIOBuffersUnregisterAfterClose(t *testing.T) {
	for _, closeFirst := range []bool{true, false} {
		n, err := startAt(t, Config{ShmDir: t.TempDir(), MemSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		p := fs.NewIOBuffers(fs.MaxIO)
		if err := n.RegisterIOBuffers(p); err != nil {
			t.Fatal(err)
		}
		if closeFirst {
			n.Close()
		}
		if err := n.UnregisterIOBuffers(p); err != nil {
			t.Errorf("close first %v: UnregisterIOBuffers: %v", closeFirst, err)
		}
		if err := n.UnregisterIOBuffers(p); err != nil {
			t.Errorf("close first %v: a second UnregisterIOBuffers: %v", closeFirst, err)
		}
		if err := n.Close(); !closeFirst && err != nil {
			t.Errorf("Close after the mount unregistered: %v", err)
		}
	}
}
