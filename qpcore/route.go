package qpcore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krfs/krfs/verbs"
)

// This file moves operations from callers to QPs:
//
//	Post -> pre-check -> enqueue: the VQP's route queue (peer.dcq or
//	        peer.rcq), or the VQP's held list while a transport switch
//	        waits for the VQP's operations on the old transport (the fence)
//	kick -> the peer's DCI (acquired from the arbiter) or RC QP, as many as
//	        the QP's free slots and the DCI quota allow, one PostSend per
//	        QP (one doorbell)
//
// Everything here runs with the peer's mu held; what must happen after it
// is released (delivering results, kicking peers that were handed a DCI,
// starting goroutines, destroying QPs) is collected in effects and done by
// apply.

// post pre-checks and enqueues one synchronous op.
func (n *Node) post(ctx context.Context, v *VQP, wr *WR) (*op, error) {
	p := v.p
	p.mu.Lock()
	if err := n.usableLocked(p); err != nil {
		p.mu.Unlock()
		return nil, err
	}
	start, dirAt := n.clock.Now(), p.dirAt
	o, err := n.prepareLocked(ctx, p, v, wr, start, true)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	e := n.newEffects()
	e.now = start
	if !p.dirAt.Equal(dirAt) {
		e.now = n.clock.Now() // the pre-check waited for the directory
	}
	n.enqueueLocked(p, v, o)
	n.noteTrafficLocked(p, v, e.now, 1, e)
	if n.cfg.NoCoalesce || !n.inFlightLocked(p) {
		n.kickLocked(p, e)
	} else {
		// A completion of the peer's in-flight WRs kicks the queue: this
		// op leaves with whatever else queued by then, one doorbell.
		n.stats.coalesced.Add(1)
	}
	e.now = time.Time{}
	p.mu.Unlock()
	n.apply(e)
	return o, nil
}

// postBatch pre-checks and enqueues asynchronous ops; base is the index
// of wrs[0] in the caller's batch, for PostError.
func (n *Node) postBatch(ctx context.Context, v *VQP, wrs []WR, base int) (int, error) {
	p := v.p
	p.mu.Lock()
	if err := n.usableLocked(p); err != nil {
		p.mu.Unlock()
		return 0, err
	}
	e := n.newEffects()
	k := 0
	var perr error
	for i := range wrs {
		o, err := n.prepareLocked(ctx, p, v, &wrs[i], n.clock.Now(), false)
		if err != nil {
			perr = &PostError{Index: base + i, Err: err}
			break
		}
		o.async = true
		o.userID = wrs[i].ID
		o.seq = v.postSeq
		v.postSeq++
		n.enqueueLocked(p, v, o)
		k++
	}
	n.noteTrafficLocked(p, v, n.clock.Now(), k, e)
	n.kickLocked(p, e)
	p.mu.Unlock()
	n.apply(e)
	return k, perr
}

// prepareLocked pre-checks wr and builds its op (a synchronous one with
// sync), registered in the op table. It may release and retake p.mu to
// read the peer's directory.
func (n *Node) prepareLocked(ctx context.Context, p *peer, v *VQP, wr *WR, start time.Time, sync bool) (*op, error) {
	// The deadline counts from start, before the pre-check: a directory
	// read it waits for is part of the operation.
	if err := n.precheckLocked(ctx, p, v, wr); err != nil {
		n.stats.reject(err)
		return nil, err
	}
	var o *op
	if sync {
		o = n.syncOp()
	} else {
		o = newOp()
	}
	o.v, o.p, o.code = v, p, wr.Op
	o.region, o.off = wr.Region, wr.Offset
	switch wr.Op {
	case OpRead, OpWrite:
		me, off, err := n.mem.get(wr.Local)
		if err != nil {
			return nil, err
		}
		o.local, o.mem, o.lmr, o.loff = wr.Local, me, me.mr, off
	case OpCompareAndSwap, OpFetchAdd:
		if wr.Op == OpCompareAndSwap {
			o.cmp, o.swp = wr.Compare, wr.Swap
		} else {
			o.cmp = wr.Add
		}
		s, err := n.sinks.get()
		if err != nil {
			return nil, err
		}
		o.sink = s
	}
	o.expires = start.Add(n.cfg.PeerTimeout)
	n.ops.add(o)
	p.active++
	if p.down {
		p.probeAt = n.clock.Now().Add(n.attempt) // o is the down peer's probe
	}
	return o, nil
}

// wantLocked is the transport v's new operations should take. For an
// RC-only peer it is always DC: the peer has one queue (dcq), which its RC
// QP serves (see postRCOnlyLocked), so no fence is ever needed.
func (n *Node) wantLocked(p *peer, v *VQP) Transport {
	if v.sys || p.rcOnly || p.rc == nil || p.rcPhase != rcReady {
		return DC
	}
	return RC
}

