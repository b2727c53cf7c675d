package softnic_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
)

// forEachFabric runs f over the fake network and over real UDP.
func forEachFabric(t *testing.T, fl faults, f func(t *testing.T, fb *fabric)) {
	for _, kind := range fabricKinds {
		t.Run(kind, func(t *testing.T) {
			checkLeaks(t)
			f(t, newFabric(t, kind, fl))
		})
	}
}

func TestRCOperations(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		a, b := fb.node(), fb.node()
		qa, qb := connect(t, a, b, 0)
		for i := range b.mem[:64<<10] {
			b.mem[i] = byte(i * 7)
		}
		b.dev.SyncMemory()
		// READ 3 MTUs + a bit, landing at an offset of a's MR.
		n := uint32(3*a.dev.MTU() + 100)
		post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 1000, n), RemoteAddr: 50, RKey: b.mr.RKey()})
		wc := poll(t, a.cq, 1, 5*time.Second)[0]
		if wc.Err() != nil || wc.ID != 1 || wc.Op != verbs.OpRead || wc.ByteLen != n {
			t.Fatalf("READ completion %+v: %v", wc, wc.Err())
		}
		if !bytes.Equal(a.mem[1000:1000+n], b.mem[50:50+n]) {
			t.Fatal("READ returned wrong bytes")
		}
		// WRITE then READ back through the same QP (RC ordering).
		copy(a.mem[200000:], bytes.Repeat([]byte("krfs"), 5000))
		post(t, qa,
			verbs.SendWR{ID: 2, Op: verbs.OpWrite, Local: sge(a, 200000, 20000), RemoteAddr: 300000, RKey: b.mr.RKey()},
			verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 400000, 20000), RemoteAddr: 300000, RKey: b.mr.RKey()})
		wcs := poll(t, a.cq, 1, 5*time.Second)
		if wcs[0].ID != 3 || wcs[0].Err() != nil {
			t.Fatalf("unsignaled WRITE must not complete; got %+v", wcs[0])
		}
		b.dev.SyncMemory()
		if !bytes.Equal(b.mem[300000:320000], a.mem[200000:220000]) || !bytes.Equal(a.mem[400000:420000], a.mem[200000:220000]) {
			t.Fatal("WRITE did not land or READ after WRITE saw old data")
		}
		// Atomics: FETCH_ADD and CMP_SWAP, success and failure.
		binary.NativeEndian.PutUint64(b.mem[4096:], 40)
		b.dev.SyncMemory()
		post(t, qa,
			verbs.SendWR{ID: 4, Op: verbs.OpFetchAdd, Flags: verbs.Signaled, Local: sge(a, 8, 8), RemoteAddr: 4096, RKey: b.mr.RKey(), CompareAdd: 2},
			verbs.SendWR{ID: 5, Op: verbs.OpCmpSwap, Flags: verbs.Signaled, Local: sge(a, 16, 8), RemoteAddr: 4096, RKey: b.mr.RKey(), CompareAdd: 42, Swap: 100},
			verbs.SendWR{ID: 6, Op: verbs.OpCmpSwap, Flags: verbs.Signaled, Local: sge(a, 24, 8), RemoteAddr: 4096, RKey: b.mr.RKey(), CompareAdd: 42, Swap: 7})
		for _, wc := range poll(t, a.cq, 3, 5*time.Second) {
			if wc.Err() != nil {
				t.Fatal(wc.Err())
			}
		}
		if got := []uint64{binary.NativeEndian.Uint64(a.mem[8:]), binary.NativeEndian.Uint64(a.mem[16:]), binary.NativeEndian.Uint64(a.mem[24:])}; got[0] != 40 || got[1] != 42 || got[2] != 100 {
			t.Fatalf("atomic originals %v, want [40 42 100]", got)
		}
		b.dev.SyncMemory()
		if v := binary.NativeEndian.Uint64(b.mem[4096:]); v != 100 {
			t.Fatalf("atomic result %d, want 100", v)
		}
		// SEND with immediate into a posted receive; WRITE_WITH_IMM.
		if err := qb.PostRecv([]verbs.RecvWR{{ID: 70, Local: sge(b, 600000, 9000)}, {ID: 71, Local: sge(b, 0, 0)}}); err != nil {
			t.Fatal(err)
		}
		copy(a.mem[500000:], bytes.Repeat([]byte{0xab}, 9000))
		post(t, qa,
			verbs.SendWR{ID: 7, Op: verbs.OpSendImm, Flags: verbs.Signaled, Local: sge(a, 500000, 9000), Imm: 99},
			verbs.SendWR{ID: 8, Op: verbs.OpWriteImm, Flags: verbs.Signaled | verbs.Inline, InlineData: []byte("inline!"), RemoteAddr: 700000, RKey: b.mr.RKey(), Imm: 100})
		if wcs := poll(t, a.cq, 2, 5*time.Second); wcs[0].Err() != nil || wcs[1].Err() != nil {
			t.Fatalf("send side: %v %v", wcs[0].Err(), wcs[1].Err())
		}
		rw := poll(t, b.cq, 2, 5*time.Second)
		b.dev.SyncMemory()
		if rw[0].ID != 70 || rw[0].Op != verbs.OpRecv || rw[0].ByteLen != 9000 || !rw[0].HasImm || rw[0].Imm != 99 || rw[0].SrcQPN != qa.QPN() {
			t.Fatalf("receive completion %+v", rw[0])
		}
		if rw[1].ID != 71 || rw[1].Op != verbs.OpRecvWriteImm || rw[1].Imm != 100 || string(b.mem[700000:700007]) != "inline!" {
			t.Fatalf("WRITE_WITH_IMM completion %+v, memory %q", rw[1], b.mem[700000:700007])
		}
		if !bytes.Equal(b.mem[600000:609000], a.mem[500000:509000]) {
			t.Fatal("SEND payload wrong")
		}
	})
}

