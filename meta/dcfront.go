package meta

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
)

// frontMax is how many entries the DCCache's front holds before they move
// into ristretto together.
const frontMax = 64

// dcFront is the DCCache's front: an entry read from a server goes here
// first and moves into ristretto with frontMax-1 others.
//
// Ristretto applies a Set (and a Del) on its own goroutine, which an idle
// cache must wake: a thread woken on another CPU in the middle of every
// cold connect, in the process that waits for the peer's first reply
// (perf, cold connect + first 8 B READ across a veth: 1.5 futex wake-ups
// per connect from ristretto's Set and Del, of 3.2 in all). Batching makes
// that one wake-up per frontMax entries, and none for a process that looks
// up a few peers. Lookups look at the front first: it holds the newest
// entries.
type dcFront struct {
	max int              // entries held before they move: frontMax, at most the DCCache's size
	now func() time.Time // wall clock, as ristretto's TTL; nil: time.Now
	mu  sync.Mutex       // guards m
	m   map[uint32]frontEntry
	// flushed is set once an entry has moved to ristretto: from then on
	// an invalidation must also delete there.
	flushed atomic.Bool
}

type frontEntry struct {
	n       NodeInfo
	epoch   uint64    // Client.inval when it was read
	expires time.Time // zero: no TTL
}

func (f *dcFront) clock() time.Time {
	if f.now != nil {
		return f.now()
	}
	return time.Now()
}

// get returns gid's entry if the front holds one that has not expired.
func (f *dcFront) get(gid uint32) (NodeInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.m[gid]
	if !ok {
		return NodeInfo{}, false
	}
	if !e.expires.IsZero() && !f.clock().Before(e.expires) {
		delete(f.m, gid)
		return NodeInfo{}, false
	}
	return e.n, true
}

// put keeps n, read at invalidation epoch epoch. When the front is full it
// returns its entries, which the caller moves to ristretto (flush).
func (f *dcFront) put(n NodeInfo, epoch uint64, ttl time.Duration) []frontEntry {
	e := frontEntry{n: n, epoch: epoch}
	if ttl > 0 {
		e.expires = f.clock().Add(ttl)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[uint32]frontEntry, f.max)
	}
	f.m[n.GID] = e
	if len(f.m) < f.max {
		return nil
	}
	out := make([]frontEntry, 0, len(f.m))
	for _, e := range f.m {
		out = append(out, e)
	}
	clear(f.m)
	f.flushed.Store(true)
	return out
}

// del drops gid's entry.
func (f *dcFront) del(gid uint32) {
	f.mu.Lock()
	delete(f.m, gid)
	f.mu.Unlock()
}

// flush moves entries the front gave up into ristretto with what remains
// of their TTL. An entry read before the latest invalidation (epoch) is
// dropped: it may be the one invalidated.
func flush(dc *ristretto.Cache[uint32, NodeInfo], out []frontEntry, epoch uint64) {
	now := time.Now()
	for _, e := range out {
		if e.epoch != epoch {
			continue
		}
		var ttl time.Duration
		if !e.expires.IsZero() {
			if ttl = e.expires.Sub(now); ttl <= 0 {
				continue
			}
		}
		dc.SetWithTTL(e.n.GID, e.n, 1, ttl)
	}
}
