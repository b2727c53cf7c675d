package qpcore

import "fmt"

// pauseState says whether a peer's queues may be posted.
//
//	none --(DC key / no-QP NAK)------------------------> resolve --(re-lookup done)--> none
//	none --(RNR retries exhausted on a SEND)-----------> rnr -----(backoff elapsed)--> none
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

// stallLocked parks ops until the peer's pause ends.
func (n *Node) stallLocked(p *peer, ops []*op) {
	for _, o := range ops {
		o.setState(opStalled)
	}
	p.stalled = append(p.stalled, ops...)
}

// unstallLocked ends a pause: stalled ops go back in front of the DC
// queue.
func (n *Node) unstallLocked(p *peer) {
	ops := p.stalled
	p.stalled = nil
	p.pause = pauseNone
	n.requeueLocked(p, ops)
}

// resumeRNR ends an RNR pause.
func (n *Node) resumeRNR(p *peer) {
	e := n.newEffects()
	p.mu.Lock()
	if p.pause == pauseRNR && !p.closed {
		n.unstallLocked(p)
		n.kickLocked(p, e)
	}
	p.mu.Unlock()
	n.apply(e)
}
