//go:build linux

package udplink

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// predQP is the QP the predictor predicts for; packets to other QPs are
// never steered (another QP's traffic interleaved).
const predQP = 7

// predictor is a collector that also implements link.Predictor: it
// predicts the READ-response-sized packets from PSN next on, in the
// collector's slots, and advances next past every packet of predQP it is
// given. It records each prediction's first PSN so that the test can tell
// a right prediction from a wrong one.
type predictor struct {
	*collector
	hl, plen int
	next     uint32 // guarded by rxMu
	want     atomic.Int32
	in       atomic.Pointer[link.Interrupter]
	made     []uint32 // first PSN of every prediction, in order; guarded by rxMu
}

func newPredictor(slots, plen int) *predictor {
	c := newCollector(slots, plen, true)
	return &predictor{collector: c, hl: len(hdr(wire.OpReadResp, 0, 0)), plen: plen}
}

func (p *predictor) Predict(out []link.Prediction, in link.Interrupter, _ bool) int {
	if p.in.Load() == nil {
		p.in.Store(&in)
	}
	if p.want.Load() > 0 {
		return 0
	}
	n := 0
	for off := p.slot * int(p.next); n < len(out) && off+p.plen <= len(p.region); off += p.slot {
		out[n] = link.Prediction{HdrLen: p.hl, Payload: p.region[off : off+p.plen]}
		n++
	}
	if n > 0 {
		p.made = append(p.made, p.next)
	}
	return n
}

func (p *predictor) Steer(from netip.AddrPort, h []byte, index, plen int) []byte {
	if hd, _, err := wire.Parse(h); err != nil || hd.DestQP != predQP {
		return nil
	}
	return p.collector.Steer(from, h, index, plen)
}

func (p *predictor) Deliver(from netip.AddrPort, h, payload []byte) {
	p.collector.Deliver(from, h, payload)
	if hd, _, err := wire.Parse(h); err == nil && hd.DestQP == predQP {
		p.next = hd.PSN + 1
	}
}

