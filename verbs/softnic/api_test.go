package softnic_test

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

func TestBadInput(t *testing.T) {
	checkLeaks(t)
	fb := newFabric(t, "fake", faults{})
	a, b := fb.node(), fb.node()
	other := fb.node()
	qa, _ := connect(t, a, b, 0)
	rk := b.mr.RKey()
	dead, err := a.pd.RegMR(make([]byte, 64), verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.Dereg(); err != nil {
		t.Fatal(err)
	}
	noWrite, err := a.pd.RegMR(make([]byte, 64), verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		wr   verbs.SendWR
		want error
	}{
		{"unregistered buffer", verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{Length: 8}, RKey: rk}, verbs.ErrNoMR},
		{"deregistered MR", verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: dead, Length: 8}, RKey: rk}, verbs.ErrMRDead},
		{"MR of another device", verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: other.mr, Length: 8}, RKey: rk}, verbs.ErrNoMR},
		{"zero length READ", verbs.SendWR{Op: verbs.OpRead, Local: sge(a, 0, 0), RKey: rk}, verbs.ErrLength},
		{"oversized", verbs.SendWR{Op: verbs.OpWrite, Local: sge(a, 0, softnic.MaxMsgSize+1), RKey: rk}, verbs.ErrLength},
		{"out of MR bounds", verbs.SendWR{Op: verbs.OpWrite, Local: sge(a, memSize-4, 8), RKey: rk}, verbs.ErrBounds},
		{"READ into a read-only MR", verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: noWrite, Length: 8}, RKey: rk}, verbs.ErrAccess},
		{"misaligned atomic", verbs.SendWR{Op: verbs.OpFetchAdd, Local: sge(a, 0, 8), RemoteAddr: 12, RKey: rk}, verbs.ErrAlign},
		{"atomic sink not 8 bytes", verbs.SendWR{Op: verbs.OpCmpSwap, Local: sge(a, 0, 4), RemoteAddr: 8, RKey: rk}, verbs.ErrLength},
		{"inline too long", verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, InlineData: make([]byte, 5000)}, verbs.ErrLength},
		{"unknown opcode", verbs.SendWR{Op: verbs.OpRecv, Local: sge(a, 0, 8)}, verbs.ErrOpcode},
	}
	for _, c := range cases {
		err := qa.PostSend([]verbs.SendWR{c.wr})
		var pe *verbs.PostError
		if !errors.Is(err, c.want) || !errors.As(err, &pe) || pe.Index != 0 {
			t.Errorf("%s: PostSend error %v, want %v at WR 0", c.name, err, c.want)
		}
	}
	// A bad WR in the middle of a batch: the ones before it are posted.
	err = qa.PostSend([]verbs.SendWR{
		{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: rk},
		{ID: 2, Op: verbs.OpFetchAdd, Local: sge(a, 0, 8), RemoteAddr: 3, RKey: rk},
		{ID: 3, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: rk},
	})
	var pe *verbs.PostError
	if !errors.As(err, &pe) || pe.Index != 1 || !errors.Is(err, verbs.ErrAlign) {
		t.Fatalf("batch error %v, want misaligned atomic at WR 1", err)
	}
	if wcs := poll(t, a.cq, 1, 5*time.Second); wcs[0].ID != 1 || wcs[0].Err() != nil {
		t.Fatalf("WR before the bad one: %+v", wcs[0])
	}
	if n := a.cq.Poll(make([]verbs.WC, 4)); n != 0 {
		t.Fatalf("%d completions for WRs after the bad one", n)
	}
	if qa.State() != verbs.StateRTS {
		t.Fatalf("a rejected post changed the QP state to %v", qa.State())
	}

	// Wrong QP state.
	fresh := a.rcQP()
	if err := fresh.PostSend([]verbs.SendWR{{Op: verbs.OpWrite, Local: sge(a, 0, 8), RKey: rk}}); !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("post in RESET: %v", err)
	}
	if err := fresh.Modify(verbs.QPAttr{State: verbs.StateRTS}); !errors.Is(err, verbs.ErrTransition) {
		t.Errorf("RESET -> RTS: %v", err)
	}
	if err := fresh.Modify(verbs.QPAttr{State: verbs.StateInit}); err != nil {
		t.Fatal(err)
	}
	if err := fresh.Modify(verbs.QPAttr{State: verbs.StateRTR}); !errors.Is(err, verbs.ErrInvalidArg) {
		t.Errorf("RC RTR without a remote: %v", err)
	}
	if err := fresh.Modify(verbs.QPAttr{State: verbs.StateInit, PathMTU: 100}); !errors.Is(err, verbs.ErrInvalidArg) {
		t.Errorf("MTU 100: %v", err)
	}
	// A full send queue refuses instead of overflowing.
	small, err := a.pd.CreateQP(verbs.QPConfig{Type: verbs.DCI, SendCQ: a.cq, Caps: verbs.QPCaps{MaxSendWR: 2}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		if err := small.Modify(verbs.QPAttr{State: st}); err != nil {
			t.Fatal(err)
		}
	}
	nowhere := &verbs.DCTarget{Addr: netip.MustParseAddrPort("127.0.0.1:9"), DCTN: 5, DCKey: 1}
	wr := verbs.SendWR{Op: verbs.OpWrite, Local: sge(a, 0, 8), RKey: 1, Target: nowhere}
	if err := small.PostSend([]verbs.SendWR{wr, wr, wr}); !errors.Is(err, verbs.ErrQueueFull) {
		t.Errorf("third WR on a 2-deep queue: %v", err)
	}
	if free := small.SendQueueFree(); free != 0 {
		t.Errorf("SendQueueFree = %d, want 0", free)
	}
	if err := small.PostSend([]verbs.SendWR{{Op: verbs.OpWrite, Local: sge(a, 0, 8), RKey: 1}}); !errors.Is(err, verbs.ErrQueueFull) && !errors.Is(err, verbs.ErrNoTarget) {
		t.Errorf("DCI WR without target: %v", err)
	}
	// Registration errors.
	if _, err := a.pd.RegMR(nil, verbs.AccessAll); !errors.Is(err, verbs.ErrLength) {
		t.Errorf("RegMR(nil): %v", err)
	}
	if _, err := a.pd.RegMR(make([]byte, 8), verbs.AccessRemoteWrite); !errors.Is(err, verbs.ErrInvalidArg) {
		t.Errorf("remote write without local write: %v", err)
	}
	// Keys are not sequential.
	k1, _ := a.pd.RegMR(make([]byte, 8), verbs.AccessAll)
	k2, _ := a.pd.RegMR(make([]byte, 8), verbs.AccessAll)
	if d := int64(k2.RKey()) - int64(k1.RKey()); d >= -16 && d <= 16 {
		t.Errorf("consecutive rkeys %#x and %#x are guessable", k1.RKey(), k2.RKey())
	}
	// DCI without target.
	dci := a.dci(0)
	if err := dci.PostSend([]verbs.SendWR{{Op: verbs.OpWrite, Local: sge(a, 0, 8), RKey: 1}}); !errors.Is(err, verbs.ErrNoTarget) {
		t.Errorf("DCI WR without target: %v", err)
	}
}

