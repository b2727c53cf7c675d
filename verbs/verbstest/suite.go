package verbstest

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
)

// Fabric is what a backend gives the suite.
type Fabric struct {
	// NewDevice opens a device that can reach every other device this
	// fabric opened. The fabric closes it when t ends (t.Cleanup); the
	// suite may close it earlier to make a peer unreachable, so Close must
	// be safe to call twice.
	NewDevice func(t testing.TB) verbs.Device
	// Advance moves the fabric's manual clock forward by d, firing the
	// timers that fall due. Nil means the fabric runs on real time.
	Advance func(d time.Duration)
	// NoDC says the backend has no DC transport; DC cases are skipped.
	NoDC bool
	// A device that has a SyncMemory() method gets it called around the
	// suite's direct accesses to memory a remote peer reads or writes.
	//
	// InexactReasons says error completions may carry ReasonNone, and a
	// DC key or DCT-number mismatch may surface as a transport error, as
	// on hardware (see the package doc).
	InexactReasons bool
	// DCTSourceUnknown says a receive completion on a DCT does not name
	// the sender's device address (WC.SrcAddr), as on mlx5, where only
	// the DCI's QPN is reported. No layer above relies on it.
	DCTSourceUnknown bool
	// NewDeviceWithoutAtomics, if not nil, opens a device of the fabric
	// whose Attr().Atomic is AtomicNone (softnic.Config.NoAtomics), for
	// the case that checks what such a device refuses; a backend whose
	// devices have atomics and cannot be told otherwise leaves it nil.
	NewDeviceWithoutAtomics func(t testing.TB) verbs.Device
}

// Deadline bounds every wait of the suite for something that must happen.
const Deadline = 30 * time.Second

// env is one case's view of the fabric.
type env struct {
	t *testing.T
	f Fabric
}

// Run runs every case of the suite against f, each as a subtest.
func Run(t *testing.T, f Fabric) {
	if f.NewDevice == nil {
		t.Fatal("verbstest: Fabric.NewDevice is nil")
	}
	groups := []struct {
		name  string
		cases []namedCase
	}{
		{"QP", qpCases},
		{"MR", mrCases},
		{"RC", rcCases},
		{"DC", dcCases},
		{"Errors", errorCases},
		{"CQ", cqCases},
		{"SRQ", srqCases},
		{"CM", cmCases},
		{"Hardware", hardwareCases},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					if g.name == "DC" && f.NoDC {
						t.Skip("verbstest: the backend has no DC transport (Fabric.NoDC)")
					}
					c.run(&env{t: t, f: f})
				})
			}
		})
	}
}

type namedCase struct {
	name string
	run  func(e *env)
}

// node is a device with a PD, one CQ for everything and 1 MiB of memory
// registered with all access.
type node struct {
	e   *env
	dev verbs.Device
	pd  verbs.PD
	cq  verbs.CQ
	mem []byte
	mr  verbs.MR
}

const memSize = 1 << 20

func (e *env) node() *node {
	t := e.t
	t.Helper()
	dev := e.f.NewDevice(t)
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	cq, err := dev.CreateCQ(4096)
	if err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	mem := verbs.PageAligned(memSize) // zero-based: the suite addresses it by offsets
	mr, err := pd.RegMR(mem, verbs.AccessAll)
	if err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	return &node{e: e, dev: dev, pd: pd, cq: cq, mem: mem, mr: mr}
}

// sync orders the test goroutine's accesses to n's memory with the
// device's, for backends whose NIC is a goroutine the race detector sees
// (softnic's SyncMemory); hardware needs nothing.
func (n *node) sync() {
	if s, ok := n.dev.(interface{ SyncMemory() }); ok {
		s.SyncMemory()
	}
}

func (n *node) sge(off uint64, l uint32) verbs.SGE {
	return verbs.SGE{MR: n.mr, Offset: off, Length: l}
}

func (n *node) rcQP(srq verbs.SRQ) verbs.QP {
	n.e.t.Helper()
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: n.cq, RecvCQ: n.cq, SRQ: srq,
		Caps: verbs.QPCaps{MaxSendWR: 256, MaxRecvWR: 256, MaxInline: 256, MaxRdAtomic: 16}})
	if err != nil {
		n.e.t.Fatalf("CreateQP(RC): %v", err)
	}
	return q
}

