package qpcore

import (
	"context"
	"time"
)

// Operations move from callers to QPs in three steps:
//
//	post    -> pre-check (precheck.go), build the op (this file)
//	enqueue -> the VQP's route queue (peer.dcq or peer.rcq), or the VQP's
//	           held list while a transport switch waits for the VQP's
//	           operations on the old transport (the fence, fence.go)
//	kick    -> the peer's DCI (acquired from the arbiter, dci.go) or RC
//	           QP, as many as the QP's free slots and the DCI quota allow,
//	           one PostSend per QP (one doorbell; kick.go)
//
// Everything there runs with the peer's mu held; what must happen after it
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
	start, dirAt := n.clock.Now(), p.dir.at
	o, err := n.prepareLocked(ctx, p, v, wr, start, true)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	e := n.newEffects()
	e.now = start
	if !p.dir.at.Equal(dirAt) {
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
	p.live.admitted(n.clock, n.attempt) // to a down peer, o is the probe
	return o, nil
}
