package qpcore

import (
	"context"
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// waitUntil yields until cond holds: the goroutine under test reaches a
// state the test can see (no time limit; the test's -timeout guards).
func waitUntil(cond func() bool) {
	for !cond() {
		runtime.Gosched()
	}
}

// TestRCPoolFull: an RC-only connection that finds the RC pool full and
// nothing idle to reclaim waits, looking again every Tick, and fails with
// ErrRCPoolFull (EBUSY) when its deadline passes; a slot freed meanwhile
// is taken at once. On a manual clock: the Tick and the deadline are
// events, not waits.
func TestRCPoolFull(t *testing.T) {
	clk := softnictest.NewManualClock(time.Time{})
	n := &Node{cfg: Config{RCCap: 1, Tick: 10 * time.Millisecond, PeerTimeout: time.Second}, clock: clk}
	n.rcs.count = 1 // one RC QP busy, not reclaimable (not listed)

	ctx, cancel := clock.WithTimeout(context.Background(), clk, n.cfg.PeerTimeout)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- n.reserveRCWait(ctx) }()
	// The deadline and the first Tick are pending: the waiter sleeps.
	waitUntil(func() bool { return clk.Timers() == 2 })
	for range 5 {
		waits := n.stats.rcSlotWaits.Load()
		clk.Advance(n.cfg.Tick)
		// It looked again and went back to sleep on a new Tick.
		waitUntil(func() bool { return n.stats.rcSlotWaits.Load() > waits && clk.Timers() == 2 })
	}
	select {
	case err := <-res:
		t.Fatalf("reserveRCWait returned before its deadline: %v", err)
	default:
	}
	clk.Advance(n.cfg.PeerTimeout)
	err := <-res
	if !errors.Is(err, ErrRCPoolFull) || !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("reserveRCWait past its deadline = %v, want ErrRCPoolFull (EBUSY)", err)
	}
	if n.rcs.count != 1 {
		t.Fatalf("a failed wait changed the pool: %d reserved", n.rcs.count)
	}

	// A slot freed while a connection waits goes to it.
	// Read the count before the waiter starts: it may wait before this
	// goroutine runs again.
	waits := n.stats.rcSlotWaits.Load()
	go func() { res <- n.reserveRCWait(context.Background()) }()
	waitUntil(func() bool { return n.stats.rcSlotWaits.Load() > waits })
	n.rcs.free()
	if err := <-res; err != nil {
		t.Fatalf("reserveRCWait after a slot was freed: %v", err)
	}
	n.rcs.mu.Lock()
	defer n.rcs.mu.Unlock()
	if n.rcs.count != 1 {
		t.Fatalf("after the waiter took the freed slot: %d reserved, want 1", n.rcs.count)
	}
}