// TestMalformedPackets sends garbage at a device over the fake and over a
// real UDP socket: it is dropped and counted, and the device keeps working.
func TestMalformedPackets(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		a, b := fb.node(), fb.node()
		qa, _ := connect(t, a, b, 0)
		garbage := [][]byte{
			{},
			{0x4b},
			[]byte("hello, this is not RDMA"),
			append([]byte{wire.Magic, wire.Version, 200, 0}, make([]byte, 40)...),
			append([]byte{wire.Magic, wire.Version, byte(wire.OpReadReq), 0}, make([]byte, 8)...),
			bytes.Repeat([]byte{0xff}, 1000),
		}
		before := b.dev.Stats().Malformed
		if fb.net != nil {
			for _, g := range garbage {
				fb.net.Inject(a.dev.Addr(), b.dev.Addr(), g)
			}
		} else {
			c, err := net.Dial("udp", b.dev.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range garbage {
				if _, err := c.Write(g); err != nil {
					t.Fatal(err)
				}
			}
			c.Close()
		}
		// The device still serves a READ, and counted the garbage (the
		// empty datagram may be dropped by the link before the engine).
		deadline := time.Now().Add(pollGuard)
		for b.dev.Stats().Malformed-before < uint64(len(garbage)-1) {
			if time.Now().After(deadline) {
				t.Fatalf("malformed counted %d, want at least %d", b.dev.Stats().Malformed-before, len(garbage)-1)
			}
			time.Sleep(time.Millisecond)
		}
		post(t, qa, verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 64), RKey: b.mr.RKey()})
		if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Err() != nil {
			t.Fatal(wc.Err())
		}
	})
}

