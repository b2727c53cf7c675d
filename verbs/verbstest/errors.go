package verbstest

import (
	"time"

	"github.com/krfs/krfs/verbs"
)

// checkFlushed checks that wcs are, in order, the error of WR first
// (status st) and then WRs first+1... flushed.
func (e *env) checkFlushed(wcs []verbs.WC, first uint64, st verbs.Status) {
	e.t.Helper()
	for i, wc := range wcs {
		want := verbs.StatusWRFlushErr
		if i == 0 {
			want = st
		}
		if wc.ID != first+uint64(i) || wc.Status != want {
			e.t.Fatalf("completion %d is %+v, want WR %d with %v", i, wc, first+uint64(i), want)
		}
	}
}

var errorCases = []namedCase{
	{"RemoteAccessErrorsFlushUnsignaled", func(e *env) {
		for _, c := range []struct {
			name   string
			op     verbs.Opcode
			rkey   func(b *node) uint32
			off    uint64
			access verbs.Access
			why    verbs.Reason
		}{
			{"bad rkey", verbs.OpRead, func(b *node) uint32 { return b.mr.RKey() ^ 0x5a5a00 }, 0, verbs.AccessAll, verbs.ReasonRKey},
			{"out of bounds", verbs.OpWrite, func(b *node) uint32 { return b.mr.RKey() }, memSize - 4, verbs.AccessAll, verbs.ReasonBounds},
			{"no permission", verbs.OpFetchAdd, func(b *node) uint32 { return b.mr.RKey() }, 8, verbs.AccessAll, verbs.ReasonPerm},
		} {
			a, b := e.node(), e.node()
			qa, qb := e.connect(a, b, nil)
			rk := c.rkey(b)
			if c.why == verbs.ReasonPerm {
				mr, err := b.pd.RegMR(b.mem[:4096], verbs.AccessLocalWrite|verbs.AccessRemoteRead)
				e.ok(err, "RegMR")
				rk = mr.RKey()
			}
			e.recv(qa, verbs.RecvWR{ID: 50, Local: a.sge(0, 64)})
			// The bad WR and the ones after it are all unsignaled.
			wrs := []verbs.SendWR{{ID: 1, Op: c.op, Local: a.sge(0, 8), RemoteAddr: c.off, RKey: rk}}
			for i := range 4 {
				wrs = append(wrs, verbs.SendWR{ID: uint64(2 + i), Op: verbs.OpWrite, Local: a.sge(0, 8), RKey: b.mr.RKey()})
			}
			e.post(qa, wrs...)
			wcs := e.wcs(a.cq, 6)
			var sends []verbs.WC
			var flushedRecv bool
			for _, wc := range wcs {
				if wc.ID == 50 {
					flushedRecv = wc.Status == verbs.StatusWRFlushErr
					continue
				}
				sends = append(sends, wc)
			}
			if !flushedRecv || len(sends) != 5 {
				e.t.Fatalf("%s: completions %+v: want the error, 4 flushed sends and the flushed receive", c.name, wcs)
			}
			e.checkFlushed(sends, 1, verbs.StatusRemAccessErr)
			e.reason(sends[0], c.why)
			if sends[0].Err() == nil {
				e.t.Fatalf("%s: WC.Err of an error completion is nil", c.name)
			}
			e.state(qa, verbs.StateErr)
			// Posting to a QP in ERR completes flushed, as on hardware.
			e.post(qa, verbs.SendWR{ID: 9, Op: verbs.OpWrite, Local: a.sge(0, 8), RKey: b.mr.RKey()})
			e.one(a.cq, 9, verbs.StatusWRFlushErr)
			e.quiet(a.cq)
			_ = qb
		}
	}},
	{"ModifyToErrFlushesOutstanding", func(e *env) {
		// WRs stuck in flight (the peer is gone, the ACK timeout is
		// long) complete flushed, signaled or not, when the QP is moved
		// to ERR by hand.
		a, b := e.node(), e.node()
		qa, _ := e.connect(a, b, nil)
		_ = b.dev.Close()
		var wrs []verbs.SendWR
		for i := range 6 {
			f := verbs.SendFlags(0)
			if i%3 == 2 {
				f = verbs.Signaled
			}
			wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: f, Local: a.sge(0, 8), RKey: b.mr.RKey()})
		}
		e.post(qa, wrs...)
		e.ok(qa.Modify(verbs.QPAttr{State: verbs.StateErr}), "to ERR")
		wcs := e.wcs(a.cq, 6)
		for i, wc := range wcs {
			if wc.ID != uint64(i) || wc.Status != verbs.StatusWRFlushErr {
				e.t.Fatalf("completion %d: %+v, want WR %d flushed", i, wc, i)
			}
		}
		if free := qa.SendQueueFree(); free < 6 {
			e.t.Fatalf("SendQueueFree %d after every WR flushed", free)
		}
	}},
	{"RetryExhausted", func(e *env) {
		a, b := e.node(), e.node()
		qa, _ := e.manual(a, b, verbs.QPAttr{Timeout: 20 * time.Millisecond, RetryCnt: 1})
		_ = b.dev.Close()
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpRead, Local: a.sge(0, 8), RKey: b.mr.RKey()},
			verbs.SendWR{ID: 2, Op: verbs.OpWrite, Local: a.sge(0, 8), RKey: b.mr.RKey()})
		wcs := e.timedWCs(a.cq, 2)
		e.checkFlushed(wcs, 1, verbs.StatusRetryExcErr)
		e.reason(wcs[0], verbs.ReasonRemoteDown)
		e.state(qa, verbs.StateErr)
	}},
	{"RNRRetryExhausted", func(e *env) {
		a, b := e.node(), e.node()
		qa, qb := e.manual(a, b, verbs.QPAttr{Timeout: connParams.Timeout, RetryCnt: 7, Mask: verbs.AttrRNRRetry, RNRRetry: 0})
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpSend, Local: a.sge(0, 8)},
			verbs.SendWR{ID: 2, Op: verbs.OpSend, Local: a.sge(0, 8)})
		wcs := e.timedWCs(a.cq, 2)
		e.checkFlushed(wcs, 1, verbs.StatusRNRRetryExcErr)
		e.state(qa, verbs.StateErr)
		e.state(qb, verbs.StateRTS) // RNR is not the responder's error
	}},
	{"RNRRetrySucceedsOncePosted", func(e *env) {
		a, b := e.node(), e.node()
		qa, qb := e.connect(a, b, nil)
		copy(a.mem[:4], "late")
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, Local: a.sge(0, 4)})
		// The receive comes after the SEND arrived (or not: either way
		// the SEND must complete once it is posted).
		e.recv(qb, verbs.RecvWR{ID: 2, Local: b.sge(0, 64)})
		e.timedWCs(a.cq, 1)
		r := e.one(b.cq, 2, verbs.StatusSuccess)
		if r.ByteLen != 4 || string(b.mem[:4]) != "late" {
			e.t.Fatalf("receive %+v got %q", r, b.mem[:4])
		}
	}},
}