func TestRemoteAccessErrorFlushes(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		a, b := fb.node(), fb.node()
		qa, qb := connect(t, a, b, 0)
		post(t, qa,
			verbs.SendWR{ID: 1, Op: verbs.OpWrite, Local: sge(a, 0, 64), RemoteAddr: 0, RKey: b.mr.RKey()},
			verbs.SendWR{ID: 2, Op: verbs.OpRead, Local: sge(a, 0, 64), RemoteAddr: 0, RKey: b.mr.RKey() ^ 0x5a5a},
			verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 64, 64), RemoteAddr: 0, RKey: b.mr.RKey()},
			verbs.SendWR{ID: 4, Op: verbs.OpWrite, Local: sge(a, 64, 64), RemoteAddr: 0, RKey: b.mr.RKey()})
		wcs := poll(t, a.cq, 3, 5*time.Second)
		if wcs[0].ID != 2 || wcs[0].Status != verbs.StatusRemAccessErr || wcs[0].Reason != verbs.ReasonRKey {
			t.Fatalf("first completion %+v, want WR 2 remote access error (bad rkey)", wcs[0])
		}
		for i, id := range []uint64{3, 4} {
			if wcs[i+1].ID != id || wcs[i+1].Status != verbs.StatusWRFlushErr {
				t.Fatalf("completion %d: %+v, want WR %d flushed (unsignaled too)", i+1, wcs[i+1], id)
			}
		}
		if qa.State() != verbs.StateErr {
			t.Fatalf("requester QP in %v, want ERR", qa.State())
		}
		// The responder QP errors too, as on hardware.
		if qb.State() != verbs.StateErr {
			t.Fatalf("responder QP in %v, want ERR", qb.State())
		}
		// A WR posted to a QP in ERR completes flushed.
		post(t, qa, verbs.SendWR{ID: 5, Op: verbs.OpWrite, Local: sge(a, 0, 8), RemoteAddr: 0, RKey: b.mr.RKey()})
		if wc := poll(t, a.cq, 1, time.Second)[0]; wc.ID != 5 || wc.Status != verbs.StatusWRFlushErr {
			t.Fatalf("post in ERR: %+v", wc)
		}
		// Other errors: bounds, permission, misaligned atomic over a fresh QP.
		ro, err := b.pd.RegMR(make([]byte, 4096), verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			wr   verbs.SendWR
			st   verbs.Status
			why  verbs.Reason
			name string
		}{
			{verbs.SendWR{Op: verbs.OpRead, Local: sge(a, 0, 64), RemoteAddr: memSize - 32, RKey: b.mr.RKey()}, verbs.StatusRemAccessErr, verbs.ReasonBounds, "bounds"},
			{verbs.SendWR{Op: verbs.OpWrite, Local: sge(a, 0, 64), RemoteAddr: 0, RKey: ro.RKey()}, verbs.StatusRemAccessErr, verbs.ReasonPerm, "permission"},
		}
		for _, c := range cases {
			qa, _ := connect(t, a, b, 0)
			post(t, qa, c.wr)
			wc := poll(t, a.cq, 1, 5*time.Second)[0]
			if wc.Status != c.st || wc.Reason != c.why {
				t.Errorf("%s: completion %+v, want %v (%v)", c.name, wc, c.st, c.why)
			}
			if qa.State() != verbs.StateErr {
				t.Errorf("%s: QP in %v, want ERR", c.name, qa.State())
			}
		}
		// Deregistration: the old rkey stops working.
		qa2, _ := connect(t, a, b, 0)
		rk := ro.RKey()
		if err := ro.Dereg(); err != nil {
			t.Fatal(err)
		}
		if err := ro.Dereg(); !errors.Is(err, verbs.ErrMRDead) {
			t.Fatalf("second Dereg: %v", err)
		}
		post(t, qa2, verbs.SendWR{Op: verbs.OpRead, Local: sge(a, 0, 8), RemoteAddr: 0, RKey: rk})
		if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Status != verbs.StatusRemAccessErr || wc.Reason != verbs.ReasonRKey {
			t.Fatalf("READ with a deregistered rkey: %+v", wc)
		}
	})
}

