package qpcore_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// TestResponderQPReplacedAfterAccessError: a peer's WRITE with a stale
// rkey (the region was unexported after the peer read the directory)
// moves this node's passive RC QP to ERR, as a NIC does, with no
// completion here: only the device's event says so. The QP is destroyed
// at once, without waiting for housekeeping (the clock does not move),
// so the peer's new connection is the only passive QP left.
func TestResponderQPReplacedAfterAccessError(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{NoDC: true})
	b := c.add(2, 4096, qpcore.Config{NoDC: true})
	if _, err := b.n.Export("gone", verbs.PageAligned(4096), fullAccess); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	v := mustConnect(t, a.n, 2)
	if err := v.Write(ctx, []byte("before"), "gone", 0); err != nil {
		t.Fatal(err)
	}
	if s := b.n.Stats(); s.RCPassive != 1 {
		t.Fatalf("b holds %d passive QPs, want 1", s.RCPassive)
	}
	if err := b.n.Unexport("gone"); err != nil {
		t.Fatal(err)
	}
	// a's directory still lists the region: the WRITE reaches b, whose
	// NIC refuses the rkey and moves its QP to ERR.
	if err := v.Write(ctx, []byte("after"), "gone", 0); err == nil {
		t.Fatal("a WRITE to an unexported region succeeded")
	}
	eventually(t, "b replaces its passive QP in ERR", func() bool {
		s := b.n.Stats()
		return s.RCPassive == 0 && s.RCPassiveErrors == 1
	})
	// a reconnects; b holds exactly the new QP.
	if err := v.Write(ctx, []byte("again"), "mem", 0); err != nil {
		t.Fatal(err)
	}
	if s := b.n.Stats(); s.RCPassive != 1 || s.RCReclaimed != 0 {
		t.Fatalf("after reconnecting b holds %d passive QPs (%d reclaimed by housekeeping), want 1 (0)", s.RCPassive, s.RCReclaimed)
	}
	for _, q := range b.dev.QPs() {
		if q.State == verbs.StateErr {
			t.Fatalf("b still holds a QP in ERR: %+v", q)
		}
	}
}

// TestNoAtomicsDevice: on a NIC without atomics (upstream mlx5 reports
// atomic_cap NONE unless its firmware answers in host byte order) a node
// runs (its DCT and passive QPs grant no atomic access) and refuses
// atomics before posting, with EOPNOTSUPP; READs and WRITEs work.
func TestNoAtomicsDevice(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	c.noAtomics = true
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 4096, qpcore.Config{})
	ctx := ctxT(t, 20*time.Second)
	v := mustConnect(t, a.n, 2)
	if err := v.Write(ctx, []byte("plain"), "mem", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := v.FetchAdd(ctx, "mem", 8, 1); !errors.Is(err, qpcore.ErrOpcode) || !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("FetchAdd without atomics: %v, want ErrOpcode (EOPNOTSUPP)", err)
	}
	b.dev.SyncMemory()
	if string(b.mem[:5]) != "plain" {
		t.Fatalf("memory %q", b.mem[:5])
	}
	noQPErrors(t, a.n, b.n)
}

// TestPortEventsCounted: the port going down and back up shows in the
// node's statistics.
func TestPortEventsCounted(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	a.dev.SetPortActive(false)
	a.dev.SetPortActive(true)
	eventually(t, "the port events are counted", func() bool {
		s := a.n.Stats()
		return s.PortDowns == 1 && s.PortUps == 1
	})
}