// waitN waits for n deliveries without taking RxLock.
func (p *predictor) waitN(tb testing.TB, n int) {
	tb.Helper()
	deadline := time.Now().Add(2 * time.Minute) // a hang guard, not a speed limit
	for p.n.Load() < int64(n) {
		if time.Now().After(deadline) {
			tb.Fatalf("got %d deliveries, want %d", p.n.Load(), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// wait waits for n deliveries and returns all records. It takes RxLock
// from outside the receive path, as a Predictor's user must: publish,
// interrupt, lock.
func (p *predictor) wait(tb testing.TB, n int) []record {
	tb.Helper()
	p.waitN(tb, n)
	p.want.Add(1)
	if in := p.in.Load(); in != nil {
		(*in).InterruptRecv()
	}
	p.rxMu.Lock()
	defer func() {
		p.rxMu.Unlock()
		p.want.Add(-1)
	}()
	return append([]record(nil), p.recs...)
}

// respTo is a READ response header of psn to qpn.
func respTo(qpn, psn uint32) []byte {
	h := wire.Header{Op: wire.OpReadResp, DestQP: qpn, SrcQP: 9, PSN: psn}
	return h.Append(nil)
}

// TestPredictedReceiveOneSyscall: packets that arrive in the predicted
// order land in place with one receive system call per datagram and no
// copy.
func TestPredictedReceiveOneSyscall(t *testing.T) {
	checkGoroutines(t)
	const n, plen = 64, 1000
	rng := rand.New(rand.NewPCG(3, 4))
	a := openLink(t, Config{Addr: loopback})
	b := openLink(t, Config{Addr: loopback})
	p := newPredictor(n+8, plen)
	a.Start(newCollector(1, 1, false))
	b.Start(p)
	var pkts []link.Packet
	for psn := uint32(0); psn < n; psn++ {
		pkt := link.Packet{To: b.LocalAddr(), Hdr: respTo(predQP, psn), Payload: randBytes(rng, plen)}
		pkts = append(pkts, pkt)
		// One at a time, so that each is its own datagram and the
		// prediction for it is made before it arrives.
		if err := a.Send([]link.Packet{pkt}); err != nil {
			t.Fatal(err)
		}
		p.waitN(t, int(psn)+1)
	}
	c := b.Counters()
	recs := p.wait(t, n)
	checkRecords(t, recs, pkts, a.LocalAddr(), true)
	if c.RxSteered != n || c.RxMispredicted != 0 || c.RxMalformed != 0 {
		t.Errorf("steered %d, mispredicted %d, malformed %d; want %d, 0, 0", c.RxSteered, c.RxMispredicted, c.RxMalformed, n)
	}
	if c.RxSyscalls-c.RxTimeouts-c.RxInterrupted != n || c.Kicks != 0 {
		t.Errorf("%d receive system calls (%d kicks, %d timeouts) for %d datagrams, want one each", c.RxSyscalls, c.Kicks, c.RxTimeouts, n)
	}
	for i := range pkts {
		if got := p.region[i*plen : (i+1)*plen]; !bytes.Equal(got, pkts[i].Payload) {
			t.Fatalf("slot %d does not hold packet %d's payload", i, i)
		}
	}
}

// TestPredictedReceiveMispredictions: reordering, loss, duplicates and
// another QP's packets interleaved. Every packet is delivered with its
// own bytes; a packet whose payload landed in predicted memory it does
// not belong to is copied out and counted, exactly once per such packet;
// the rest land in place.
func TestPredictedReceiveMispredictions(t *testing.T) {
	checkGoroutines(t)
	const plen, slots = 700, 256
	rng := rand.New(rand.NewPCG(5, 6))
	a := openLink(t, Config{Addr: loopback})
	b := openLink(t, Config{Addr: loopback})
	p := newPredictor(slots, plen)
	a.Start(newCollector(1, 1, false))
	b.Start(p)

	// A sequence of PSNs to predQP with reordering (swap neighbours),
	// loss (skip), duplicates, and packets to QP 8 in between.
	type sent struct {
		qpn, psn uint32
	}
	var seq []sent
	for psn := uint32(0); psn < 150; psn++ {
		switch r := rng.IntN(10); {
		case r == 0: // lost
		case r == 1 && psn+1 < 150: // reordered with the next
			seq = append(seq, sent{predQP, psn + 1}, sent{predQP, psn})
			psn++
		case r == 2: // duplicated
			seq = append(seq, sent{predQP, psn}, sent{predQP, psn})
		case r == 3: // another QP's packet first
			seq = append(seq, sent{8, uint32(rng.IntN(100))}, sent{predQP, psn})
		default:
			seq = append(seq, sent{predQP, psn})
		}
	}
	// The model: what the receiver predicts before each datagram, hence
	// which ones land in place and which are copied.
	var wantMiss, wantInPlace uint64
	next := uint32(0)
	var pkts []link.Packet
	var inPlace []bool
	for _, s := range seq {
		pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: respTo(s.qpn, s.psn), Payload: randBytes(rng, plen)})
		right := s.qpn == predQP && s.psn == next
		inPlace = append(inPlace, right)
		if right {
			wantInPlace++
		} else {
			wantMiss++
		}
		if s.qpn == predQP {
			next = s.psn + 1
		}
	}
	for i := range pkts {
		if err := a.Send(pkts[i : i+1]); err != nil {
			t.Fatal(err)
		}
		p.waitN(t, i+1) // one datagram at a time: no GRO, a known prediction each
	}
	c := b.Counters()
	recs := p.wait(t, len(pkts))
	for i, r := range recs {
		if !bytes.Equal(r.hdr, pkts[i].Hdr) || !bytes.Equal(r.payload, pkts[i].Payload) {
			t.Fatalf("packet %d (QP %d PSN %d): wrong bytes delivered", i, seq[i].qpn, seq[i].psn)
		}
		if seq[i].qpn == predQP && r.inPlace != inPlace[i] {
			t.Errorf("packet %d (PSN %d): in place %v, want %v", i, seq[i].psn, r.inPlace, inPlace[i])
		}
	}
	if c.RxMispredicted != wantMiss || c.RxSteered != wantInPlace {
		t.Errorf("mispredicted %d, steered %d; want %d and %d (of %d packets)", c.RxMispredicted, c.RxSteered, wantMiss, wantInPlace, len(pkts))
	}
	if wantMiss == 0 || wantInPlace == 0 {
		t.Fatalf("the sequence exercises nothing: %d misses, %d hits", wantMiss, wantInPlace)
	}
	if c.RxSyscalls-c.RxTimeouts-c.RxInterrupted-c.RxProbes != uint64(len(pkts)) || c.Kicks != 0 {
		t.Errorf("%d receive system calls for %d datagrams: %+v", c.RxSyscalls, len(pkts), c)
	}
}

// TestPredictedReceiveGROBatch: a GSO batch of in-order packets is placed
// by the prediction; a batch that starts past a lost packet is delivered
// with the right bytes and its misplaced payloads counted.
func TestPredictedReceiveGROBatch(t *testing.T) {
	checkGoroutines(t)
	const plen = 1200
	rng := rand.New(rand.NewPCG(7, 8))
	a := openLink(t, Config{Addr: loopback, GSO: true})
	b := openLink(t, Config{Addr: loopback, GRO: true})
	if !b.Counters().GRO {
		t.Skip("no UDP_GRO")
	}
	p := newPredictor(64, plen)
	a.Start(newCollector(1, 1, false))
	b.Start(p)
	batch := func(first, n uint32) []link.Packet {
		var pkts []link.Packet
		for psn := first; psn < first+n; psn++ {
			pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: respTo(predQP, psn), Payload: randBytes(rng, plen)})
		}
		return pkts
	}
	in := batch(0, 16)
	if err := a.Send(in); err != nil {
		t.Fatal(err)
	}
	p.waitN(t, 16)
	c1 := b.Counters()
	if c1.RxMispredicted != 0 || c1.RxSteered != 16 {
		t.Errorf("in-order batch: steered %d, mispredicted %d; want 16 and 0", c1.RxSteered, c1.RxMispredicted)
	}
	gap := batch(20, 16) // 16..19 lost: every predicted slot gets the wrong packet
	if err := a.Send(gap); err != nil {
		t.Fatal(err)
	}
	p.waitN(t, 32)
	c2 := b.Counters()
	recs := p.wait(t, 32)
	checkRecords(t, recs[16:], gap, a.LocalAddr(), false)
	if miss := c2.RxMispredicted - c1.RxMispredicted; miss == 0 || miss > 16 {
		t.Errorf("batch after a gap: %d mispredicted, want 1..16 (one per datagram's packet that landed in a predicted slot)", miss)
	}
	if c2.RxSteered != c1.RxSteered {
		t.Errorf("batch after a gap: %d packets counted in place", c2.RxSteered-c1.RxSteered)
	}
	for i := range in {
		if !bytes.Equal(p.region[i*plen:(i+1)*plen], in[i].Payload) {
			t.Fatalf("slot %d lost its payload", i)
		}
	}
}

