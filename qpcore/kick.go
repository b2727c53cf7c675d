package qpcore

import (
	"errors"
	"fmt"

	"github.com/krfs/krfs/verbs"
)

// Kicking a peer: its queued operations go to its DCI (acquired from the
// arbiter, dci.go) or RC QP, as many as the QP's free slots and the DCI
// quota allow, with one PostSend per QP (one doorbell).

// inFlightLocked reports whether p has WRs posted and not completed on
// its DCI or RC QP, whose completions will kick its queues.
func (n *Node) inFlightLocked(p *peer) bool {
	return (p.dci != nil && p.dci.out > 0 && !p.dci.errored) || (p.rc.conn != nil && p.rc.conn.out > 0 && !p.rc.conn.errored)
}

// kickLocked posts what p's queues and QPs allow.
func (n *Node) kickLocked(p *peer, e *effects) {
	if p.closed {
		return
	}
	if p.pause.active() {
		n.parkDCILocked(p, e)
		return
	}
	if c := p.rc.postable(); c != nil && p.rcq.len() > 0 {
		room := n.cfg.RCDepth - c.out
		if room > 0 {
			n.postBatchLocked(p, n.takeBatchLocked(p, &p.rcq, room, e), RC, e)
		}
	}
	n.postDCLocked(p, e)
}

func (n *Node) postDCLocked(p *peer, e *effects) {
	if p.rcOnly {
		n.postRCOnlyLocked(p, e)
		return
	}
	if p.dcq.len() == 0 {
		n.releaseDCILocked(p, e, false)
		return
	}
	if p.dci == nil && !n.takeDCILocked(p) {
		return
	}
	d := p.dci
	if d.errored {
		return
	}
	room := n.cfg.DCIDepth - d.out
	n.dcMu.Lock()
	q := n.arb.Room(p.dciPosted)
	n.dcMu.Unlock()
	if q >= 0 && q < room {
		room = q
	}
	if room <= 0 {
		n.releaseDCILocked(p, e, true)
		return
	}
	n.postBatchLocked(p, n.takeBatchLocked(p, &p.dcq, room, e), DC, e)
}

// postRCOnlyLocked serves the queue of an RC-only peer (p.dcq, where
// every op of the peer goes, including requeued and retried ones) with its
// RC QP, and starts connecting one when the peer has none: the ops wait
// for it in the queue.
func (n *Node) postRCOnlyLocked(p *peer, e *effects) {
	if p.dcq.len() == 0 {
		return
	}
	switch {
	case p.rc.connect():
		e.connect = append(e.connect, p)
	case p.rc.ready() && !p.rc.conn.errored:
		if room := n.cfg.RCDepth - p.rc.conn.out; room > 0 {
			n.postBatchLocked(p, n.takeBatchLocked(p, &p.dcq, room, e), RC, e)
		}
	}
}

// takeBatchLocked removes up to room ops from q for posting. Without a
// valid directory only internal ops may go (one of them fetches it); the
// others stay queued, in order.
func (n *Node) takeBatchLocked(p *peer, q *opQueue, room int, e *effects) []*op {
	clear(e.batch)
	batch := e.batch[:0]
	if p.dir.valid {
		k := min(room, q.len())
		for i := range k {
			batch = append(batch, q.at(i))
		}
		q.drop(k)
		e.batch = batch
		return batch
	}
	user := false
	for i := range q.len() {
		if !q.at(i).sys {
			user = true
			break
		}
	}
	if user && !p.dir.fetching {
		n.fetchDirLocked(p)
	}
	q.filter(func(o *op) bool {
		if !o.sys || len(batch) >= room {
			return true
		}
		batch = append(batch, o)
		return false
	})
	e.batch = batch
	return batch
}

// postBatchLocked posts ops on p's DCI (t == DC) or RC QP with one
// PostSend. The ops of an RC-only peer keep their route (DC, the peer's
// single queue) while they go on the RC QP.
func (n *Node) postBatchLocked(p *peer, batch []*op, t Transport, e *effects) {
	if len(batch) == 0 {
		return
	}
	clear(e.wrs)
	clear(e.posting)
	wrs, ops := e.wrs[:0], e.posting[:0]
	now := e.clockNow(n.clock)
	for _, o := range batch {
		if !n.canRetryLocked(o, now) {
			// Another attempt would end after the deadline.
			n.stats.opTimeouts.Add(1)
			n.finishLocked(p, o, n.expiredErr(p, o), e)
			continue
		}
		wr, err := n.buildWRLocked(p, o, t)
		if err != nil {
			n.stats.reject(err)
			n.finishLocked(p, o, err, e)
			continue
		}
		wrs = append(wrs, wr)
		ops = append(ops, o)
	}
	e.wrs, e.posting = wrs, ops
	if len(wrs) == 0 {
		return
	}
	var qp verbs.QP
	if t == DC {
		qp = p.dci.qp
	} else {
		qp = p.rc.conn.qp
	}
	err := qp.PostSend(wrs)
	k := len(wrs)
	if err != nil {
		var pe *verbs.PostError
		if errors.As(err, &pe) {
			k = pe.Index
		} else {
			k = 0
		}
		n.stats.postErrors.Add(1)
	}
	for i, o := range ops {
		if i >= k {
			n.finishLocked(p, o, fmt.Errorf("qpcore: %v refused by the QP: %w", o.code, err), e)
			continue
		}
		o.setState(opPosted)
		o.mayRun = true
		if t == DC {
			o.dci = p.dci
		} else {
			o.rc = p.rc.conn
		}
	}
	n.stats.doorbells.Add(1)
	if t == DC {
		p.dci.out += k
		p.dciPosted += k
		n.stats.opsDC.Add(uint64(k))
	} else {
		p.rc.conn.out += k
		p.rc.conn.lastUsed.Store(now.UnixNano()) // the batch's time: idle tracking needs no more
		n.stats.opsRC.Add(uint64(k))
	}
}

// buildWRLocked builds o's work request. A user op's rkey comes from the
// directory as it is now; if the region changed since the pre-check so
// that the op no longer fits, the op fails here and never reaches the QP.
func (n *Node) buildWRLocked(p *peer, o *op, t Transport) (verbs.SendWR, error) {
	wr := verbs.SendWR{ID: o.id, Op: o.code.verb(), Flags: verbs.Signaled, RemoteAddr: o.off, RKey: o.rkey}
	if !o.sys {
		r, ok := p.dir.regions[o.region]
		if !ok {
			return wr, fmt.Errorf("%w: %q disappeared", ErrNoRegion, o.region)
		}
		if err := checkRange(&r, o.code, o.off, o.length()); err != nil {
			return wr, err
		}
		wr.RKey = r.RKey
	}
	switch {
	case o.code.atomic():
		wr.Local = n.sinks.sge(o.sink)
		wr.CompareAdd, wr.Swap = o.cmp, o.swp
	default:
		wr.Local = verbs.SGE{MR: o.lmr, Offset: o.loff, Length: uint32(len(o.local))}
	}
	if t == DC {
		wr.Target = &p.target
	}
	return wr, nil
}
