package dct

import (
	"context"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

type host struct {
	dev verbs.Device
	pd  verbs.PD
	cq  verbs.CQ
	mem []byte
	mr  verbs.MR
}

func newHost(t *testing.T) *host {
	t.Helper()
	dev, err := softnic.OpenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, _ := dev.AllocPD()
	cq, err := dev.CreateCQ(1024)
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]byte, 4096)
	mr, err := pd.RegMR(mem, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	return &host{dev, pd, cq, mem, mr}
}

func waitWC(t *testing.T, cq verbs.CQ) verbs.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]verbs.WC
	for cq.Poll(wc[:]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return wc[0]
}

// A DCI that a bad rkey moved to ERR comes back with Recover and reaches
// the target again; a wrong key is refused by the DCT.
func TestPoolRecoverAndTarget(t *testing.T) {
	leaktest.Check(t)
	a, b := newHost(t), newHost(t)
	tg, err := NewTarget(b.pd, b.cq, TargetConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if tg.Key() == 0 || tg.DCTN() == 0 || tg.QP().State() != verbs.StateRTR {
		t.Fatalf("target key %#x dctn %d state %v", tg.Key(), tg.DCTN(), tg.QP().State())
	}
	p, err := NewPool(a.pd, a.cq, PoolConfig{DCIs: 2, PeerTimeout: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Len() != 2 || p.Depth() != DefaultDepth {
		t.Fatalf("len %d depth %d", p.Len(), p.Depth())
	}
	dst := &verbs.DCTarget{Addr: b.dev.Addr(), DCTN: tg.DCTN(), DCKey: tg.Key()}
	read := func(rkey uint32, target *verbs.DCTarget) verbs.WC {
		if err := p.QP(0).PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled,
			Local: verbs.SGE{MR: a.mr, Length: 8}, RKey: rkey, Target: target}}); err != nil {
			t.Fatal(err)
		}
		return waitWC(t, a.cq)
	}
	if wc := read(b.mr.RKey(), dst); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	if wc := read(b.mr.RKey()^1, dst); wc.Status != verbs.StatusRemAccessErr {
		t.Fatalf("bad rkey: %+v", wc)
	}
	if p.QP(0).State() != verbs.StateErr {
		t.Fatalf("DCI in %v after a NAK", p.QP(0).State())
	}
	if err := p.Recover(0); err != nil {
		t.Fatal(err)
	}
	if wc := read(b.mr.RKey(), dst); wc.Err() != nil {
		t.Fatalf("after recovery: %v", wc.Err())
	}
	bad := *dst
	bad.DCKey++
	if wc := read(b.mr.RKey(), &bad); wc.Reason != verbs.ReasonDCKey {
		t.Fatalf("wrong key: %+v", wc)
	}
	p.Recover(0)
	// A dead target: the error comes after about PeerTimeout.
	dead := *dst
	dead.Addr = a.dev.Addr() // our own device has no such DCT: NoQP at once
	if wc := read(b.mr.RKey(), &dead); wc.Reason != verbs.ReasonNoQP {
		t.Fatalf("no such DCT: %+v", wc)
	}
	if got := AckTimeout(time.Second, 7); got != 125*time.Millisecond {
		t.Fatalf("AckTimeout %v", got)
	}
}
