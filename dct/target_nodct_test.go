package dct

import (
	"errors"
	"testing"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// NoDCT gives a usable SRQ and publishes DCT number 0 and key 0.
func TestTargetNoDCT(t *testing.T) {
	h := newHost(t)
	tg, err := NewTarget(h.pd, h.cq, TargetConfig{SRQDepth: 4, NoDCT: true})
	if err != nil {
		t.Fatal(err)
	}
	if tg.DCTN() != 0 || tg.Key() != 0 || tg.QP() != nil || tg.SRQ() == nil {
		t.Fatalf("DCTN %d key %#x QP %v SRQ %v", tg.DCTN(), tg.Key(), tg.QP(), tg.SRQ())
	}
	if err := tg.SRQ().PostRecv([]verbs.RecvWR{{ID: 1, Local: verbs.SGE{MR: h.mr, Length: 64}}}); err != nil {
		t.Fatalf("PostRecv on the SRQ: %v", err)
	}
	if err := tg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tg.SRQ().PostRecv([]verbs.RecvWR{{ID: 2, Local: verbs.SGE{MR: h.mr, Length: 64}}}); err == nil {
		t.Fatal("PostRecv after Close succeeded")
	}
	// With a DCT, the number is not 0.
	dc, err := NewTarget(h.pd, h.cq, TargetConfig{SRQDepth: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if dc.DCTN() == 0 || dc.Key() == 0 || dc.QP() == nil {
		t.Fatalf("DC target: DCTN %d key %#x", dc.DCTN(), dc.Key())
	}
}

// On a device without atomics (upstream mlx5's atomic_cap NONE) the DCT
// grants read and write only by default: asking a NIC for remote atomic
// access there fails at INIT.
func TestTargetWithoutAtomics(t *testing.T) {
	dev, err := softnic.Open(softnic.Config{Link: softnictest.NewNetwork(softnictest.Config{}).NewLink(), NoAtomics: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, err := dev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	tg, err := NewTarget(pd, cq, TargetConfig{SRQDepth: 4})
	if err != nil {
		t.Fatalf("DC target on a device without atomics: %v", err)
	}
	defer tg.Close()
	if tg.DCTN() == 0 {
		t.Fatal("the DCT has no number in RTR")
	}
	if _, err := NewTarget(pd, cq, TargetConfig{SRQDepth: 4, Access: verbs.AccessRemoteAtomic}); !errors.Is(err, verbs.ErrNotSupported) {
		t.Fatalf("a DCT asking for atomics on a device without them: %v, want ErrNotSupported", err)
	}
}
