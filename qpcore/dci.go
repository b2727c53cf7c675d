package qpcore

import "github.com/krfs/krfs/verbs"

// DCI hand-out: a peer with DC work takes a DCI from the node's pool (or
// one handed over to it by a peer that released it) through the arbiter of
// package dct, keeps it while it has WRs outstanding and its quota lasts,
// and hands it to the next waiting peer when it is done or must yield.

// takeDCILocked gives p a DCI: one handed over to it, or the top of the
// free stack. Without one, p waits in the arbiter's queue.
func (n *Node) takeDCILocked(p *peer) bool {
	n.dcMu.Lock()
	defer n.dcMu.Unlock()
	if p.grant != nil {
		p.dci, p.grant = p.grant, nil
		p.dciPosted = 0
		return true
	}
	i, ok := n.arb.Acquire(p)
	if !ok {
		n.stats.dciWaits.Add(1)
		return false
	}
	p.dci = n.dcis[i]
	p.dciPosted = 0
	return true
}

// releaseDCILocked gives p's DCI up when its work on it drained and
// either nothing is queued or p must yield to waiting peers (then p queues
// again behind them). A DCI handed to p that it no longer needs is passed
// on.
func (n *Node) releaseDCILocked(p *peer, e *effects, yield bool) {
	n.dcMu.Lock()
	defer n.dcMu.Unlock()
	if p.dci == nil {
		if p.dcq.len() == 0 {
			if p.grant != nil {
				d := p.grant
				p.grant = nil
				n.handLocked(d, e)
			}
			n.arb.Cancel(p)
		}
		return
	}
	d := p.dci
	if d.out > 0 || d.errored || (p.dcq.len() > 0 && !yield) {
		return
	}
	p.dci = nil
	n.handLocked(d, e)
	if p.dcq.len() > 0 {
		n.stats.dciYields.Add(1)
		if i, ok := n.arb.Acquire(p); ok {
			p.dci = n.dcis[i]
			p.dciPosted = 0
			e.kick = append(e.kick, p)
		}
	}
}

// parkDCILocked gives up the DCI of a paused peer (a re-lookup or an RNR
// backoff can take a while) once its work on it drained, and any DCI
// handed to it, so that other peers can use them; p asks again when the
// pause ends.
func (n *Node) parkDCILocked(p *peer, e *effects) {
	n.dcMu.Lock()
	defer n.dcMu.Unlock()
	n.arb.Cancel(p)
	if d := p.grant; d != nil {
		p.grant = nil
		n.handLocked(d, e)
	}
	if d := p.dci; d != nil && d.out == 0 && !d.errored {
		p.dci = nil
		n.handLocked(d, e)
	}
}

// handLocked releases DCI d to the arbiter; n.dcMu held.
func (n *Node) handLocked(d *dciSlot, e *effects) {
	if next, ok := n.arb.Release(d.idx); ok {
		next.grant = d
		e.kick = append(e.kick, next)
	}
}

// dciSlot is one DCI of the pool. While a peer owns it (see dct.Arbiter)
// its fields are guarded by that peer's mu; a DCI changes owner only when
// out is 0 and it is not errored.
type dciSlot struct {
	idx     int
	qp      verbs.QP
	out     int       // WRs posted and not completed
	errored bool      // an error completion arrived: recovering
	failed  []failure // error and flushed completions, in completion order
}
