package qpcore

import (
	"fmt"

	"github.com/krfs/krfs/verbs"
)

// Send completions: the dispatcher, or a caller driving the device
// (wait.go), polls the send CQ; a success finishes its operation
// (effects.go), an error completion marks its QP errored, and once every
// WR of the QP came back the DCI is recovered or the RC QP dropped, and
// failures.go sorts out the operations.

// pollSend processes send completions, at most maxBatches batches (if
// negative, until a batch comes back short: the CQ was empty then, and a
// completion pushed later signals Notify or wakes the drivers).
func (n *Node) pollSend(maxBatches int) {
	n.pollMu.Lock()
	e := n.newEffects()
	for b := 0; maxBatches < 0 || b < maxBatches; b++ {
		k := n.scq.Poll(n.wcs[:])
		if k == 0 {
			break
		}
		for i := range k {
			n.onSendWC(&n.wcs[i], e)
		}
		if k < len(n.wcs) {
			// That emptied the CQ; a completion pushed since wakes
			// its waiters (Notify, or Wake for drivers), who poll.
			break
		}
	}
	n.pollMu.Unlock()
	n.apply(e)
}

func (n *Node) onSendWC(wc *verbs.WC, e *effects) {
	o := n.ops.get(wc.ID)
	if o == nil {
		return
	}
	p := o.p
	p.mu.Lock()
	if o.state == opPosted {
		if o.dci != nil {
			n.dciDoneLocked(p, o, wc, e)
		} else if o.rc != nil {
			n.rcDoneLocked(p, o, wc, e)
		}
	}
	n.kickLocked(p, e)
	p.mu.Unlock()
}

func (n *Node) dciDoneLocked(p *peer, o *op, wc *verbs.WC, e *effects) {
	d := o.dci
	o.dci = nil
	d.out--
	if wc.Status == verbs.StatusSuccess {
		n.answeredLocked(p)
		n.finishLocked(p, o, nil, e)
	} else {
		if !d.errored {
			d.errored = true
			n.dcMu.Lock()
			n.arb.StartRecovery(d.idx)
			n.dcMu.Unlock()
			n.stats.qpErrors.Add(1)
		}
		o.setState(opStalled)
		d.failed = append(d.failed, failure{o, wc.Status, wc.Reason})
	}
	if d.errored && d.out == 0 {
		n.recoverDCILocked(p, d, e)
	}
}

// recoverDCILocked brings an errored DCI whose WRs all came back to RTS
// and sorts out its failed ops.
func (n *Node) recoverDCILocked(p *peer, d *dciSlot, e *effects) {
	failed := d.failed
	d.failed = nil
	if err := n.pool.Recover(d.idx); err != nil {
		// The device is going away; the DCI stays errored.
		for _, f := range failed {
			n.finishLocked(p, f.o, fmt.Errorf("%w: DCI recovery: %w", ErrClosed, err), e)
		}
		return
	}
	d.errored = false
	n.dcMu.Lock()
	n.arb.FinishRecovery(d.idx)
	n.dcMu.Unlock()
	n.stats.dciRecoveries.Add(1)
	n.handleFailuresLocked(p, failed, false, e)
}

func (n *Node) rcDoneLocked(p *peer, o *op, wc *verbs.WC, e *effects) {
	c := o.rc
	o.rc = nil
	c.out--
	if wc.Status == verbs.StatusSuccess {
		n.answeredLocked(p)
		n.finishLocked(p, o, nil, e)
	} else {
		if !c.errored {
			c.errored = true
			n.stats.qpErrors.Add(1)
		}
		o.setState(opStalled)
		c.failed = append(c.failed, failure{o, wc.Status, wc.Reason})
	}
	switch {
	case c.errored && c.out == 0:
		n.dropErroredRCLocked(p, c, e)
	case !c.errored:
		n.rcMaybeCloseLocked(p, e)
	}
}

// failure is an operation's error completion.
type failure struct {
	o   *op
	st  verbs.Status
	why verbs.Reason
}