// blockedPredicting starts a link whose receiver predicts and returns
// once it is blocked receiving with a prediction (and so holds RxLock).
func blockedPredicting(t *testing.T) (*Link, *predictor) {
	t.Helper()
	b := openLink(t, Config{Addr: loopback})
	p := newPredictor(4, 100)
	b.Start(p)
	deadline := time.Now().Add(time.Minute) // a hang guard
	for p.in.Load() == nil || !b.predBlocked.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the receiver never blocked with a prediction")
		}
		time.Sleep(time.Millisecond)
	}
	return b, p
}

// TestInterruptPredictedReceive: a receiver blocked holding RxLock with a
// prediction gives it up when another goroutine publishes that it wants
// the lock and calls InterruptRecv, with no datagram from anyone else.
func TestInterruptPredictedReceive(t *testing.T) {
	checkGoroutines(t)
	b, p := blockedPredicting(t)
	for i := 0; i < 20; i++ {
		p.want.Add(1)
		(*p.in.Load()).InterruptRecv()
		p.rxMu.Lock()
		p.want.Add(-1)
		p.rxMu.Unlock()
	}
	if k := b.Counters().Kicks; k == 0 || k > 20 {
		t.Errorf("%d kicks for 20 interrupts", k)
	}
	if c := b.Counters(); c.RxDatagrams != 0 || p.n.Load() != 0 {
		t.Errorf("interrupts delivered something: %d datagrams, %d deliveries", c.RxDatagrams, p.n.Load())
	}
}

