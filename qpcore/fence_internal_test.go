package qpcore

import (
	"testing"

	"github.com/krfs/krfs/clock"
)

// The switching fence as a state machine, without a network: a VQP with
// operations in flight on DC holds new ones when the peer's RC QP becomes
// ready, releases them to RC once the DC ones are done, and does the same
// on the way back when the RC QP drains.
func TestFenceStateMachine(t *testing.T) {
	n := &Node{clock: clock.System{}, cfg: Config{PeerTimeout: DefaultPeerTimeout}}
	p := &peer{n: n, gid: 2}
	v := &VQP{n: n, p: p}
	e := n.newEffects()
	newRead := func() *op {
		o := newOp()
		o.v, o.p, o.code = v, p, OpRead
		n.ops.add(o)
		p.active++
		n.enqueueLocked(p, v, o)
		return o
	}
	// post moves what is queued on t to "posted".
	post := func(q *opQueue) []*op {
		ops := q.take()
		for _, o := range ops {
			o.state = opPosted
		}
		return ops
	}
	d1, d2 := newRead(), newRead()
	if p.dcq.len() != 2 || v.route != DC {
		t.Fatalf("DC queue %d, route %v", p.dcq.len(), v.route)
	}
	post(&p.dcq)
	// The RC QP becomes ready while d1 and d2 are in flight on DC.
	p.rc.connect()
	p.rc.up(&rcConn{p: p})
	n.settleAllLocked(p)
	r1 := newRead()
	r2 := newRead()
	if r1.state != opHeld || r2.state != opHeld || len(v.held) != 2 || p.rcq.len() != 0 || n.stats.fences.Load() != 1 {
		t.Fatalf("ops not held behind the fence: %v %v, held %d, rcq %d", r1.state, r2.state, len(v.held), p.rcq.len())
	}
	if v.Transport() != DC {
		t.Fatalf("transport %v during the fence", v.Transport())
	}
	n.finishLocked(p, d1, nil, e)
	if len(v.held) != 2 {
		t.Fatal("fence lifted with a DC op still in flight")
	}
	n.finishLocked(p, d2, nil, e)
	if len(v.held) != 0 || p.rcq.len() != 2 || v.route != RC || p.rcq.at(0) != r1 || p.rcq.at(1) != r2 || len(p.held) != 0 {
		t.Fatalf("fence not lifted in order: held %d rcq %d route %v", len(v.held), p.rcq.len(), v.route)
	}
	if n.stats.vqpToRC.Load() != 1 {
		t.Fatal("switch not counted")
	}
	post(&p.rcq)
	// The RC QP drains (evicted): new ops wait for r1, r2, then go to DC.
	p.rc.drain()
	n.settleAllLocked(p)
	d3 := newRead()
	if d3.state != opHeld {
		t.Fatalf("op after drain started: %v", d3.state)
	}
	n.finishLocked(p, r1, nil, e)
	n.finishLocked(p, r2, nil, e)
	if d3.state != opQueued || d3.route != DC || p.dcq.len() != 1 || v.route != DC {
		t.Fatalf("fallback: %v on %v", d3.state, d3.route)
	}
	// A VQP with nothing in flight switches at once, no fence.
	post(&p.dcq)
	n.finishLocked(p, d3, nil, e)
	p.rc.closeDrained(0)
	p.rc.connect()
	p.rc.up(&rcConn{p: p})
	r3 := newRead()
	if r3.state != opQueued || r3.route != RC || n.stats.fences.Load() != 2 {
		t.Fatalf("idle VQP: %v on %v, fences %d", r3.state, r3.route, n.stats.fences.Load())
	}
	if v.out != [2]int{0, 1} || p.active != 1 {
		t.Fatalf("accounting: out %v active %d", v.out, p.active)
	}
}

func TestStateStrings(t *testing.T) {
	for _, s := range []interface{ String() string }{opNew, opHeld, opQueued, opPosted, opStalled, opDone, opState(99),
		pauseNone, pauseResolve, pauseRNR, pauseState(9), rcNone, rcConnecting, rcReady, rcDraining, rcPhase(9),
		DC, RC, Transport(9), OpRead, OpWrite, OpCompareAndSwap, OpFetchAdd, opRawRead, opSend, OpCode(99)} {
		if s.String() == "" {
			t.Errorf("%#v has no name", s)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("invalid RC transition did not panic")
		}
	}()
	var l rcLink
	l.set(rcDraining)
}
