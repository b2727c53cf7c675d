package verbstest

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/krfs/krfs/verbs"
)

var cqCases = []namedCase{
	{"PollWaitNotify", func(e *env) {
		a, b := e.node(), e.node()
		qa, _ := e.connect(a, b, nil)
		var wc [4]verbs.WC
		if n := a.cq.Poll(wc[:]); n != 0 {
			e.t.Fatalf("Poll of an idle CQ returned %d", n)
		}
		// Wait on an idle CQ returns when its context ends.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := a.cq.Wait(ctx); err == nil {
			e.t.Fatal("Wait with a cancelled context on an idle CQ returned nil")
		}
		// Drain a notification left by earlier activity (connection
		// setup), then check that a new completion raises one.
		select {
		case <-a.cq.Notify():
		default:
		}
		// Notify's channel gets a value once a completion is added.
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey()})
		select {
		case <-a.cq.Notify():
		case <-time.After(Deadline):
			e.t.Fatal("no notification after a completion")
		}
		if n := a.cq.Poll(wc[:]); n != 1 || wc[0].ID != 1 || wc[0].Status != verbs.StatusSuccess || wc[0].QPN != qa.QPN() {
			e.t.Fatalf("Poll returned %d: %+v", n, wc[0])
		}
		// Wait blocks until a completion arrives. (Wait and Notify share
		// the CQ's one wake-up, like an ibverbs completion channel: a
		// consumer uses one or the other.)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := ctxDeadline()
			defer cancel()
			done <- a.cq.Wait(ctx)
		}()
		e.post(qa, verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey()})
		if err := <-done; err != nil {
			e.t.Fatalf("Wait: %v", err)
		}
		e.one(a.cq, 2, verbs.StatusSuccess)
		// Poll takes at most len(wcs) and leaves the rest.
		var wrs []verbs.SendWR
		for i := range 5 {
			wrs = append(wrs, verbs.SendWR{ID: uint64(10 + i), Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey()})
		}
		e.post(qa, wrs...)
		got := e.wcs(a.cq, 5)
		for i, w := range got {
			if w.ID != uint64(10+i) {
				e.t.Fatalf("completions out of order: %+v", got)
			}
		}
		e.quiet(a.cq)
	}},
	{"Destroyed", func(e *env) {
		n := e.node()
		cq, err := n.dev.CreateCQ(16)
		e.ok(err, "CreateCQ")
		e.ok(cq.Destroy(), "Destroy")
		ctx, cancel := ctxDeadline()
		defer cancel()
		if err := cq.Wait(ctx); !errors.Is(err, verbs.ErrDestroyed) {
			e.t.Fatalf("Wait on a destroyed CQ: %v, want ErrDestroyed", err)
		}
		if _, err := n.dev.CreateCQ(0); err == nil {
			e.t.Fatal("CreateCQ(0) succeeded")
		}
	}},
}

var srqCases = []namedCase{
	{"SharedByQPs", func(e *env) {
		a, b := e.node(), e.node()
		srq, err := b.pd.CreateSRQ(8)
		e.ok(err, "CreateSRQ")
		q1, r1 := e.connect(a, b, srq)
		q2, r2 := e.connect(a, b, srq)
		e.postErr(r1.PostRecv([]verbs.RecvWR{{Local: b.sge(0, 8)}}), 0, verbs.ErrOpcode)
		e.recv(srq, verbs.RecvWR{ID: 1, Local: b.sge(0, 64)}, verbs.RecvWR{ID: 2, Local: b.sge(64, 64)})
		if srq.Posted() != 2 {
			e.t.Fatalf("Posted %d, want 2", srq.Posted())
		}
		e.post(q1, verbs.SendWR{ID: 10, Op: verbs.OpSend, Flags: verbs.Signaled | verbs.Inline, InlineData: []byte("one")})
		e.one(a.cq, 10, verbs.StatusSuccess)
		e.post(q2, verbs.SendWR{ID: 11, Op: verbs.OpSend, Flags: verbs.Signaled | verbs.Inline, InlineData: []byte("two")})
		e.one(a.cq, 11, verbs.StatusSuccess)
		rs := e.wcs(b.cq, 2)
		if rs[0].QPN != r1.QPN() || rs[1].QPN != r2.QPN() || rs[0].ID == rs[1].ID {
			e.t.Fatalf("receives %+v: want one on QP %d and one on QP %d", rs, r1.QPN(), r2.QPN())
		}
		if srq.Posted() != 0 {
			e.t.Fatalf("Posted %d after both receives were used", srq.Posted())
		}
	}},
	{"Full", func(e *env) {
		n := e.node()
		srq, err := n.pd.CreateSRQ(4)
		e.ok(err, "CreateSRQ")
		wrs := make([]verbs.RecvWR, 6)
		for i := range wrs {
			wrs[i] = verbs.RecvWR{ID: uint64(i), Local: n.sge(uint64(i*64), 64)}
		}
		err = srq.PostRecv(wrs)
		var pe *verbs.PostError
		if !errors.As(err, &pe) || !errors.Is(err, verbs.ErrQueueFull) || pe.Index < 4 || srq.Posted() != pe.Index {
			e.t.Fatalf("overfilling an SRQ of depth 4: %v with %d posted, want ErrQueueFull at the first WR that did not fit", err, srq.Posted())
		}
		e.ok(srq.Destroy(), "Destroy")
		e.postErr(srq.PostRecv(wrs[:1]), 0, verbs.ErrDestroyed)
	}},
}

