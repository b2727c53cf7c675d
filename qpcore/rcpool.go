package qpcore

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/krfs/krfs/verbs"
)

// rcPool is the accounting of the node's RC QPs, one type with its own
// lock: the slots taken (QPs connecting, ready or draining; at most
// Config.RCCap), the QPs ready or draining (the candidates for idle
// teardown and eviction), and the RC-only connections waiting for a slot.
// It decides nothing: the node (rc.go) reserves, evicts and frees.
type rcPool struct {
	mu    sync.Mutex
	count int           // slots taken
	conns []*rcConn     // ready or draining
	freed chan struct{} // closed when a slot is freed, if an RC-only connection waits
}

// reserve takes a slot if fewer than capacity are taken.
func (s *rcPool) reserve(capacity int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.count < capacity {
		s.count++
		return true
	}
	return false
}

// reserveOrWatch takes a slot if fewer than capacity are taken; else it
// returns a channel closed when a slot is freed, and the QPs, least
// recently used first.
func (s *rcPool) reserveOrWatch(capacity int) (ok bool, freed <-chan struct{}, lru []*rcConn) {
	s.mu.Lock()
	if s.count < capacity {
		s.count++
		s.mu.Unlock()
		return true, nil, nil
	}
	if s.freed == nil {
		s.freed = make(chan struct{})
	}
	freed, lru = s.freed, slices.Clone(s.conns)
	s.mu.Unlock()
	slices.SortFunc(lru, func(a, b *rcConn) int { return cmp.Compare(a.lastUsed.Load(), b.lastUsed.Load()) })
	return false, freed, lru
}

// free returns a slot and wakes the connections waiting for one.
func (s *rcPool) free() {
	s.mu.Lock()
	s.count--
	if s.freed != nil {
		close(s.freed)
		s.freed = nil
	}
	s.mu.Unlock()
}

// add lists c, connected.
func (s *rcPool) add(c *rcConn) {
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
}

// remove unlists c and reports whether it was listed (its slot is then
// the caller's to free).
func (s *rcPool) remove(c *rcConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.conns, c)
	if i < 0 {
		return false
	}
	s.conns = slices.Delete(s.conns, i, i+1)
	return true
}

// victim is the least recently used QP unused since cutoff (Unix ns), or
// nil.
func (s *rcPool) victim(cutoff int64) *rcConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var v *rcConn
	for _, c := range s.conns {
		if t := c.lastUsed.Load(); t < cutoff && (v == nil || t < v.lastUsed.Load()) {
			v = c
		}
	}
	return v
}

// idle lists the QPs unused for more than d at now.
func (s *rcPool) idle(now time.Time, d time.Duration) []*rcConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*rcConn
	for _, c := range s.conns {
		if now.Sub(time.Unix(0, c.lastUsed.Load())) > d {
			out = append(out, c)
		}
	}
	return out
}

// find is the listed QP whose verbs QP is q, or nil.
func (s *rcPool) find(q verbs.QP) *rcConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		if c.qp == q {
			return c
		}
	}
	return nil
}

// len is how many QPs are listed.
func (s *rcPool) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// takeAll unlists every QP and returns them (the node closes).
func (s *rcPool) takeAll() []*rcConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	conns := s.conns
	s.conns = nil
	return conns
}
