package softnic

import (
	"fmt"
	"sync"

	"github.com/krfs/krfs/verbs"
)

// srq is a shared receive queue: a FIFO of receive WRs consumed by the
// QPs (typically DCTs) attached to it.
type srq struct {
	pd    *pd
	depth int

	mu    sync.Mutex // guards the fields below
	wqes  []recvWQE
	head  int
	limit int // armed SRQ limit (0: disarmed)
	dead  bool
}

var _ verbs.SRQ = (*srq)(nil)

func (p *pd) CreateSRQ(depth int) (verbs.SRQ, error) {
	if depth <= 0 || depth > MaxSRQWR {
		return nil, fmt.Errorf("%w: SRQ depth %d (1..%d)", verbs.ErrInvalidArg, depth, MaxSRQWR)
	}
	return &srq{pd: p, depth: depth}, nil
}

func (s *srq) PostRecv(wrs []verbs.RecvWR) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return &verbs.PostError{Index: 0, Err: verbs.ErrDestroyed}
	}
	for i, wr := range wrs {
		if len(s.wqes)-s.head >= s.depth {
			return &verbs.PostError{Index: i, Err: verbs.ErrQueueFull}
		}
		if wr.Local.MR != nil || wr.Local.Length != 0 {
			if err := checkLocal(s.pd, wr.Local, verbs.AccessLocalWrite); err != nil {
				return &verbs.PostError{Index: i, Err: err}
			}
		}
		if s.head > 0 && s.head == len(s.wqes) {
			s.wqes, s.head = s.wqes[:0], 0
		}
		s.wqes = append(s.wqes, recvWQE{id: wr.ID, sge: wr.Local, buf: wr.Local.Bytes()})
	}
	return nil
}

func (s *srq) take() (recvWQE, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.head == len(s.wqes) {
		return recvWQE{}, false
	}
	r := s.wqes[s.head]
	s.wqes[s.head] = recvWQE{}
	s.head++
	if s.limit > 0 && len(s.wqes)-s.head < s.limit {
		s.limit = 0
		s.pd.dev.raise(verbs.Event{Type: verbs.EventSRQLimit, SRQ: s})
	}
	if s.head == len(s.wqes) {
		s.wqes, s.head = s.wqes[:0], 0
	} else if s.head > 1024 && s.head*2 > len(s.wqes) {
		n := copy(s.wqes, s.wqes[s.head:])
		s.wqes, s.head = s.wqes[:n], 0
	}
	return r, true
}

// putBack returns r to the head of the queue.
func (s *srq) putBack(r recvWQE) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head > 0 {
		s.head--
		s.wqes[s.head] = r
		return
	}
	s.wqes = append([]recvWQE{r}, s.wqes...)
}

// ArmLimit implements verbs.SRQ.
func (s *srq) ArmLimit(limit int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.dead:
		return fmt.Errorf("%w: SRQ", verbs.ErrDestroyed)
	case limit < 0 || limit > s.depth:
		return fmt.Errorf("%w: SRQ limit %d (0..%d)", verbs.ErrInvalidArg, limit, s.depth)
	}
	s.limit = limit
	return nil
}

func (s *srq) Posted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.wqes) - s.head
}

func (s *srq) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return fmt.Errorf("%w: SRQ", verbs.ErrDestroyed)
	}
	s.dead = true
	s.wqes = nil
	return nil
}
