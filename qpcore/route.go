package qpcore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/krfs/krfs/clock"
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

// effects is work deferred until no peer lock is held.
type effects struct {
	done    []*op
	kick    []*peer
	connect []*peer
	relook  []*peer
	rnr     []*peer
	destroy []*rcConn

	batch   []*op // scratch for kicks
	posting []*op
	wrs     []verbs.SendWR
}

var effectsPool = sync.Pool{New: func() any { return new(effects) }}

func newEffects() *effects { return effectsPool.Get().(*effects) }

// apply does e's work, then recycles e.
func (n *Node) apply(e *effects) {
	for {
		switch {
		case len(e.destroy) > 0:
			c := e.destroy[len(e.destroy)-1]
			e.destroy = e.destroy[:len(e.destroy)-1]
			n.destroyRC(c)
		case len(e.kick) > 0:
			p := e.kick[len(e.kick)-1]
			e.kick = e.kick[:len(e.kick)-1]
			p.mu.Lock()
			n.kickLocked(p, e)
			p.mu.Unlock()
		case len(e.done) > 0:
			done := append([]*op(nil), e.done...)
			clear(e.done)
			e.done = e.done[:0]
			for _, o := range done {
				n.deliver(o)
			}
		case len(e.connect) > 0:
			p := e.connect[len(e.connect)-1]
			e.connect = e.connect[:len(e.connect)-1]
			if !n.goSafe(func() { n.connectRC(p) }) {
				p.mu.Lock()
				if p.rcPhase == rcConnecting {
					p.setRCLocked(rcNone)
				}
				p.mu.Unlock()
			}
		case len(e.relook) > 0:
			p := e.relook[len(e.relook)-1]
			e.relook = e.relook[:len(e.relook)-1]
			n.goSafe(func() { n.relookup(p) })
		case len(e.rnr) > 0:
			p := e.rnr[len(e.rnr)-1]
			e.rnr = e.rnr[:len(e.rnr)-1]
			// The resume runs in its own goroutine whatever the clock: a
			// manual clock calls timers on the goroutine that moves time.
			n.clock.AfterFunc(rnrBackoff, func() { go n.resumeRNR(p) })
		default:
			clear(e.batch[:cap(e.batch)])
			clear(e.posting[:cap(e.posting)])
			clear(e.wrs[:cap(e.wrs)])
			e.batch, e.posting, e.wrs = e.batch[:0], e.posting[:0], e.wrs[:0]
			effectsPool.Put(e)
			return
		}
	}
}

// deliver hands a finished op to whoever waits for it.
func (n *Node) deliver(o *op) {
	n.mem.put(o.mem)
	o.mem = nil
	if o.tmp {
		o.lmr.Dereg()
		o.tmp = false
	}
	o.lmr = nil
	if o.sink >= 0 {
		n.sinks.put(o.sink)
		o.sink = -1
	}
	switch {
	case o.onDone != nil:
		o.onDone(o)
	case o.async:
		o.v.complete(o)
	default:
		o.fin.Store(true)
		o.done <- struct{}{}
		if n.dscq != nil {
			// Its waiter may be blocked receiving for the device.
			n.dscq.Wake()
		}
	}
}

// finishLocked ends o with err (nil for success).
func (n *Node) finishLocked(p *peer, o *op, err error, e *effects) {
	if o.state == opDone {
		return
	}
	counted := o.state == opQueued || o.state == opPosted || o.state == opStalled
	o.setState(opDone)
	o.err = err
	o.dci, o.rc = nil, nil
	if err == nil && o.code.atomic() {
		o.old = n.sinks.value(o.sink)
	}
	if err != nil {
		n.stats.opErrors.Add(1)
	}
	p.active--
	n.ops.del(o)
	if v := o.v; counted {
		v.out[o.route]--
		if len(v.held) > 0 && v.out[o.route] == 0 {
			n.settleLocked(p, v)
		}
	}
	e.done = append(e.done, o)
}

// usableLocked refuses new work for a closed or recently unreachable
// peer.
func (n *Node) usableLocked(p *peer) error {
	if p.closed {
		return ErrClosed
	}
	if !p.downUntil.IsZero() && n.clock.Now().Before(p.downUntil) {
		return fmt.Errorf("%w: gid %d did not answer within %v", ErrPeerUnreachable, p.gid, n.cfg.PeerTimeout)
	}
	return nil
}