// connParams are the RC parameters of the suite's connections: a long
// ACK timeout so that a busy machine never exhausts retries.
var connParams = verbs.ConnParams{Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic,
	Timeout: 2 * time.Second, RetryCnt: 7, RNRRetry: 7}

// connect connects a fresh RC QP on a to a fresh RC QP on b through the
// connection manager; b's QP uses srq if not nil.
func (e *env) connect(a, b *node, srq verbs.SRQ) (qa, qb verbs.QP) {
	e.t.Helper()
	svc := rand.Uint32() | 1
	qb = b.rcQP(srq)
	if err := b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return qb, nil, nil }); err != nil {
		e.t.Fatalf("ListenRC: %v", err)
	}
	qa = a.rcQP(nil)
	ctx, cancel := context.WithTimeout(context.Background(), Deadline)
	defer cancel()
	if _, err := a.dev.ConnectRC(ctx, qa, b.dev.Addr(), svc, connParams); err != nil {
		e.t.Fatalf("ConnectRC: %v", err)
	}
	if err := b.dev.StopListenRC(svc); err != nil {
		e.t.Fatalf("StopListenRC: %v", err)
	}
	return qa, qb
}

// manual connects a fresh RC QP on a to a fresh RC QP on b by hand with
// Modify (no connection manager), a's RTS taking the timeouts and retry
// counts of rts (hardware cannot change them later, in RTS).
func (e *env) manual(a, b *node, rts verbs.QPAttr) (qa, qb verbs.QP) {
	e.t.Helper()
	qa, qb = a.rcQP(nil), b.rcQP(nil)
	all := verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
	for _, p := range []struct {
		q, peer verbs.QP
		to      *node
		rts     verbs.QPAttr
	}{{qa, qb, b, rts}, {qb, qa, a, verbs.QPAttr{Timeout: connParams.Timeout, RetryCnt: 7, RNRRetry: 7}}} {
		e.ok(p.q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: all}), "INIT")
		e.ok(p.q.Modify(verbs.QPAttr{State: verbs.StateRTR, RemoteAddr: p.to.dev.Addr(), RemoteQPN: p.peer.QPN(), RQPSN: 100}), "RTR")
		p.rts.State, p.rts.SQPSN = verbs.StateRTS, 100
		e.ok(p.q.Modify(p.rts), "RTS")
	}
	return qa, qb
}

// dct makes a DCT on n with its own SRQ, in RTR, granting all remote access.
func (n *node) dct(key uint64) (verbs.QP, verbs.SRQ) {
	t := n.e.t
	t.Helper()
	srq, err := n.pd.CreateSRQ(256)
	if err != nil {
		t.Fatalf("CreateSRQ: %v", err)
	}
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.DCT, RecvCQ: n.cq, SRQ: srq, DCKey: key})
	if err != nil {
		t.Fatalf("CreateQP(DCT): %v", err)
	}
	if err := q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic}); err != nil {
		t.Fatalf("DCT to INIT: %v", err)
	}
	if err := q.Modify(verbs.QPAttr{State: verbs.StateRTR}); err != nil {
		t.Fatalf("DCT to RTR: %v", err)
	}
	return q, srq
}

// dciAttr are the attributes of the suite's DCIs.
var dciAttr = verbs.QPAttr{Timeout: 2 * time.Second, RetryCnt: 7, RNRRetry: 7}

// dci makes a DCI on n in RTS.
func (n *node) dci() verbs.QP { return n.dciWith(dciAttr) }

// dciWith makes a DCI on n in RTS with the timeouts and retry counts of a.
func (n *node) dciWith(a verbs.QPAttr) verbs.QP {
	t := n.e.t
	t.Helper()
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.DCI, SendCQ: n.cq, Caps: verbs.QPCaps{MaxSendWR: 256, MaxInline: 256, MaxRdAtomic: 16}})
	if err != nil {
		t.Fatalf("CreateQP(DCI): %v", err)
	}
	dciUp(t, q, a)
	return q
}

func dciUp(t *testing.T, q verbs.QP, a verbs.QPAttr) {
	t.Helper()
	for _, st := range []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		a.State = st
		if err := q.Modify(a); err != nil {
			t.Fatalf("DCI to %v: %v", st, err)
		}
	}
}