// enqueueLocked routes a new op of v. If v must switch transports and
// still has operations on the old one, the op is held until they are done
// (the switching fence), so v's operations stay in order.
func (n *Node) enqueueLocked(p *peer, v *VQP, o *op) {
	want := n.wantLocked(p, v)
	if len(v.held) > 0 || (want != v.route && v.out[v.route] > 0) {
		if len(v.held) == 0 {
			p.held = append(p.held, v)
			n.stats.fences.Add(1)
		}
		v.held = append(v.held, o)
		o.setState(opHeld)
		return
	}
	n.switchRouteLocked(v, want)
	n.queueLocked(p, o, want)
}

func (n *Node) switchRouteLocked(v *VQP, to Transport) {
	if v.route == to {
		return
	}
	v.route = to
	if to == RC {
		n.stats.vqpToRC.Add(1)
	} else {
		n.stats.vqpToDC.Add(1)
	}
}

func (n *Node) queueLocked(p *peer, o *op, t Transport) {
	if o.expires.IsZero() && o.code != opSend {
		// Internal READs (directory, rendezvous) are bounded like the
		// caller's operations; SENDs keep MsgTimeout (RNR retries).
		o.expires = n.clock.Now().Add(n.cfg.PeerTimeout)
	}
	o.route = t
	o.setState(opQueued)
	o.v.out[t]++
	p.queue(t).push(o)
}

// settleLocked releases v's held ops once the fence allows.
func (n *Node) settleLocked(p *peer, v *VQP) {
	if len(v.held) == 0 {
		return
	}
	want := n.wantLocked(p, v)
	if want != v.route && v.out[v.route] > 0 {
		return
	}
	n.switchRouteLocked(v, want)
	held := v.held
	v.held = nil
	for _, o := range held {
		n.queueLocked(p, o, want)
	}
	n.dropHeldLocked(p, v)
}

func (n *Node) dropHeldLocked(p *peer, v *VQP) {
	for i, h := range p.held {
		if h == v {
			p.held = append(p.held[:i], p.held[i+1:]...)
			return
		}
	}
}

// settleAllLocked re-evaluates every fence of p (its RC state changed).
func (n *Node) settleAllLocked(p *peer) {
	for _, v := range append([]*VQP(nil), p.held...) {
		n.settleLocked(p, v)
	}
}

// noteTrafficLocked accounts k new ops of v and starts building an RC QP
// when the peer turned hot.
func (n *Node) noteTrafficLocked(p *peer, v *VQP, now time.Time, k int, e *effects) {
	if v.sys || p.rcOnly || n.cfg.DisableRC || k == 0 || p.rcPhase != rcNone || now.Before(p.rcRetryAt) {
		return
	}
	if p.meter.add(now, n.cfg.RCWindow, k) >= n.cfg.RCThreshold {
		p.setRCLocked(rcConnecting)
		e.connect = append(e.connect, p)
	}
}

// inFlightLocked reports whether p has WRs posted and not completed on
// its DCI or RC QP, whose completions will kick its queues.
func (n *Node) inFlightLocked(p *peer) bool {
	return (p.dci != nil && p.dci.out > 0 && !p.dci.errored) || (p.rc != nil && p.rc.out > 0 && !p.rc.errored)
}

// kickLocked posts what p's queues and QPs allow.
func (n *Node) kickLocked(p *peer, e *effects) {
	if p.closed {
		return
	}
	if p.pause != pauseNone {
		n.parkDCILocked(p, e)
		return
	}
	if p.rcq.len() > 0 && p.rc != nil && !p.rc.errored {
		room := n.cfg.RCDepth - p.rc.out
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
	case p.rcPhase == rcNone:
		p.setRCLocked(rcConnecting)
		e.connect = append(e.connect, p)
	case p.rcPhase == rcReady && !p.rc.errored:
		if room := n.cfg.RCDepth - p.rc.out; room > 0 {
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
	if p.dirValid {
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
	if user && !p.dirFetching {
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
		qp = p.rc.qp
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
			o.rc = p.rc
		}
	}
	n.stats.doorbells.Add(1)
	if t == DC {
		p.dci.out += k
		p.dciPosted += k
		n.stats.opsDC.Add(uint64(k))
	} else {
		p.rc.out += k
		p.rc.lastUsed.Store(now.UnixNano()) // the batch's time: idle tracking needs no more
		n.stats.opsRC.Add(uint64(k))
	}
}

// buildWRLocked builds o's work request. A user op's rkey comes from the
// directory as it is now; if the region changed since the pre-check so
// that the op no longer fits, the op fails here and never reaches the QP.
func (n *Node) buildWRLocked(p *peer, o *op, t Transport) (verbs.SendWR, error) {
	wr := verbs.SendWR{ID: o.id, Op: o.code.verb(), Flags: verbs.Signaled, RemoteAddr: o.off, RKey: o.rkey}
	if !o.sys {
		r, ok := p.dir[o.region]
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