// post pre-checks and enqueues one synchronous op.
func (n *Node) post(ctx context.Context, v *VQP, wr *WR) (*op, error) {
	p := v.p
	p.mu.Lock()
	if err := n.usableLocked(p); err != nil {
		p.mu.Unlock()
		return nil, err
	}
	o, err := n.prepareLocked(ctx, p, v, wr)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	o.done = make(chan struct{}, 1)
	e := newEffects()
	n.enqueueLocked(p, v, o)
	n.noteTrafficLocked(p, v, n.clock.Now(), 1, e)
	if n.cfg.NoCoalesce || !n.inFlightLocked(p) {
		n.kickLocked(p, e)
	} else {
		// A completion of the peer's in-flight WRs kicks the queue: this
		// op leaves with whatever else queued by then, one doorbell.
		n.stats.coalesced.Add(1)
	}
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
	e := newEffects()
	k := 0
	var perr error
	for i := range wrs {
		o, err := n.prepareLocked(ctx, p, v, &wrs[i])
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

// prepareLocked pre-checks wr and builds its op, registered in the op
// table. It may release and retake p.mu to read the peer's directory.
func (n *Node) prepareLocked(ctx context.Context, p *peer, v *VQP, wr *WR) (*op, error) {
	if err := n.precheckLocked(ctx, p, v, wr); err != nil {
		n.stats.reject(err)
		return nil, err
	}
	o := newOp()
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
	n.ops.add(o)
	p.active++
	return o, nil
}

// wantLocked is the transport v's new operations should take.
func (n *Node) wantLocked(p *peer, v *VQP) Transport {
	if v.sys || p.rc == nil || p.rcPhase != rcReady {
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
	if v.sys || n.cfg.DisableRC || k == 0 || p.rcPhase != rcNone || now.Before(p.rcRetryAt) {
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

// takeBatchLocked removes up to room ops from q for posting. Without a
// valid directory only internal ops may go (one of them fetches it); the
// others stay queued, in order.
func (n *Node) takeBatchLocked(p *peer, q *opQueue, room int, e *effects) []*op {
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
// PostSend.
func (n *Node) postBatchLocked(p *peer, batch []*op, t Transport, e *effects) {
	if len(batch) == 0 {
		return
	}
	wrs, ops := e.wrs[:0], e.posting[:0]
	for _, o := range batch {
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
		p.rc.lastUsed.Store(n.clock.Now().UnixNano())
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

// checkRange checks an access of length bytes at off against a region.
func checkRange(r *Region, code OpCode, off uint64, length int) error {
	if off > r.Len || uint64(length) > r.Len-off {
		return fmt.Errorf("%w: [%d, +%d) of %q (%d bytes)", ErrRemoteBounds, off, length, r.Name, r.Len)
	}
	var need verbs.Access
	switch code {
	case OpRead:
		need = verbs.AccessRemoteRead
	case OpWrite:
		need = verbs.AccessRemoteWrite
	case OpCompareAndSwap, OpFetchAdd:
		need = verbs.AccessRemoteAtomic
	}
	if r.Access&need != need {
		return fmt.Errorf("%w: %v on %q (%v)", ErrRemoteAccess, code, r.Name, r.Access)
	}
	return nil
}

// maxOpLen bounds one READ or WRITE.
const maxOpLen = 1 << 30

// opAllowed says which caller operations each transport carries.
var opAllowed = [2][opSend + 1]bool{
	DC: {OpRead: true, OpWrite: true, OpCompareAndSwap: true, OpFetchAdd: true},
	RC: {OpRead: true, OpWrite: true, OpCompareAndSwap: true, OpFetchAdd: true},
}

// precheckLocked validates wr before it may reach a shared QP: local
// buffer, opcode, alignment, and the remote range against the peer's
// region directory (size and access flags).
func (n *Node) precheckLocked(ctx context.Context, p *peer, v *VQP, wr *WR) error {
	length := len(wr.Local)
	switch wr.Op {
	case OpRead, OpWrite:
		if length == 0 || length > maxOpLen {
			return fmt.Errorf("%w: %d bytes (1..%d)", ErrLocalLength, length, maxOpLen)
		}
	case OpCompareAndSwap, OpFetchAdd:
		length = verbs.AtomicSize
		if wr.Offset%verbs.AtomicSize != 0 {
			return fmt.Errorf("%w: offset %d", ErrAlign, wr.Offset)
		}
	default:
		return fmt.Errorf("%w: %v", ErrOpcode, wr.Op)
	}
	if !opAllowed[n.wantLocked(p, v)][wr.Op] {
		return fmt.Errorf("%w: %v", ErrOpcode, wr.Op)
	}
	r, err := n.regionLocked(ctx, p, wr.Region)
	if err != nil {
		return err
	}
	return checkRange(&r, wr.Op, wr.Offset, length)
}

// dirRefreshMin is how old a directory must be before an unknown region
// name makes qpcore read it again.
const dirRefreshMin = 5 * time.Millisecond

// regionLocked finds a region of p by name. It may release and retake
// p.mu.
func (n *Node) regionLocked(ctx context.Context, p *peer, name string) (Region, error) {
	if err := n.ensureDirLocked(ctx, p); err != nil {
		return Region{}, err
	}
	r, ok := p.dir[name]
	if !ok && clock.Since(n.clock, p.dirAt) > dirRefreshMin {
		p.dirValid = false
		if err := n.ensureDirLocked(ctx, p); err != nil {
			return Region{}, err
		}
		r, ok = p.dir[name]
	}
	if !ok {
		return Region{}, fmt.Errorf("%w: %q on gid %d", ErrNoRegion, name, p.gid)
	}
	return r, nil
}

// ensureDirLocked makes sure p's directory is cached, reading it if
// needed. It releases p.mu while waiting and returns with it held.
func (n *Node) ensureDirLocked(ctx context.Context, p *peer) error {
	for tries := 0; ; tries++ {
		if err := n.usableLocked(p); err != nil {
			return err
		}
		if p.dirValid {
			return nil
		}
		if tries > 0 && p.dirErr != nil && !p.dirFetching {
			return p.dirErr
		}
		e := newEffects()
		n.fetchDirLocked(p)
		ch := p.dirWait
		n.kickLocked(p, e)
		p.mu.Unlock()
		n.apply(e)
		var err error
		if ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		p.mu.Lock()
		if err != nil {
			return err
		}
	}
}

// fetchDirLocked starts reading p's directory with one READ, unless a
// read is in progress or the directory is valid.
func (n *Node) fetchDirLocked(p *peer) {
	if p.dirFetching || p.dirValid {
		return
	}
	if p.dirWait == nil {
		p.dirWait = make(chan struct{})
	}
	p.dirErr = nil
	if p.info.DirLen == 0 || p.info.DirRKey == 0 {
		n.dirDoneLocked(p, map[string]Region{}, nil)
		return
	}
	buf := make([]byte, p.info.DirLen)
	mr, err := n.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		n.dirDoneLocked(p, nil, err)
		return
	}
	p.dirFetching = true
	o := newOp()
	o.v, o.p, o.code, o.sys = p.sys, p, opRawRead, true
	o.local, o.lmr, o.tmp, o.rkey = buf, mr, true, p.info.DirRKey
	o.onDone = n.dirFetched
	n.ops.add(o)
	p.active++
	n.queueLocked(p, o, DC)
	n.stats.dirReads.Add(1)
}

// dirFetched is the completion of a directory READ.
func (n *Node) dirFetched(o *op) {
	p := o.p
	var regions map[string]Region
	err := o.err
	if err == nil {
		regions, _, err = parseDirectory(o.local)
	}
	e := newEffects()
	p.mu.Lock()
	p.dirFetching = false
	if errors.Is(err, errTorn) && p.dirTorn < 16 {
		p.dirTorn++
		n.stats.dirTorn.Add(1)
		n.fetchDirLocked(p)
	} else {
		if errors.Is(err, errTorn) {
			err = fmt.Errorf("%w: records kept changing during %d READs", ErrDirectory, p.dirTorn+1)
		}
		p.dirTorn = 0
		n.dirDoneLocked(p, regions, err)
		if err != nil {
			// Operations waiting for the directory cannot be checked.
			for _, q := range []*opQueue{&p.dcq, &p.rcq} {
				for _, u := range q.filter(func(x *op) bool { return x.sys }) {
					n.finishLocked(p, u, err, e)
				}
			}
		}
	}
	n.kickLocked(p, e)
	p.mu.Unlock()
	n.apply(e)
}

func (n *Node) dirDoneLocked(p *peer, regions map[string]Region, err error) {
	if err != nil {
		p.dirErr = err
		p.dirValid = false
	} else {
		p.dir, p.dirValid, p.dirAt, p.dirErr = regions, true, n.clock.Now(), nil
	}
	if p.dirWait != nil {
		close(p.dirWait)
		p.dirWait = nil
	}
}

// invalidateDirLocked makes the next user operation read the directory
// again (after a NAK that says the cached one is wrong).
func (n *Node) invalidateDirLocked(p *peer) {
	p.dirValid = false
}