func target(n *node, dct verbs.QP, key uint64) *verbs.DCTarget {
	return &verbs.DCTarget{Addr: n.dev.Addr(), DCTN: dct.QPN(), DCKey: key}
}

// post posts wrs and fails the case on error.
func (e *env) post(q verbs.QP, wrs ...verbs.SendWR) {
	e.t.Helper()
	if err := q.PostSend(wrs); err != nil {
		e.t.Fatalf("PostSend: %v", err)
	}
}

func (e *env) recv(q interface{ PostRecv([]verbs.RecvWR) error }, wrs ...verbs.RecvWR) {
	e.t.Helper()
	if err := q.PostRecv(wrs); err != nil {
		e.t.Fatalf("PostRecv: %v", err)
	}
}

// wcs collects exactly want completions from cq, failing after Deadline.
// It only waits: what it waits for must not need a timer to expire.
func (e *env) wcs(cq verbs.CQ, want int) []verbs.WC {
	e.t.Helper()
	return e.collect(cq, want, false)
}

// timedWCs collects want completions that need protocol timers to expire
// (retries, RNR waits): on a manual clock it advances time while waiting.
func (e *env) timedWCs(cq verbs.CQ, want int) []verbs.WC {
	e.t.Helper()
	return e.collect(cq, want, true)
}

func (e *env) collect(cq verbs.CQ, want int, timed bool) []verbs.WC {
	e.t.Helper()
	out := make([]verbs.WC, 0, want)
	buf := make([]verbs.WC, 64)
	end := time.Now().Add(Deadline)
	for len(out) < want {
		n := cq.Poll(buf[:min(len(buf), want-len(out))])
		out = append(out, buf[:n]...)
		if n > 0 {
			continue
		}
		if time.Now().After(end) {
			e.t.Fatalf("waited %v for %d completions, got %d: %+v", Deadline, want, len(out), out)
		}
		wait := time.Until(end)
		if timed && e.f.Advance != nil {
			e.f.Advance(50 * time.Millisecond)
			wait = 5 * time.Millisecond // a poll interval, not a deadline
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		_ = cq.Wait(ctx)
		cancel()
	}
	return out
}

// one collects one completion and checks its ID and status.
func (e *env) one(cq verbs.CQ, id uint64, st verbs.Status) verbs.WC {
	e.t.Helper()
	wc := e.wcs(cq, 1)[0]
	if wc.ID != id || wc.Status != st {
		e.t.Fatalf("completion %+v (%v), want WR %d with %v", wc, wc.Err(), id, st)
	}
	return wc
}

// quiet checks that cq holds no completion now.
func (e *env) quiet(cq verbs.CQ) {
	e.t.Helper()
	var wc [1]verbs.WC
	if cq.Poll(wc[:]) != 0 {
		e.t.Fatalf("unexpected completion %+v", wc[0])
	}
}

// reason checks an error completion's reason (relaxed for backends with
// inexact reasons).
func (e *env) reason(wc verbs.WC, want verbs.Reason) {
	e.t.Helper()
	if wc.Reason == want || (e.f.InexactReasons && wc.Reason == verbs.ReasonNone) {
		return
	}
	e.t.Fatalf("completion %+v has reason %v, want %v", wc, wc.Reason, want)
}

// postErr checks that err is a *verbs.PostError at index with cause want.
func (e *env) postErr(err error, index int, want error) {
	e.t.Helper()
	var pe *verbs.PostError
	if !errors.As(err, &pe) || pe.Index != index || !errors.Is(err, want) {
		e.t.Fatalf("post error %v, want %v at WR %d", err, want, index)
	}
}

func (e *env) state(q verbs.QP, want verbs.QPState) {
	e.t.Helper()
	if s := q.State(); s != want {
		e.t.Fatalf("QP %d in %v, want %v", q.QPN(), s, want)
	}
}

func (e *env) ok(err error, what string) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// unreachable returns the address of a device that was closed: nothing
// answers there.
func (e *env) unreachable() netip.AddrPort {
	d := e.f.NewDevice(e.t)
	addr := d.Addr()
	_ = d.Close()
	return addr
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}
