package softnic_test

import (
	"bytes"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/link"
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
// its retransmission timer must not count retries. A requester that left
// its oldest unacknowledged PSN behind the last READ there would run an
// idle QP out of retries into ERR, and the next WR would complete flushed
// (TestLossyMixed's "WR flushed" when the clients are starved of CPU while
// the manual clock runs on).
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

// timeoutsUntilCompletion advances the clock one ACK timeout at a time,
// letting every packet due be delivered after each step, until a's CQ
// holds a completion; it returns how many timeouts that took and the
// completion, or fails after limit.
func timeoutsUntilCompletion(t *testing.T, fb *fabric, clk *softnictest.ManualClock, a *node, limit int) (int, verbs.WC) {
	return stepsUntilCompletion(t, fb, clk, a, stepTimeout, limit)
}

// stepsUntilCompletion is timeoutsUntilCompletion with steps of step.
func stepsUntilCompletion(t *testing.T, fb *fabric, clk *softnictest.ManualClock, a *node, step time.Duration, limit int) (int, verbs.WC) {
	t.Helper()
	wc := make([]verbs.WC, 1)
	for i := 1; i <= limit; i++ {
		clk.Advance(step)
		for fb.net.Flush() > 0 {
		}
		a.dev.SyncMemory()
		if a.cq.Poll(wc) == 1 {
			return i, wc[0]
		}
	}
	t.Fatalf("no completion after %d ACK timeouts", limit)
	return 0, verbs.WC{}
}

// TestRetryCntDeadPeer: with a peer that is gone and a receive path that
// keeps up, a WR fails with RETRY_EXC_ERR at the (RetryCnt+1)th ACK
// timeout without progress, as on InfiniBand.
func TestRetryCntDeadPeer(t *testing.T) {
	checkLeaks(t)
	fb, clk := newStepFabric(t, 4)
	a, b := fb.node(), fb.node()
	qa, _ := connect(t, a, b, stepTimeout)
	b.dev.Close()
	post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 64), RKey: b.mr.RKey()})
	n, wc := timeoutsUntilCompletion(t, fb, clk, a, 100)
	if wc.Status != verbs.StatusRetryExcErr {
		t.Fatalf("WR to a dead peer: %+v", wc)
	}
	if n != 7+1 {
		t.Fatalf("failed after %d ACK timeouts, want RetryCnt+1 = 8", n)
	}
}

// TestRetryCntStarvedReceiver: a peer that answers, but whose answers
// (like everything else reaching the requester's device, its own probes
// included) are processed only 12 timeouts late, as when the host's CPUs
// leave the device's receive path unscheduled. Timeouts while the receive
// path is behind do not count against RetryCnt, so the WR succeeds where
// 8 counted timeouts would have failed it.
func TestRetryCntStarvedReceiver(t *testing.T) {
	checkLeaks(t)
	fb, clk := newStepFabric(t, 5)
	a, b := fb.node(), fb.node()
	qa, _ := connect(t, a, b, stepTimeout)
	var late atomic.Bool
	late.Store(true)
	fb.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if late.Load() && to == a.dev.Addr() {
			return softnictest.Delay(12 * stepTimeout)
		}
		return softnictest.Pass
	})
	post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 64), RKey: b.mr.RKey()})
	n, wc := timeoutsUntilCompletion(t, fb, clk, a, 100)
	late.Store(false)
	if wc.Err() != nil {
		t.Fatalf("WR with a starved receive path: %v", wc.Err())
	}
	if got := qa.Info().Stats.Timeouts; got <= 7+1 || n != 12 {
		t.Fatalf("completed after %d timeouts with %d counted by the QP; want 12 and more than RetryCnt+1", n, got)
	}
	if st := qa.State(); st != verbs.StateRTS {
		t.Fatalf("QP in %v", st)
	}
}

// TestRetryCntHardBound: a dead peer and a receive path that never
// catches up (every probe lost) still fail the WR, after exactly
// RetryCnt+1+MaxUncountedTimeouts ACK timeouts.
func TestRetryCntHardBound(t *testing.T) {
	checkLeaks(t)
	fb, clk := newStepFabric(t, 6)
	a, b := fb.node(), fb.node()
	qa, _ := connect(t, a, b, stepTimeout)
	fb.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if to == a.dev.Addr() {
			return softnictest.Drop // no answers, no probes
		}
		return softnictest.Pass
	})
	post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 64), RKey: b.mr.RKey()})
	n, wc := timeoutsUntilCompletion(t, fb, clk, a, 100)
	if wc.Status != verbs.StatusRetryExcErr {
		t.Fatalf("WR to a dead peer: %+v", wc)
	}
	if want := 7 + 1 + softnic.MaxUncountedTimeouts; n != want {
		t.Fatalf("failed after %d ACK timeouts, want RetryCnt+1+MaxUncountedTimeouts = %d", n, want)
	}
}

// stalledClock is a manual clock on a host that stalls: while stall is
// set, every timer fires that much later than it asked for, as when the
// process is not scheduled.
type stalledClock struct {
	*softnictest.ManualClock
	stall atomic.Int64 // time.Duration
}

func (c *stalledClock) AfterFunc(d time.Duration, f func()) link.Timer {
	return c.ManualClock.AfterFunc(d+time.Duration(c.stall.Load()), f)
}