func TestDCITargetsAndKeys(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		a := fb.node()
		var tg [3]*node
		var dcts [3]verbs.QP
		var srqs [3]verbs.SRQ
		for i := range tg {
			tg[i] = fb.node()
			dcts[i], srqs[i] = tg[i].dct(uint64(1000 + i))
			recvs := make([]verbs.RecvWR, 64)
			for j := range recvs {
				recvs[j] = verbs.RecvWR{ID: uint64(j)}
			}
			if err := srqs[i].PostRecv(recvs); err != nil {
				t.Fatal(err)
			}
		}
		dci := a.dci(0)
		// 60 WRITE_WITH_IMMs alternating over 3 targets, one batch: the DCI
		// serves one target at a time and each target sees its own order.
		var wrs []verbs.SendWR
		for k := 0; k < 60; k++ {
			i := k % 3
			binary.LittleEndian.PutUint32(a.mem[k*4:], uint32(k))
			wrs = append(wrs, verbs.SendWR{ID: uint64(k), Op: verbs.OpWriteImm, Flags: verbs.Signaled, Local: sge(a, uint64(k*4), 4),
				RemoteAddr: uint64(k / 3 * 4), RKey: tg[i].mr.RKey(), Imm: uint32(k), Target: target(tg[i], dcts[i], uint64(1000+i))})
		}
		post(t, dci, wrs...)
		for k, wc := range poll(t, a.cq, 60, 5*time.Second) {
			if wc.Err() != nil || wc.ID != uint64(k) {
				t.Fatalf("completion %d: %+v %v", k, wc, wc.Err())
			}
		}
		for i := range tg {
			got := poll(t, tg[i].cq, 20, 5*time.Second)
			tg[i].dev.SyncMemory()
			for j, wc := range got {
				if want := uint32(j*3 + i); wc.Imm != want || wc.SrcQPN != dci.QPN() || wc.SrcAddr != a.dev.Addr() {
					t.Fatalf("target %d receive %d: %+v, want imm %d from DCI %d", i, j, wc, want, dci.QPN())
				}
				if v := binary.LittleEndian.Uint32(tg[i].mem[j*4:]); v != uint32(j*3+i) {
					t.Fatalf("target %d word %d = %d", i, j, v)
				}
			}
		}
		// A wrong DC key is NAKed, counted, and never executed.
		before := tg[0].dev.Stats().DCKeyRejects
		sent0 := dci.Info().Stats.Retransmits
		copy(a.mem[8192:], "evil")
		post(t, dci, verbs.SendWR{ID: 99, Op: verbs.OpWrite, Local: sge(a, 8192, 4), RemoteAddr: 9000, RKey: tg[0].mr.RKey(), Target: target(tg[0], dcts[0], 1)})
		wc := poll(t, a.cq, 1, 5*time.Second)[0]
		if wc.Status != verbs.StatusRemInvReqErr || wc.Reason != verbs.ReasonDCKey {
			t.Fatalf("wrong DC key: %+v", wc)
		}
		// Every copy that arrives is refused and counted: one, plus any
		// retransmission the DCI made before the NAK came back (a loaded
		// host can fire the ACK timeout first).
		copies := 1 + dci.Info().Stats.Retransmits - sent0
		if got := tg[0].dev.Stats().DCKeyRejects - before; got < 1 || got > copies {
			t.Fatalf("DC key rejects counted %d, want 1 to %d (copies sent)", got, copies)
		}
		if got := dcts[0].Info().Stats.DCKeyRejects; got < 1 || got > copies {
			t.Fatalf("DCT counter %d, want 1 to %d", got, copies)
		}
		tg[0].dev.SyncMemory()
		if string(tg[0].mem[9000:9004]) == "evil" {
			t.Fatal("a request with a wrong DC key was executed")
		}
		if dci.State() != verbs.StateErr {
			t.Fatalf("DCI in %v after a NAK, want ERR", dci.State())
		}
		// Unknown DCT number: the requester learns at once.
		dci2 := a.dci(0)
		post(t, dci2, verbs.SendWR{ID: 100, Op: verbs.OpRead, Local: sge(a, 0, 8), RemoteAddr: 0, RKey: tg[1].mr.RKey(),
			Target: &verbs.DCTarget{Addr: tg[1].dev.Addr(), DCTN: dcts[1].QPN() ^ 0x77, DCKey: 1001}})
		if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Status != verbs.StatusRemInvReqErr || wc.Reason != verbs.ReasonNoQP {
			t.Fatalf("unknown DCT: %+v", wc)
		}
		// Recovery: the DCI goes back to RTS through RESET and works again.
		for _, st := range []verbs.QPState{verbs.StateReset, verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
			if err := dci.Modify(verbs.QPAttr{State: st}); err != nil {
				t.Fatal(err)
			}
		}
		post(t, dci, verbs.SendWR{ID: 101, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RemoteAddr: 0, RKey: tg[2].mr.RKey(), Target: target(tg[2], dcts[2], 1002)})
		if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Err() != nil {
			t.Fatalf("after recovery: %v", wc.Err())
		}
	})
}