var cmCases = []namedCase{
	{"PrivateDataBothWays", func(e *env) {
		a, b := e.node(), e.node()
		svc := rand.Uint32() | 1
		qb := b.rcQP(nil)
		var mu sync.Mutex // accept runs on the device's goroutine
		var req verbs.ConnRequest
		e.ok(b.dev.ListenRC(svc, func(r verbs.ConnRequest) (verbs.QP, []byte, error) {
			mu.Lock()
			defer mu.Unlock()
			req = r
			return qb, []byte("reply"), nil
		}), "ListenRC")
		if err := b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return nil, nil, nil }); !errors.Is(err, verbs.ErrInvalidArg) {
			e.t.Fatalf("second ListenRC on one service: %v, want ErrInvalidArg", err)
		}
		qa := a.rcQP(nil)
		ctx, cancel := ctxDeadline()
		defer cancel()
		priv, err := a.dev.ConnectRC(ctx, qa, b.dev.Addr(), svc, verbs.ConnParams{Private: []byte("request")})
		e.ok(err, "ConnectRC")
		mu.Lock()
		defer mu.Unlock()
		if string(priv) != "reply" || string(req.Private) != "request" || req.RemoteQPN != qa.QPN() || req.RemoteAddr != a.dev.Addr() {
			e.t.Fatalf("private data %q, request %+v", priv, req)
		}
		e.state(qa, verbs.StateRTS)
		e.state(qb, verbs.StateRTS)
		if _, err := a.dev.ConnectRC(ctx, qa, b.dev.Addr(), svc, verbs.ConnParams{}); !errors.Is(err, verbs.ErrQPState) {
			e.t.Fatalf("ConnectRC of a connected QP: %v, want ErrQPState", err)
		}
	}},
	{"Rejections", func(e *env) {
		a, b := e.node(), e.node()
		ctx, cancel := ctxDeadline()
		defer cancel()
		svc := rand.Uint32() | 1
		q := a.rcQP(nil)
		if _, err := a.dev.ConnectRC(ctx, q, b.dev.Addr(), svc, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMRejected) {
			e.t.Fatalf("connect without a listener: %v, want ErrCMRejected", err)
		}
		e.state(q, verbs.StateReset)
		e.ok(b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
			return nil, nil, errors.New("go away")
		}), "ListenRC")
		_, err := a.dev.ConnectRC(ctx, q, b.dev.Addr(), svc, verbs.ConnParams{})
		if !errors.Is(err, verbs.ErrCMRejected) || !strings.Contains(err.Error(), "go away") {
			e.t.Fatalf("connect refused by accept: %v, want ErrCMRejected carrying the reason", err)
		}
		e.ok(b.dev.StopListenRC(svc), "StopListenRC")
		if err := b.dev.StopListenRC(svc); err == nil {
			e.t.Fatal("StopListenRC of a stopped service succeeded")
		}
		if _, err := a.dev.ConnectRC(ctx, q, b.dev.Addr(), svc, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMRejected) {
			e.t.Fatalf("connect after StopListenRC: %v, want ErrCMRejected", err)
		}
		// The QP is usable for another try.
		e.state(q, verbs.StateReset)
	}},
	{"Timeout", func(e *env) {
		a := e.node()
		dead := e.unreachable()
		q := a.rcQP(nil)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if _, err := a.dev.ConnectRC(ctx, q, dead, 1, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMTimeout) {
			e.t.Fatalf("connect to a device that is gone: %v, want ErrCMTimeout", err)
		}
		e.state(q, verbs.StateReset)
	}},
	{"AccessSetBeforeAccept", func(e *env) {
		// meta's server: the accept function grants READ only by setting
		// Access in INIT and returning the QP in RESET.
		a, b := e.node(), e.node()
		svc := rand.Uint32() | 1
		e.ok(b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
			q := b.rcQP(nil)
			if err := q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead}); err != nil {
				return nil, nil, err
			}
			return q, nil, q.Modify(verbs.QPAttr{State: verbs.StateReset})
		}), "ListenRC")
		qa := a.rcQP(nil)
		ctx, cancel := ctxDeadline()
		defer cancel()
		_, err := a.dev.ConnectRC(ctx, qa, b.dev.Addr(), svc, connParams)
		e.ok(err, "ConnectRC")
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey()})
		e.one(a.cq, 1, verbs.StatusSuccess)
		e.post(qa, verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey()})
		wc := e.one(a.cq, 2, verbs.StatusRemAccessErr)
		e.reason(wc, verbs.ReasonPerm)
	}},
}