// TestRetryCntStalledHost: a timer that fires more than a whole timeout
// late shows that the host itself was stalled (and with it any peer on
// the same host), so it does not count against RetryCnt either; a dead
// peer still fails the WR, after RetryCnt+1+MaxUncountedTimeouts timeouts.
func TestRetryCntStalledHost(t *testing.T) {
	checkLeaks(t)
	fb, clk := newStepFabric(t, 7)
	sc := &stalledClock{ManualClock: clk}
	fb.clock = sc
	a, b := fb.node(), fb.node()
	qa, _ := connect(t, a, b, stepTimeout)
	b.dev.Close()
	sc.stall.Store(int64(2 * stepTimeout))
	post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 64), RKey: b.mr.RKey()})
	// Each step fires the one timer, 2 timeouts late.
	n, wc := stepsUntilCompletion(t, fb, clk, a, 3*stepTimeout, 100)
	if wc.Status != verbs.StatusRetryExcErr {
		t.Fatalf("WR to a dead peer: %+v", wc)
	}
	if want := 7 + 1 + softnic.MaxUncountedTimeouts; n != want {
		t.Fatalf("failed after %d ACK timeouts, want RetryCnt+1+MaxUncountedTimeouts = %d", n, want)
	}
}

// countingClock is a manual clock that counts the timers made through it
// and its readings.
type countingClock struct {
	*softnictest.ManualClock
	made atomic.Int64
	nows atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.nows.Add(1)
	return c.ManualClock.Now()
}

func (c *countingClock) AfterFunc(d time.Duration, f func()) link.Timer {
	c.made.Add(1)
	return c.ManualClock.AfterFunc(d, f)
}

// TestOneRetransmissionTimerPerQP: a QP keeps one ACK timer, not one per
// operation. READs that complete before their timeout make no timer after
// the first; the timer then fires once, finds nothing owed and lapses;
// and a timer scheduled for an earlier operation does not time out a
// later one early: it waits for that operation's own deadline.
func TestOneRetransmissionTimerPerQP(t *testing.T) {
	checkLeaks(t)
	fb, clk := newStepFabric(t, 5)
	cc := &countingClock{ManualClock: clk}
	fb.clock = cc // the devices' timers; the network keeps clk
	var dropResp atomic.Bool
	fb.net.SetFilter(func(_, _ netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if h.Op == wire.OpReadResp && dropResp.Load() {
			return softnictest.Drop
		}
		return softnictest.Pass
	})
	a, b := fb.node(), fb.node()
	qa, _ := connect(t, a, b, stepTimeout)
	read := func(id uint64) {
		t.Helper()
		post(t, qa, verbs.SendWR{ID: id, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: b.mr.RKey()})
	}
	read(1)
	if wc := poll(t, a.cq, 1, 0)[0]; wc.Err() != nil {
		t.Fatalf("READ: %v", wc.Err())
	}
	before := cc.made.Load()
	const n = 1000
	for i := range n {
		read(uint64(2 + i))
		if wc := poll(t, a.cq, 1, 0)[0]; wc.Err() != nil {
			t.Fatalf("READ %d: %v", 2+i, wc.Err())
		}
	}
	if made := cc.made.Load() - before; made != 0 {
		t.Fatalf("%d READs that completed within their timeout made %d timers, want 0 (one per QP, made by the first READ)", n, made)
	}
	// Idle: the timer fires once, owes nothing, and is not made again.
	pending := clk.Timers()
	clk.Advance(stepTimeout)
	if got := clk.Timers(); got >= pending {
		t.Fatalf("idle QP: %d timers pending after an ACK timeout, %d before: the timer did not lapse", got, pending)
	}
	made := cc.made.Load()
	clk.Advance(4 * stepTimeout)
	if cc.made.Load() != made {
		t.Fatal("idle QP: timers made while nothing was owed")
	}

	// A READ at 0 makes the timer (deadline T); it completes. A READ at
	// 0.9 T loses its response: its deadline is 1.9 T. The timer firing
	// at T must not count a timeout; the one at 1.9 T must.
	read(5000)
	poll(t, a.cq, 1, 0)
	clk.Advance(stepTimeout * 9 / 10)
	dropResp.Store(true)
	read(5001)
	clk.Advance(stepTimeout * 2 / 10) // 1.1 T: past the first READ's deadline
	if n := qa.Info().Stats.Timeouts; n != 0 {
		t.Fatalf("a timer made for an earlier READ timed out a later one at its own deadline (%d timeouts)", n)
	}
	clk.Advance(stepTimeout * 7 / 10) // 1.8 T
	if n := qa.Info().Stats.Timeouts; n != 0 {
		t.Fatalf("timed out at 1.8 T, before the READ's deadline 1.9 T (%d timeouts)", n)
	}
	dropResp.Store(false)             // the retransmission gets through
	clk.Advance(stepTimeout * 2 / 10) // 2.0 T
	if n := qa.Info().Stats.Timeouts; n != 1 {
		t.Fatalf("%d timeouts at 2.0 T, want 1 (deadline 1.9 T)", n)
	}
	if wc := poll(t, a.cq, 1, 0); len(wc) != 1 || wc[0].Err() != nil {
		t.Fatalf("the retransmitted READ: %v", wc)
	}
}