// TestZeroCopyRead: a 1 MiB READ over real UDP into private memory (an MR
// no peer can reach) lands in the READ's buffer by the kernel's receive
// copy alone: no payload is copied by the engine.
func TestZeroCopyRead(t *testing.T) {
	checkLeaks(t)
	fb := newFabric(t, "udp", faults{})
	a, b := fb.node(), fb.node()
	qa, _ := connect(t, a, b, 0)
	for i := range b.mem {
		b.mem[i] = byte(i*31 + i>>8)
	}
	b.dev.SyncMemory()
	local := make([]byte, memSize)
	lmr, err := a.pd.RegMR(local, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	before := a.dev.Stats()
	for i := 0; i < 4; i++ {
		post(t, qa, verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, Local: verbs.SGE{MR: lmr, Length: memSize}, RKey: b.mr.RKey()})
		if wc := poll(t, a.cq, 1, 10*time.Second)[0]; wc.Err() != nil {
			t.Fatal(wc.Err())
		}
		if !bytes.Equal(local, b.mem) {
			t.Fatal("1 MiB READ returned wrong bytes")
		}
	}
	after := a.dev.Stats()
	if after.Misplaced != before.Misplaced {
		t.Fatalf("%d READ response payloads were copied by the engine", after.Misplaced-before.Misplaced)
	}
	pkts := after.RxPackets - before.RxPackets
	if pkts < 4*memSize/uint64(a.dev.MTU()) {
		t.Fatalf("only %d packets received for 4 MiB", pkts)
	}
	// GRO delivered the responses in batches: far fewer receive system
	// calls than packets.
	if sc := after.RxSyscalls - before.RxSyscalls; sc*2 > pkts {
		t.Errorf("%d receive system calls for %d packets: GRO batching is not working", sc, pkts)
	}
}
