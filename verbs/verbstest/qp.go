package verbstest

import (
	"bytes"
	"errors"

	"github.com/krfs/krfs/verbs"
)

var qpCases = []namedCase{
	{"Transitions", func(e *env) {
		n := e.node()
		q := n.rcQP(nil)
		e.state(q, verbs.StateReset)
		if q.Type() != verbs.RC || q.QPN() == 0 || q.QPN() > 0xffffff {
			e.t.Fatalf("new RC QP: type %v QPN %d", q.Type(), q.QPN())
		}
		for _, to := range []verbs.QPState{verbs.StateRTR, verbs.StateRTS} {
			if err := q.Modify(verbs.QPAttr{State: to}); !errors.Is(err, verbs.ErrTransition) {
				e.t.Fatalf("RESET -> %v: %v, want ErrTransition", to, err)
			}
		}
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateInit}), "RESET -> INIT")
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateInit}), "INIT -> INIT")
		if err := q.Modify(verbs.QPAttr{State: verbs.StateRTS}); !errors.Is(err, verbs.ErrTransition) {
			e.t.Fatalf("INIT -> RTS: %v, want ErrTransition", err)
		}
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateErr}), "INIT -> ERR")
		e.state(q, verbs.StateErr)
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateReset}), "ERR -> RESET")
		e.state(q, verbs.StateReset)
		e.ok(q.Destroy(), "Destroy")
		if err := q.Modify(verbs.QPAttr{State: verbs.StateInit}); !errors.Is(err, verbs.ErrDestroyed) {
			e.t.Fatalf("Modify after Destroy: %v, want ErrDestroyed", err)
		}
		e.postErr(q.PostSend([]verbs.SendWR{{Op: verbs.OpWrite, Local: n.sge(0, 8)}}), 0, verbs.ErrDestroyed)
		if err := q.Destroy(); !errors.Is(err, verbs.ErrDestroyed) {
			e.t.Fatalf("second Destroy: %v, want ErrDestroyed", err)
		}
	}},
	{"PostNeedsState", func(e *env) {
		n := e.node()
		q := n.rcQP(nil)
		e.postErr(q.PostRecv([]verbs.RecvWR{{Local: n.sge(0, 64)}}), 0, verbs.ErrQPState)
		e.postErr(q.PostSend([]verbs.SendWR{{Op: verbs.OpSend, Local: n.sge(0, 8)}}), 0, verbs.ErrQPState)
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateInit}), "to INIT")
		e.recv(q, verbs.RecvWR{ID: 1, Local: n.sge(0, 64)}) // allowed from INIT on, as in ibverbs
		e.postErr(q.PostSend([]verbs.SendWR{{Op: verbs.OpSend, Local: n.sge(0, 8)}}), 0, verbs.ErrQPState)
		// Moving to ERR flushes the posted receive.
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateErr}), "to ERR")
		wc := e.one(n.cq, 1, verbs.StatusWRFlushErr)
		if wc.QPN != q.QPN() {
			e.t.Fatalf("flushed receive on QP %d, want %d", wc.QPN, q.QPN())
		}
	}},
	{"ManualConnectionOnOneDevice", func(e *env) {
		// meta's loopback pair: two RC QPs of one device connected by
		// hand with Modify.
		n := e.node()
		a, b := n.rcQP(nil), n.rcQP(nil)
		for _, p := range [][2]verbs.QP{{a, b}, {b, a}} {
			q, peer := p[0], p[1]
			e.ok(q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteWrite}), "INIT")
			e.ok(q.Modify(verbs.QPAttr{State: verbs.StateRTR, RemoteAddr: n.dev.Addr(), RemoteQPN: peer.QPN()}), "RTR")
			e.ok(q.Modify(verbs.QPAttr{State: verbs.StateRTS, Timeout: connParams.Timeout, RetryCnt: 7}), "RTS")
		}
		fill(n.mem[:100], 3)
		e.post(a, verbs.SendWR{ID: 9, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: n.sge(0, 100), RemoteAddr: 4096, RKey: n.mr.RKey()})
		e.one(n.cq, 9, verbs.StatusSuccess)
		if !bytes.Equal(n.mem[4096:4196], n.mem[:100]) {
			e.t.Fatal("loopback WRITE did not land")
		}
		// The QP grants only what its Access allows: READ is refused.
		e.post(a, verbs.SendWR{ID: 10, Op: verbs.OpRead, Flags: verbs.Signaled, Local: n.sge(0, 8), RemoteAddr: 4096, RKey: n.mr.RKey()})
		wc := e.one(n.cq, 10, verbs.StatusRemAccessErr)
		e.reason(wc, verbs.ReasonPerm)
		e.state(a, verbs.StateErr)
	}},
	{"RTRNeedsPeer", func(e *env) {
		n := e.node()
		q := n.rcQP(nil)
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateInit}), "INIT")
		if err := q.Modify(verbs.QPAttr{State: verbs.StateRTR}); err == nil {
			e.t.Fatal("RC QP reached RTR without a remote address and QPN")
		}
		e.state(q, verbs.StateInit)
	}},
	{"SendQueueFull", func(e *env) {
		a, b := e.node(), e.node()
		q, err := a.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: a.cq, RecvCQ: a.cq, Caps: verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4}})
		e.ok(err, "CreateQP")
		qb := b.rcQP(nil)
		svc := uint32(77)
		e.ok(b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return qb, nil, nil }), "ListenRC")
		ctx, cancel := ctxDeadline()
		defer cancel()
		_, err = a.dev.ConnectRC(ctx, q, b.dev.Addr(), svc, connParams)
		e.ok(err, "ConnectRC")
		// Unsignaled WRs count against the queue until a later signaled
		// WR completes.
		free := q.SendQueueFree()
		if free < 4 {
			e.t.Fatalf("SendQueueFree %d on an idle QP of depth 4", free)
		}
		wrs := make([]verbs.SendWR, free+1)
		for i := range wrs {
			wrs[i] = verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Local: a.sge(0, 8), RemoteAddr: uint64(i * 8), RKey: b.mr.RKey()}
		}
		wrs[free-1].Flags = verbs.Signaled
		err = q.PostSend(wrs)
		e.postErr(err, free, verbs.ErrQueueFull)
		e.one(a.cq, uint64(free-1), verbs.StatusSuccess)
		if got := q.SendQueueFree(); got != free {
			e.t.Fatalf("SendQueueFree %d after the batch completed, want %d", got, free)
		}
	}},
}
