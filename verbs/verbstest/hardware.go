package verbstest

import (
	"errors"
	"time"

	"github.com/krfs/krfs/verbs"
)

// The rules of RDMA hardware (mlx5 and the kernel's uverbs) that the layers
// above verbs must survive: softnic enforces them, and on an RNIC these
// cases check that the rdma backend reports them as the contract says.
// Cases that need a transport timer to expire use DCIs and QPs with a
// short ACK timeout (shortAttr), so that they end well within Deadline on
// hardware too.

// shortAttr makes retries run out quickly: about 50 ms of retries on an
// RNIC (IB timeout exponent 13, one retry), 40 ms on softnic.
var shortAttr = verbs.QPAttr{Timeout: 20 * time.Millisecond, RetryCnt: 1, Mask: verbs.AttrRNRRetry, RNRRetry: 0}

// events subscribes to dev's asynchronous events until the case ends.
func (e *env) events(dev verbs.Device) <-chan verbs.Event {
	ch := make(chan verbs.Event, 1024)
	cancel := dev.OnEvent(func(ev verbs.Event) {
		select {
		case ch <- ev:
		default:
		}
	})
	e.t.Cleanup(cancel)
	return ch
}

// event waits for an event of type typ that match accepts (nil: any),
// failing after Deadline.
func (e *env) event(ch <-chan verbs.Event, typ verbs.EventType, match func(verbs.Event) bool) verbs.Event {
	e.t.Helper()
	end := time.After(Deadline)
	var seen []verbs.Event
	for {
		select {
		case ev := <-ch:
			if ev.Type == typ && (match == nil || match(ev)) {
				return ev
			}
			seen = append(seen, ev)
		case <-end:
			e.t.Fatalf("no %v event within %v (saw %v)", typ, Deadline, seen)
		}
	}
}

// isQP matches events about q.
func isQP(q verbs.QP) func(verbs.Event) bool {
	return func(ev verbs.Event) bool { return ev.QP != nil && ev.QP.QPN() == q.QPN() }
}

// shortDCI makes a DCI on n in RTS whose retries run out quickly.
func (n *node) shortDCI() verbs.QP { return n.dciWith(shortAttr) }

// recoverDCI brings a DCI in ERR back to RTS, as dct.Pool.Recover does.
func (e *env) recoverDCI(q verbs.QP, a verbs.QPAttr) {
	e.t.Helper()
	e.ok(q.Modify(verbs.QPAttr{State: verbs.StateReset}), "DCI to RESET")
	dciUp(e.t, q, a)
}