// TestPSNWrap connects two RC QPs by hand with start PSNs just below 2^24
// and runs traffic across the wrap under loss.
func TestPSNWrap(t *testing.T) {
	forEachFabric(t, faults{drop: 0.1, dup: 0.05, reorder: 0.05}, func(t *testing.T, fb *fabric) {
		a, b := fb.node(), fb.node()
		qa, qb := a.rcQP(), b.rcQP()
		const start = 1<<24 - 40
		steps := []struct {
			q      verbs.QP
			peer   *node
			peerQP verbs.QP
		}{{qa, b, qb}, {qb, a, qa}}
		for _, s := range steps {
			for _, attr := range []verbs.QPAttr{
				{State: verbs.StateInit, Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic},
				{State: verbs.StateRTR, RemoteAddr: s.peer.dev.Addr(), RemoteQPN: s.peerQP.QPN(), RQPSN: start},
				{State: verbs.StateRTS, SQPSN: start, Timeout: lossyTimeout},
			} {
				if err := s.q.Modify(attr); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range a.mem[:1<<16] {
			a.mem[i] = byte(i * 13)
		}
		a.dev.SyncMemory()
		// 100 rounds of a 3-packet WRITE and a READ back: ~400 PSNs, across
		// the wrap, with go-back-N around it.
		mtu := uint64(a.dev.MTU())
		for r := uint64(0); r < 100; r++ {
			n := uint32(2*mtu + 17)
			post(t, qa,
				verbs.SendWR{ID: 2 * r, Op: verbs.OpWrite, Local: sge(a, r*64, n), RemoteAddr: r * 64, RKey: b.mr.RKey()},
				verbs.SendWR{ID: 2*r + 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 1<<17, n), RemoteAddr: r * 64, RKey: b.mr.RKey()})
			if wc := poll(t, a.cq, 1, 10*time.Second)[0]; wc.Err() != nil {
				t.Fatalf("round %d: %v", r, wc.Err())
			}
			if !bytes.Equal(a.mem[1<<17:1<<17+n], a.mem[r*64:r*64+uint64(n)]) {
				t.Fatalf("round %d: READ after WRITE across the PSN wrap returned wrong bytes", r)
			}
		}
		if psn := qa.Info().SQPSN; psn >= start {
			t.Fatalf("send PSN %d did not wrap", psn)
		}
	})
}

// TestRNR: a SEND with no receive posted is answered with RNR NAKs until a
// receive is posted; with a finite RNR retry count it fails.
func TestRNR(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		a, b := fb.node(), fb.node()
		qa, qb := connect(t, a, b, 0)
		post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.Signaled, Local: sge(a, 0, 100)})
		deadline := time.Now().Add(pollGuard)
		for qb.Info().Stats.RNRNAKSent < 2 {
			if time.Now().After(deadline) {
				t.Fatal("no RNR NAKs sent")
			}
			time.Sleep(time.Millisecond)
		}
		if err := qb.PostRecv([]verbs.RecvWR{{ID: 5, Local: sge(b, 0, 128)}}); err != nil {
			t.Fatal(err)
		}
		if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Err() != nil {
			t.Fatalf("SEND after RNR: %v", wc.Err())
		}
		if wc := poll(t, b.cq, 1, 5*time.Second)[0]; wc.ID != 5 || wc.ByteLen != 100 {
			t.Fatalf("receive: %+v", wc)
		}
		// RNR retry 0 (set through the mask): the first RNR NAK fails it.
		qz := a.rcQP()
		qbz := b.rcQP()
		if err := b.dev.ListenRC(778, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return qbz, nil, nil }); err != nil {
			t.Fatal(err)
		}
		// A long ACK timeout: the RNR NAK, not a starved ACK timer, must
		// end the SEND.
		if _, err := a.dev.ConnectRC(t.Context(), qz, b.dev.Addr(), 778, verbs.ConnParams{Timeout: patientTimeout}); err != nil {
			t.Fatal(err)
		}
		if err := qz.Modify(verbs.QPAttr{State: verbs.StateRTS, Mask: verbs.AttrRNRRetry, RNRRetry: 0}); err != nil {
			t.Fatal(err)
		}
		post(t, qz, verbs.SendWR{ID: 8, Op: verbs.OpSend, Local: sge(a, 0, 10)})
		if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Status != verbs.StatusRNRRetryExcErr || qbz.Info().Stats.RNRNAKSent != 1 {
			t.Fatalf("RNR retry 0: %+v after %d RNR NAKs", wc, qbz.Info().Stats.RNRNAKSent)
		}
		// Finite RNR retry.
		qa2, _ := a.rcQP(), 0
		svc := uint32(777)
		qb2 := b.rcQP()
		if err := b.dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return qb2, nil, nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := a.dev.ConnectRC(t.Context(), qa2, b.dev.Addr(), svc, verbs.ConnParams{RNRRetry: 2, Timeout: patientTimeout}); err != nil {
			t.Fatal(err)
		}
		post(t, qa2, verbs.SendWR{ID: 9, Op: verbs.OpSend, Local: sge(a, 0, 10)})
		if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Status != verbs.StatusRNRRetryExcErr {
			t.Fatalf("finite RNR retry: %+v", wc)
		}
	})
}

