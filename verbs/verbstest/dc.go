package verbstest

import (
	"errors"

	"github.com/krfs/krfs/verbs"
)

const dcKey = 0x6b72667364634b59

var dcCases = []namedCase{
	{"Operations", func(e *env) {
		a, b := e.node(), e.node()
		dct, srq := b.dct(dcKey)
		dci := a.dci()
		tgt := target(b, dct, dcKey)
		opsOver(e, a, b, func(wrs ...verbs.SendWR) {
			for i := range wrs {
				wrs[i].Target = tgt
			}
			e.post(dci, wrs...)
		}, srq, dci.QPN(), !e.f.DCTSourceUnknown)
	}},
	{"StateMachine", func(e *env) {
		n := e.node()
		dct, _ := n.dct(dcKey)
		e.state(dct, verbs.StateRTR)
		if dct.Type() != verbs.DCT {
			e.t.Fatalf("DCT reports type %v", dct.Type())
		}
		if err := dct.Modify(verbs.QPAttr{State: verbs.StateRTS}); !errors.Is(err, verbs.ErrTransition) {
			e.t.Fatalf("DCT to RTS: %v, want ErrTransition", err)
		}
		// A DCT has no send queue (refused as a wrong opcode or state).
		if err := dct.PostSend([]verbs.SendWR{{Op: verbs.OpWrite, Local: n.sge(0, 8)}}); !errors.Is(err, verbs.ErrOpcode) && !errors.Is(err, verbs.ErrQPState) {
			e.t.Fatalf("PostSend on a DCT: %v, want ErrOpcode or ErrQPState", err)
		}
		if _, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.DCT, RecvCQ: n.cq, DCKey: 1}); err == nil {
			e.t.Fatal("a DCT without an SRQ was created")
		}
		dci := n.dci()
		e.state(dci, verbs.StateRTS)
		if dci.Type() != verbs.DCI {
			e.t.Fatalf("DCI reports type %v", dci.Type())
		}
		e.postErr(dci.PostSend([]verbs.SendWR{{Op: verbs.OpWrite, Flags: verbs.Signaled, Local: n.sge(0, 8), RKey: n.mr.RKey()}}),
			0, verbs.ErrNoTarget)
		e.postErr(dci.PostRecv([]verbs.RecvWR{{Local: n.sge(0, 8)}}), 0, verbs.ErrOpcode)
	}},
	{"OneDCIManyTargets", func(e *env) {
		// qpcore's DCIs: WRs for different targets interleave on one DCI
		// and each reaches its own target.
		a, b, c := e.node(), e.node(), e.node()
		db, _ := b.dct(dcKey)
		dc, _ := c.dct(dcKey + 1)
		dci := a.dci()
		tb, tc := target(b, db, dcKey), target(c, dc, dcKey+1)
		var wrs []verbs.SendWR
		for i := range 8 {
			tgt, rk := tb, b.mr.RKey()
			if i%2 == 1 {
				tgt, rk = tc, c.mr.RKey()
			}
			a.mem[i] = byte('a' + i)
			wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(uint64(i), 1),
				RemoteAddr: uint64(i), RKey: rk, Target: tgt})
		}
		e.post(dci, wrs...)
		for i, wc := range e.wcs(a.cq, 8) {
			if wc.ID != uint64(i) || wc.Status != verbs.StatusSuccess {
				e.t.Fatalf("completion %d: %+v, want WR %d in order with success", i, wc, i)
			}
		}
		b.sync()
		c.sync()
		for i := range 8 {
			mem := b.mem
			if i%2 == 1 {
				mem = c.mem
			}
			if mem[i] != byte('a'+i) {
				e.t.Fatalf("WRITE %d did not reach its target", i)
			}
		}
	}},
	{"KeyRejected", func(e *env) {
		a, b := e.node(), e.node()
		dct, _ := b.dct(dcKey)
		bad, good := a.dci(), a.dci()
		copy(b.mem[:4], "safe")
		b.sync()
		copy(a.mem[:4], "evil")
		e.post(bad, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Local: a.sge(0, 4), RKey: b.mr.RKey(), Target: target(b, dct, dcKey^1)},
			verbs.SendWR{ID: 2, Op: verbs.OpRead, Local: a.sge(100, 4), RKey: b.mr.RKey(), Target: target(b, dct, dcKey^1)})
		wcs := e.timedWCs(a.cq, 2)
		if wcs[0].ID != 1 || wcs[0].Status == verbs.StatusSuccess || wcs[0].Status == verbs.StatusWRFlushErr {
			e.t.Fatalf("WRITE with a wrong DC key (unsignaled) completed %+v, want its error", wcs[0])
		}
		if !e.f.InexactReasons && wcs[0].Status != verbs.StatusRemInvReqErr {
			e.t.Fatalf("wrong DC key: status %v, want %v", wcs[0].Status, verbs.StatusRemInvReqErr)
		}
		e.reason(wcs[0], verbs.ReasonDCKey)
		if wcs[1].ID != 2 || wcs[1].Status != verbs.StatusWRFlushErr {
			e.t.Fatalf("WR after the rejected one completed %+v, want flushed", wcs[1])
		}
		e.state(bad, verbs.StateErr)
		b.sync()
		if string(b.mem[:4]) != "safe" {
			e.t.Fatal("a WRITE with a wrong DC key changed memory")
		}
		// The DCT is shared: it still serves initiators with the key.
		e.state(dct, verbs.StateRTR)
		e.post(good, verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(100, 4), RKey: b.mr.RKey(), Target: target(b, dct, dcKey)})
		e.one(a.cq, 3, verbs.StatusSuccess)
		if string(a.mem[100:104]) != "safe" {
			e.t.Fatalf("READ after a rejection got %q", a.mem[100:104])
		}
		if info := dct.Info(); info.Stats.DCKeyRejects == 0 && !e.f.InexactReasons {
			e.t.Fatalf("DCT counted no DC key rejection: %+v", info.Stats)
		}
	}},
	{"UnknownDCT", func(e *env) {
		a, b := e.node(), e.node()
		dct, _ := b.dct(dcKey)
		dci := a.dci()
		tgt := target(b, dct, dcKey)
		tgt.DCTN ^= 0x5a5a
		e.post(dci, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey(), Target: tgt})
		wc := e.timedWCs(a.cq, 1)[0]
		if wc.ID != 1 || wc.Status == verbs.StatusSuccess {
			e.t.Fatalf("READ from an unknown DCT completed %+v, want an error", wc)
		}
		if !e.f.InexactReasons && wc.Status != verbs.StatusRemInvReqErr {
			e.t.Fatalf("unknown DCT: status %v, want %v", wc.Status, verbs.StatusRemInvReqErr)
		}
		e.reason(wc, verbs.ReasonNoQP)
	}},
	{"RecoverThroughReset", func(e *env) {
		// dct.Pool.Recover: a DCI in ERR goes RESET, INIT, RTR, RTS and
		// works again, also towards the target that failed it.
		a, b := e.node(), e.node()
		dct, _ := b.dct(dcKey)
		dci := a.dci()
		e.post(dci, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey() ^ 0xff00, Target: target(b, dct, dcKey)})
		wc := e.timedWCs(a.cq, 1)[0]
		if wc.Status != verbs.StatusRemAccessErr {
			e.t.Fatalf("READ with a bad rkey: %+v, want remote access error", wc)
		}
		e.reason(wc, verbs.ReasonRKey)
		e.state(dci, verbs.StateErr)
		e.ok(dci.Modify(verbs.QPAttr{State: verbs.StateReset}), "DCI to RESET")
		dciUp(e.t, dci, dciAttr)
		copy(b.mem[:2], "ok")
		b.sync()
		e.post(dci, verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 2), RKey: b.mr.RKey(), Target: target(b, dct, dcKey)})
		e.one(a.cq, 2, verbs.StatusSuccess)
		if string(a.mem[:2]) != "ok" {
			e.t.Fatal("READ after recovery returned wrong bytes")
		}
	}},
}
