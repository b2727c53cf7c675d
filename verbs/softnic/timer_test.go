package softnic_test

import (
	"bytes"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// newStepFabric is the fake network on a manual clock that only the test
// moves: packets due now flow at once (AutoFlush), timers fire only in
// clk.Advance. Whatever the machine's load, a timer fires exactly when
// the test says time has passed.
func newStepFabric(t *testing.T, seed uint64) (*fabric, *softnictest.ManualClock) {
	clk := softnictest.NewManualClock(time.Time{})
	fb := &fabric{name: "fake", t: t, clock: clk}
	fb.net = softnictest.NewNetwork(softnictest.Config{Seed: seed, Clock: clk, AutoFlush: true})
	t.Cleanup(func() { fb.net.Close() })
	return fb, clk
}

// stepTimeout is the ACK timeout of QPs on a step fabric.
const stepTimeout = time.Millisecond

// TestIdleAfterReadGapNoTimeout: a READ whose response was lost is asked
// again when a later READ's response shows the gap (an implied NAK); once
// both complete the QP owes nothing, and however long it then stays idle
// its retransmission timer must not count retries. The requester used to
// leave its oldest unacknowledged PSN behind the last READ there, so an
// idle QP ran out of retries and went to ERR, and the next WR completed
// flushed (TestLossyMixed's "WR flushed" when the clients were starved of
// CPU while the manual clock ran on).
func TestIdleAfterReadGapNoTimeout(t *testing.T) {
	checkLeaks(t)
	fb, clk := newStepFabric(t, 3)
	var dropped atomic.Bool
	fb.net.SetFilter(func(_, _ netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if h.Op == wire.OpReadResp && dropped.CompareAndSwap(false, true) {
			return softnictest.Drop
		}
		return softnictest.Pass
	})
	a, b := fb.node(), fb.node()
	qa, _ := connect(t, a, b, stepTimeout)
	copy(b.mem, "0123456789abcdef")
	b.dev.SyncMemory()
	post(t, qa,
		verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RemoteAddr: 0, RKey: b.mr.RKey()},
		verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 8, 8), RemoteAddr: 8, RKey: b.mr.RKey()})
	for _, wc := range poll(t, a.cq, 2, 0) {
		if wc.Err() != nil {
			t.Fatalf("READ: %v", wc.Err())
		}
	}
	if !dropped.Load() {
		t.Fatal("no READ response was dropped: the test did not test the gap")
	}
	a.dev.SyncMemory()
	if !bytes.Equal(a.mem[:16], b.mem[:16]) {
		t.Fatalf("READs returned %q", a.mem[:16])
	}
	// Idle for many timeouts.
	for range 4 * (7 + 1) {
		clk.Advance(stepTimeout)
	}
	if st := qa.State(); st != verbs.StateRTS {
		t.Fatalf("idle QP went to %v", st)
	}
	if n := qa.Info().Stats.Timeouts; n != 0 {
		t.Fatalf("idle QP counted %d timeouts", n)
	}
	post(t, qa, verbs.SendWR{ID: 3, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 16), RemoteAddr: 64, RKey: b.mr.RKey()})
	if wc := poll(t, a.cq, 1, 0)[0]; wc.Err() != nil {
		t.Fatalf("WRITE after idling: %v", wc.Err())
	}
}