// TestDeadPeer: a peer that stops answering fails outstanding WRs with
// RETRY_EXC_ERR after about Timeout x (RetryCnt+1), never hangs.
func TestDeadPeer(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		a, b := fb.node(), fb.node()
		qa, _ := connect(t, a, b, 5*time.Millisecond)
		b.dev.Close()
		start := time.Now()
		post(t, qa,
			verbs.SendWR{ID: 1, Op: verbs.OpRead, Local: sge(a, 0, 8), RKey: b.mr.RKey()},
			verbs.SendWR{ID: 2, Op: verbs.OpWrite, Local: sge(a, 0, 8), RKey: b.mr.RKey()})
		wcs := poll(t, a.cq, 2, 5*time.Second)
		if wcs[0].Status != verbs.StatusRetryExcErr || wcs[0].Reason != verbs.ReasonRemoteDown || wcs[1].Status != verbs.StatusWRFlushErr {
			t.Fatalf("dead peer: %+v", wcs)
		}
		// Not before 8 timeouts of 5 ms; how much later depends on the
		// machine's load (poll's guard catches a hang).
		if el := time.Since(start); el < 30*time.Millisecond {
			t.Fatalf("failed after %v; want about 8 x 5ms", el)
		}
		if qa.State() != verbs.StateErr {
			t.Fatalf("QP in %v", qa.State())
		}
	})
}

func TestConnectErrors(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		a, b := fb.node(), fb.node()
		q := a.rcQP()
		_, err := a.dev.ConnectRC(t.Context(), q, b.dev.Addr(), 12345, verbs.ConnParams{})
		if !errors.Is(err, verbs.ErrCMRejected) {
			t.Fatalf("connect to a service nobody listens on: %v", err)
		}
		if q.State() != verbs.StateReset {
			t.Fatalf("QP left in %v after a failed connect", q.State())
		}
		if err := b.dev.ListenRC(1, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
			return nil, nil, errors.New("go away")
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.dev.ConnectRC(t.Context(), q, b.dev.Addr(), 1, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMRejected) || !bytes.Contains([]byte(err.Error()), []byte("go away")) {
			t.Fatalf("refused accept: %v", err)
		}
		b.dev.Close()
		ctx, cancel := contextWithTimeout(100 * time.Millisecond)
		defer cancel()
		if _, err := a.dev.ConnectRC(ctx, q, b.dev.Addr(), 1, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMTimeout) {
			t.Fatalf("connect to a closed device: %v", err)
		}
	})
}

// TestDeregDuringRead: an MR deregistered while a READ into it is in
// flight is never written, and the READ fails with a local protection
// error (issue found by the meta service's tests).
func TestDeregDuringRead(t *testing.T) {
	checkLeaks(t)
	fb := newFabric(t, "fake", faults{})
	fb.net.SetFilter(func(_, _ netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if h.Op == wire.OpReadResp {
			return softnictest.Delay(50 * time.Millisecond)
		}
		return softnictest.Pass
	})
	a, b := fb.node(), fb.node()
	qa, _ := connect(t, a, b, 0)
	copy(b.mem, "remote bytes")
	b.dev.SyncMemory()
	dst := make([]byte, 64)
	lmr, err := a.pd.RegMR(dst, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	post(t, qa, verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, Local: verbs.SGE{MR: lmr, Length: 64}, RKey: b.mr.RKey()})
	if err := lmr.Dereg(); err != nil {
		t.Fatal(err)
	}
	wc := poll(t, a.cq, 1, 5*time.Second)[0]
	if wc.Status != verbs.StatusLocProtErr {
		t.Fatalf("READ into a deregistered MR: %+v", wc)
	}
	a.dev.SyncMemory()
	if bytes.Contains(dst, []byte("remote")) {
		t.Fatal("the NIC wrote into memory after its MR was deregistered")
	}
	if err := b.dev.StopListenRC(12345); !errors.Is(err, verbs.ErrInvalidArg) {
		t.Fatalf("StopListenRC of an unknown service: %v", err)
	}
}