// TestLostKickIsBounded: an interrupt whose kick is lost (an input
// firewall can drop the link's datagram to itself; here the kick is never
// sent) still gets RxLock, once the bounded wait of the receiver holding
// it ends (counted in RxTimeouts).
func TestLostKickIsBounded(t *testing.T) {
	checkGoroutines(t)
	b, p := blockedPredicting(t)
	b.kickPending.Store(true) // as if a kick were in flight: InterruptRecv sends none
	p.want.Add(1)
	(*p.in.Load()).InterruptRecv()
	p.rxMu.Lock()
	p.want.Add(-1)
	p.rxMu.Unlock()
	if c := b.Counters(); c.Kicks != 0 || c.RxTimeouts == 0 {
		t.Errorf("RxLock came back after %d kicks and %d timeouts; want 0 kicks and the wait's timeout", c.Kicks, c.RxTimeouts)
	}
}

// TestIdleReceiveIsUnbounded: a receiver that never held RxLock while
// blocked waits with no timeout (an idle link sleeps); one blocked holding
// RxLock has one; once it waits without RxLock again, the first timeout
// (the link idle for rxWaitMax) clears it.
func TestIdleReceiveIsUnbounded(t *testing.T) {
	checkGoroutines(t)
	timeout := func(b *Link) bool {
		t.Helper()
		tv, err := unix.GetsockoptTimeval(b.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO)
		if err != nil {
			t.Fatal(err)
		}
		return tv.Sec != 0 || tv.Usec != 0
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute) // a hang guard
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
			time.Sleep(time.Millisecond)
		}
	}

	b := openLink(t, Config{Addr: loopback})
	p := newPredictor(4, 100)
	p.want.Store(1) // Predict declines
	b.Start(p)
	waitFor("the receiver never blocked", b.bgInRecv.Load)
	if timeout(b) {
		t.Error("a receiver that never predicted waits with a timeout")
	}

	b = openLink(t, Config{Addr: loopback})
	p = newPredictor(4, 100)
	b.Start(p)
	waitFor("the receiver never blocked with a prediction", func() bool { return p.in.Load() != nil && b.predBlocked.Load() })
	if !timeout(b) {
		t.Error("a receiver blocked holding RxLock waits without a timeout")
	}
	// Predict declines from now on; the interrupted receiver waits without
	// RxLock, times out once (idle), and then without a timeout.
	p.want.Add(1)
	(*p.in.Load()).InterruptRecv()
	p.rxMu.Lock()
	t0 := b.Counters().RxTimeouts // the receiver has let go of RxLock
	p.rxMu.Unlock()
	waitFor("the idle receiver never timed out", func() bool { return b.Counters().RxTimeouts > t0 })
	waitFor("the receiver never blocked again", b.bgInRecv.Load)
	if timeout(b) {
		t.Error("the receive timeout stayed set after the link went idle")
	}
}