var hardwareCases = []namedCase{
	{"DCTNumberAfterRTR", func(e *env) {
		// mlx5 assigns a DCT its number in INIT->RTR: before, it has none,
		// and a number read then (and published) reaches nothing.
		if e.f.NoDC {
			e.t.Skip("verbstest: the backend has no DC transport (Fabric.NoDC)")
		}
		n := e.node()
		srq, err := n.pd.CreateSRQ(16)
		e.ok(err, "CreateSRQ")
		q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.DCT, RecvCQ: n.cq, SRQ: srq, DCKey: dcKey})
		e.ok(err, "CreateQP(DCT)")
		if num := q.QPN(); num != 0 {
			e.t.Fatalf("a DCT in RESET has number %d, want 0 (none yet)", num)
		}
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite}), "DCT to INIT")
		if num := q.QPN(); num != 0 {
			e.t.Fatalf("a DCT in INIT has number %d, want 0 (none yet)", num)
		}
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateRTR}), "DCT to RTR")
		num := q.QPN()
		if num == 0 || num > 0xffffff {
			e.t.Fatalf("a DCT in RTR has number %d", num)
		}
		// The number is the one its traffic names: a DCI reaches it.
		a := e.node()
		dci := a.dci()
		copy(n.mem[:3], "dct")
		n.sync()
		e.post(dci, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 3), RKey: n.mr.RKey(),
			Target: &verbs.DCTarget{Addr: n.dev.Addr(), DCTN: num, DCKey: dcKey}})
		e.one(a.cq, 1, verbs.StatusSuccess)
		if string(a.mem[:3]) != "dct" {
			e.t.Fatalf("READ through the DCT got %q", a.mem[:3])
		}
		// A DCT moves RESET->INIT->RTR and nowhere else: it is destroyed.
		for _, to := range []verbs.QPState{verbs.StateErr, verbs.StateReset, verbs.StateRTS} {
			if err := q.Modify(verbs.QPAttr{State: to}); !errors.Is(err, verbs.ErrTransition) {
				e.t.Fatalf("DCT RTR -> %v: %v, want ErrTransition", to, err)
			}
		}
		e.state(q, verbs.StateRTR)
		// A DCI cannot go from RESET to ERR.
		d, err := a.pd.CreateQP(verbs.QPConfig{Type: verbs.DCI, SendCQ: a.cq})
		e.ok(err, "CreateQP(DCI)")
		if err := d.Modify(verbs.QPAttr{State: verbs.StateErr}); !errors.Is(err, verbs.ErrTransition) {
			e.t.Fatalf("DCI RESET -> ERR: %v, want ErrTransition", err)
		}
	}},
	{"ResponderAfterAccessError", func(e *env) {
		// A request the responder refuses moves its RC QP to ERR too,
		// with no completion there: the device raises an access error
		// event for it.
		a, b := e.node(), e.node()
		evs := e.events(b.dev)
		qa, qb := e.connect(a, b, nil)
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey() ^ 0x5a5a00})
		e.one(a.cq, 1, verbs.StatusRemAccessErr)
		e.event(evs, verbs.EventQPAccessErr, isQP(qb))
		e.state(qb, verbs.StateErr)
		e.quiet(b.cq)
	}},
	{"ResponderAfterLengthError", func(e *env) {
		// A SEND longer than the receive buffer: the receive completes
		// with a local length error and the responder's QP is in ERR.
		a, b := e.node(), e.node()
		qa, qb := e.connect(a, b, nil)
		e.recv(qb, verbs.RecvWR{ID: 7, Local: b.sge(0, 16)})
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, Local: a.sge(0, 64)})
		if wc := e.wcs(a.cq, 1)[0]; wc.ID != 1 || wc.Status == verbs.StatusSuccess {
			e.t.Fatalf("SEND into a short buffer completed %+v, want an error", wc)
		}
		e.one(b.cq, 7, verbs.StatusLocLenErr)
		e.state(qb, verbs.StateErr)
		// Of an error completion only ID, status, QPN (and reason) are
		// defined: the suite reads nothing else.
	}},
	{"DCIThroughDownHostAndDestroyedDCT", func(e *env) {
		// A shared DCI meets a target whose host is gone and a DCT that
		// was destroyed: each WR fails (retry error, or an invalid
		// request where the NIC answers for a missing DCT), the DCI
		// recovers and serves a live target again.
		if e.f.NoDC {
			e.t.Skip("verbstest: the backend has no DC transport (Fabric.NoDC)")
		}
		a, live, gone := e.node(), e.node(), e.node()
		dct, _ := live.dct(dcKey)
		dead, _ := gone.dct(dcKey)
		dci := a.shortDCI()
		deadTarget := target(gone, dead, dcKey)
		_ = gone.dev.Close()
		e.post(dci, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: gone.mr.RKey(), Target: deadTarget})
		if wc := e.timedWCs(a.cq, 1)[0]; wc.ID != 1 || wc.Status != verbs.StatusRetryExcErr {
			e.t.Fatalf("READ from a closed host completed %+v, want a retry error", wc)
		}
		e.state(dci, verbs.StateErr)
		e.recoverDCI(dci, shortAttr)
		other, _ := live.dct(dcKey + 1)
		destroyed := target(live, other, dcKey+1)
		e.ok(other.Destroy(), "Destroy(DCT)")
		e.post(dci, verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: live.mr.RKey(), Target: destroyed})
		wc := e.timedWCs(a.cq, 1)[0]
		if wc.ID != 2 || wc.Status == verbs.StatusSuccess || wc.Status == verbs.StatusWRFlushErr {
			e.t.Fatalf("READ through a destroyed DCT completed %+v, want its error", wc)
		}
		if !e.f.InexactReasons && (wc.Status != verbs.StatusRemInvReqErr || wc.Reason != verbs.ReasonNoQP) {
			e.t.Fatalf("READ through a destroyed DCT: %v (%v), want %v (%v)", wc.Status, wc.Reason, verbs.StatusRemInvReqErr, verbs.ReasonNoQP)
		}
		e.recoverDCI(dci, shortAttr)
		copy(live.mem[:4], "live")
		live.sync()
		e.post(dci, verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 4), RKey: live.mr.RKey(), Target: target(live, dct, dcKey)})
		e.one(a.cq, 3, verbs.StatusSuccess)
		if string(a.mem[:4]) != "live" {
			e.t.Fatalf("READ after recovery got %q", a.mem[:4])
		}
	}},
	{"RNROnEmptySRQ", func(e *env) {
		// A SEND to a DCT whose SRQ holds no receive is answered with RNR
		// NAKs until the DCI's RNR retries run out; once a receive is
		// posted, the recovered DCI's SEND lands in it.
		if e.f.NoDC {
			e.t.Skip("verbstest: the backend has no DC transport (Fabric.NoDC)")
		}
		a, b := e.node(), e.node()
		dct, srq := b.dct(dcKey)
		dci := a.shortDCI()
		tgt := target(b, dct, dcKey)
		copy(a.mem[:5], "hello")
		e.post(dci, verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, Local: a.sge(0, 5), Target: tgt})
		if wc := e.timedWCs(a.cq, 1)[0]; wc.ID != 1 || wc.Status != verbs.StatusRNRRetryExcErr {
			e.t.Fatalf("SEND to an empty SRQ completed %+v, want an RNR retry error", wc)
		}
		e.state(dci, verbs.StateErr)
		e.state(dct, verbs.StateRTR) // RNR is no error of the DCT's
		e.recv(srq, verbs.RecvWR{ID: 9, Local: b.sge(0, 64)})
		e.recoverDCI(dci, shortAttr)
		e.post(dci, verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled, Local: a.sge(0, 5), Target: tgt})
		e.one(a.cq, 2, verbs.StatusSuccess)
		r := e.one(b.cq, 9, verbs.StatusSuccess)
		b.sync()
		if r.ByteLen != 5 || string(b.mem[:5]) != "hello" {
			e.t.Fatalf("SEND after a receive was posted: received %+v (%q)", r, b.mem[:5])
		}
	}},
	{"OneBadTargetFlushesTheOthers", func(e *env) {
		// KRCORE's isolation case: on a DCI shared by many peers, one WR
		// to a bad target (a wrong DC key: an mlx5 DCT drops it, so it
		// shows as a retry error there) fails, and every WR queued behind
		// it for other targets completes flushed without reaching them.
		// The owner of the bad WR learns it; the others are innocents to
		// post again once the DCI recovered, and the good target kept
		// serving other initiators all along.
		if e.f.NoDC {
			e.t.Skip("verbstest: the backend has no DC transport (Fabric.NoDC)")
		}
		a, bad, good := e.node(), e.node(), e.node()
		badDCT, _ := bad.dct(dcKey)
		goodDCT, _ := good.dct(dcKey + 1)
		dci, other := a.shortDCI(), a.dci()
		gt := target(good, goodDCT, dcKey+1)
		wrs := []verbs.SendWR{{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: bad.mr.RKey(),
			Target: target(bad, badDCT, dcKey^0xff)}}
		copy(a.mem[64:68], "none")
		for i := range 4 {
			wrs = append(wrs, verbs.SendWR{ID: uint64(2 + i), Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(64, 4),
				RemoteAddr: uint64(100 * i), RKey: good.mr.RKey(), Target: gt})
		}
		e.post(dci, wrs...)
		wcs := e.timedWCs(a.cq, 5)
		if wcs[0].ID != 1 || wcs[0].Status == verbs.StatusSuccess || wcs[0].Status == verbs.StatusWRFlushErr {
			e.t.Fatalf("the WR to the bad target completed %+v, want its error", wcs[0])
		}
		for i, wc := range wcs[1:] {
			if wc.ID != uint64(2+i) || wc.Status != verbs.StatusWRFlushErr {
				e.t.Fatalf("WR %d for another target completed %+v, want flushed in order", 2+i, wc)
			}
		}
		good.sync()
		for i := range 4 {
			if string(good.mem[100*i:100*i+4]) == "none" {
				e.t.Fatalf("flushed WR %d reached the good target", 2+i)
			}
		}
		good.sync() // the reads above happen before the NIC's later writes
		e.state(dci, verbs.StateErr)
		// The good target serves another DCI meanwhile.
		e.post(other, verbs.SendWR{ID: 10, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(64, 4), RemoteAddr: 900, RKey: good.mr.RKey(), Target: gt})
		e.one(a.cq, 10, verbs.StatusSuccess)
		// The innocents go again on the recovered DCI.
		e.recoverDCI(dci, shortAttr)
		e.post(dci, wrs[1:]...)
		for i, wc := range e.wcs(a.cq, 4) {
			if wc.ID != uint64(2+i) || wc.Status != verbs.StatusSuccess {
				e.t.Fatalf("reposted WR %d completed %+v", 2+i, wc)
			}
		}
		good.sync()
		for i := range 4 {
			if string(good.mem[100*i:100*i+4]) != "none" {
				e.t.Fatalf("reposted WR %d did not reach the good target", 2+i)
			}
		}
	}},
	{"CQOverrun", func(e *env) {
		// More completions than a CQ holds: the device raises a CQ error
		// event for it (the consumer's fault, as on hardware: a NIC may
		// round a CQ's depth up, hence many more WRs than its depth).
		a, b := e.node(), e.node()
		evs := e.events(a.dev)
		small, err := a.dev.CreateCQ(4)
		e.ok(err, "CreateCQ(4)")
		qa, err := a.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: small, RecvCQ: a.cq,
			Caps: verbs.QPCaps{MaxSendWR: 256, MaxRecvWR: 16}})
		e.ok(err, "CreateQP(RC)")
		svc := uint32(0x0c0ffee1)
		qb := b.rcQP(nil)
		e.ok(b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return qb, nil, nil }), "ListenRC")
		ctx, cancel := ctxDeadline()
		defer cancel()
		_, err = a.dev.ConnectRC(ctx, qa, b.dev.Addr(), svc, connParams)
		e.ok(err, "ConnectRC")
		var wrs []verbs.SendWR
		for i := range 128 {
			wrs = append(wrs, verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: b.mr.RKey()})
		}
		e.post(qa, wrs...)
		e.event(evs, verbs.EventCQErr, func(ev verbs.Event) bool { return ev.CQ == small })
	}},
	{"AtomicCapability", func(e *env) {
		// A device without atomics (upstream mlx5 reports atomic_cap NONE
		// unless its firmware answers atomics in host byte order) refuses
		// them at post and remote atomic access at INIT, with
		// ErrNotSupported; a device with them says which kind.
		n := e.node()
		dev := n.dev
		if a := dev.Attr().Atomic; a != verbs.AtomicNone {
			if a != verbs.AtomicHCA && a != verbs.AtomicGlob {
				e.t.Fatalf("Attr().Atomic = %v", a)
			}
			if e.f.NewDeviceWithoutAtomics == nil {
				e.t.Skipf("verbstest: the device has atomics (%v); atomics work is checked by the RC and DC cases", a)
			}
			dev = e.f.NewDeviceWithoutAtomics(e.t)
			if dev.Attr().Atomic != verbs.AtomicNone {
				e.t.Fatalf("NewDeviceWithoutAtomics made a device with atomics (%v)", dev.Attr().Atomic)
			}
		}
		pd, err := dev.AllocPD()
		e.ok(err, "AllocPD")
		cq, err := dev.CreateCQ(16)
		e.ok(err, "CreateCQ")
		mem := verbs.PageAligned(4096)
		mr, err := pd.RegMR(mem, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
		e.ok(err, "RegMR")
		q, err := pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Caps: verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16}})
		e.ok(err, "CreateQP(RC)")
		if err := q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteAtomic}); !errors.Is(err, verbs.ErrNotSupported) {
			e.t.Fatalf("RC QP to INIT with remote atomic access: %v, want ErrNotSupported", err)
		}
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite}), "INIT")
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateRTR, RemoteAddr: dev.Addr(), RemoteQPN: q.QPN()}), "RTR (to itself)")
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateRTS}), "RTS")
		e.postErr(q.PostSend([]verbs.SendWR{
			{ID: 1, Op: verbs.OpWrite, Local: verbs.SGE{MR: mr, Length: 8}, RemoteAddr: 64, RKey: mr.RKey()},
			{ID: 2, Op: verbs.OpFetchAdd, Local: verbs.SGE{MR: mr, Length: 8}, RemoteAddr: 8, RKey: mr.RKey(), CompareAdd: 1}}),
			1, verbs.ErrNotSupported)
		if !e.f.NoDC {
			srq, err := pd.CreateSRQ(4)
			e.ok(err, "CreateSRQ")
			dct, err := pd.CreateQP(verbs.QPConfig{Type: verbs.DCT, RecvCQ: cq, SRQ: srq, DCKey: dcKey})
			e.ok(err, "CreateQP(DCT)")
			if err := dct.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteAtomic}); !errors.Is(err, verbs.ErrNotSupported) {
				e.t.Fatalf("DCT to INIT with remote atomic access: %v, want ErrNotSupported", err)
			}
			// A DCI of a device without atomics can be created (it asks
			// the NIC for no atomic operations).
			dci, err := pd.CreateQP(verbs.QPConfig{Type: verbs.DCI, SendCQ: cq})
			e.ok(err, "CreateQP(DCI)")
			dciUp(e.t, dci, dciAttr)
		}
	}},
	{"MTUNegotiation", func(e *env) {
		// Two ports with different path MTUs talk at the smaller one:
		// the connection manager settles it, and multi-packet WRITE, READ
		// and SEND work both ways at it. Modify refuses a path MTU above
		// the device's or below 256.
		a, b := e.node(), e.node()
		q := a.rcQP(nil)
		e.ok(q.Modify(verbs.QPAttr{State: verbs.StateInit}), "INIT")
		for _, mtu := range []int{a.dev.MaxMTU() * 2, 128} {
			if err := q.Modify(verbs.QPAttr{State: verbs.StateRTR, RemoteAddr: b.dev.Addr(), RemoteQPN: 1, PathMTU: mtu}); !errors.Is(err, verbs.ErrInvalidArg) {
				e.t.Fatalf("RTR with path MTU %d (device max %d): %v, want ErrInvalidArg", mtu, a.dev.MaxMTU(), err)
			}
		}
		svc := uint32(0x0c0ffee3)
		qb := b.rcQP(nil)
		e.ok(b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return qb, nil, nil }), "ListenRC")
		qa := a.rcQP(nil)
		p := connParams
		p.PathMTU = 512
		ctx, cancel := ctxDeadline()
		defer cancel()
		_, err := a.dev.ConnectRC(ctx, qa, b.dev.Addr(), svc, p)
		e.ok(err, "ConnectRC(path MTU 512)")
		const n = 5000 // ten packets at 512
		fill(a.mem[:n], 3)
		fill(b.mem[2*n:3*n], 5)
		b.sync()
		e.recv(qb, verbs.RecvWR{ID: 30, Local: b.sge(3*n, n)})
		e.recv(qa, verbs.RecvWR{ID: 40, Local: a.sge(3*n, n)})
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, n), RemoteAddr: n, RKey: b.mr.RKey()},
			verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(n, n), RemoteAddr: 2 * n, RKey: b.mr.RKey()},
			verbs.SendWR{ID: 3, Op: verbs.OpSend, Flags: verbs.Signaled, Local: a.sge(0, n)})
		e.post(qb, verbs.SendWR{ID: 4, Op: verbs.OpSend, Flags: verbs.Signaled, Local: b.sge(2*n, n)},
			verbs.SendWR{ID: 5, Op: verbs.OpRead, Flags: verbs.Signaled, Local: b.sge(4*n, n), RKey: a.mr.RKey()})
		for _, x := range []struct {
			n    *node
			wcs  int
			side string
		}{{a, 4, "active"}, {b, 3, "passive"}} {
			for _, wc := range e.wcs(x.n.cq, x.wcs) {
				if wc.Status != verbs.StatusSuccess {
					e.t.Fatalf("%s side at a negotiated path MTU of 512: %+v", x.side, wc)
				}
			}
		}
		a.sync()
		b.sync()
		want := func(what string, got, src []byte) {
			if string(got) != string(src) {
				e.t.Fatalf("%s differs after a transfer at path MTU 512", what)
			}
		}
		want("WRITE", b.mem[n:2*n], a.mem[:n])
		want("READ", a.mem[n:2*n], b.mem[2*n:3*n])
		want("SEND", b.mem[3*n:4*n], a.mem[:n])
		want("SEND back", a.mem[3*n:4*n], b.mem[2*n:3*n])
		want("READ back", b.mem[4*n:5*n], a.mem[:n])
	}},
}
