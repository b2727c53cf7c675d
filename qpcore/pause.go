package qpcore

import "fmt"

// A peer's pause, one type: while a peer is re-looked up (its QP said its
// metadata is stale) or backs off after RNR, its queues are not posted
// and the failed operations wait in the pause, in order. The pause
// changes only through its methods; the node starts the re-lookup or the
// backoff timer and requeues what the pause gives back (failures.go).
//
//	none --(DC key / no-QP NAK)------------------------> resolve --(re-lookup done)--> none
//	none --(RNR retries exhausted on a SEND)-----------> rnr -----(backoff elapsed)--> none
//	rnr  --(DC key / no-QP NAK)------------------------> resolve (its timer finds it gone)

// pauseState says whether a peer's queues may be posted.
type pauseState uint8

const (
	pauseNone    pauseState = iota
	pauseResolve            // re-looking the peer up; failed ops wait in stalled
	pauseRNR                // the receiver had no buffer; stalled ops retry after a backoff
)

func (s pauseState) String() string {
	switch s {
	case pauseNone:
		return "none"
	case pauseResolve:
		return "resolve"
	case pauseRNR:
		return "rnr"
	}
	return fmt.Sprintf("pauseState(%d)", uint8(s))
}

// peerPause is a peer's pause. Guarded by the peer's mu.
type peerPause struct {
	state   pauseState
	stalled []*op // failed ops waiting for the pause to end, in order
}

// active reports whether the peer is paused.
func (s *peerPause) active() bool { return s.state != pauseNone }

// is reports whether the peer is in pause st.
func (s *peerPause) is(st pauseState) bool { return s.state == st }

// stall parks ops, in order, until the pause ends.
func (s *peerPause) stall(ops []*op) {
	for _, o := range ops {
		o.setState(opStalled)
	}
	s.stalled = append(s.stalled, ops...)
}

// rnr starts an RNR backoff unless the peer is paused already, and
// reports whether it did (the caller arms the backoff).
func (s *peerPause) rnr() bool {
	if s.state != pauseNone {
		return false
	}
	s.state = pauseRNR
	return true
}

// resolve starts a re-lookup, taking over an RNR backoff, and reports
// whether it did (the caller starts the re-lookup).
func (s *peerPause) resolve() bool {
	if s.state == pauseResolve {
		return false
	}
	s.state = pauseResolve
	return true
}

// fresh reports whether some stalled op still has its retry.
func (s *peerPause) fresh() bool {
	for _, o := range s.stalled {
		if o.retries == 0 {
			return true
		}
	}
	return false
}

// end ends the pause and returns the stalled ops, in order.
func (s *peerPause) end() []*op {
	ops := s.stalled
	s.stalled = nil
	s.state = pauseNone
	return ops
}

// expire removes the stalled ops late says are past their deadline and
// returns them, in order.
func (s *peerPause) expire(late func(*op) bool) []*op {
	return takeOps(&s.stalled, late)
}

// resumeRNR ends an RNR pause: the stalled ops go back in front of the
// DC queue.
func (n *Node) resumeRNR(p *peer) {
	e := n.newEffects()
	p.mu.Lock()
	if p.pause.is(pauseRNR) && !p.closed {
		n.requeueLocked(p, p.pause.end())
		n.kickLocked(p, e)
	}
	p.mu.Unlock()
	n.apply(e)
}
