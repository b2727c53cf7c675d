package qpcore

import "github.com/krfs/krfs/verbs"

// Asynchronous events (verbs.Device.OnEvent). A NIC reports some failures
// outside completions; the ones qpcore acts on are QPs moved to ERR:
//
//   - A passive RC QP is a responder only: when a peer's request broke
//     it (a stale rkey, a bad length) the peer sees an error completion
//     and replaces its own QP, but nothing completes on this side. The
//     event is the only news: the QP is destroyed at once and its slot of
//     the passive pool freed, so the peer's reconnection finds room.
//   - An active RC QP reported in ERR is marked errored; with nothing in
//     flight on it (no completion will come) it is dropped now, as after
//     an error completion, and its peer goes to DC or reconnects.
//   - DCIs and the DCT recover through their completions (a DCI's WRs
//     flush); their events are counted.
//
// CQ overruns, SRQ limits and port changes are counted (Stats).

// onEvent handles one event; it runs on the device's event goroutine.
func (n *Node) onEvent(ev verbs.Event) {
	switch {
	case ev.Type.IsQPError() && ev.QP != nil:
		n.onQPError(ev.QP)
	case ev.Type == verbs.EventCQErr && (ev.CQ == n.scq || ev.CQ == n.rcq):
		n.stats.cqErrors.Add(1)
	case ev.Type == verbs.EventSRQLimit && ev.SRQ == n.target.SRQ():
		n.stats.srqLimits.Add(1)
	case ev.Type == verbs.EventPortErr:
		n.stats.portDowns.Add(1)
	case ev.Type == verbs.EventPortActive:
		n.stats.portUps.Add(1)
	}
}

// onQPError handles a QP the device moved to ERR.
func (n *Node) onQPError(q verbs.QP) {
	n.passiveMu.Lock()
	_, passive := n.passive[q]
	if passive {
		delete(n.passive, q)
	}
	n.passiveMu.Unlock()
	if passive {
		q.Destroy() // not under passiveMu: Destroy waits for the receive path
		n.stats.rcPassiveErrors.Add(1)
		return
	}
	n.stats.qpEvents.Add(1)
	c := n.rcs.find(q)
	if c == nil {
		return
	}
	p := c.p
	e := n.newEffects()
	p.mu.Lock()
	if p.rc.conn == c && !c.errored {
		c.errored = true
		n.stats.qpErrors.Add(1)
		if c.out == 0 {
			n.dropErroredRCLocked(p, c, e)
		}
		n.kickLocked(p, e)
	}
	p.mu.Unlock()
	n.apply(e)
}
