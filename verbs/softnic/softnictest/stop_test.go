package softnictest

import (
	"testing"
	"time"

	"github.com/krfs/krfs/internal/leaktest"
)

// TestStopReceiveHoldsThenDelivers: a stopped link gets nothing, its
// packets wait (the clock moves past them), and Resume delivers them in
// order.
func TestStopReceiveHoldsThenDelivers(t *testing.T) {
	leaktest.Check(t)
	n, clk := manualNet(t, Config{Seed: 1})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	b.StopReceive()
	mustSend(t, a, packets(b.LocalAddr(), 0, 10))
	clk.Advance(time.Second)
	if got := len(rb.deliveries()); got != 0 || n.QueuedNow() != 0 {
		t.Fatalf("stopped link: %d delivered, %d due now", got, n.QueuedNow())
	}
	b.ResumeReceive()
	if n.QueuedNow() != 10 {
		t.Fatalf("after resume: %d due now, want 10", n.QueuedNow())
	}
	clk.Advance(0)
	if got := rb.psns(); len(got) != 10 || got[0] != 0 || got[9] != 9 {
		t.Fatalf("after resume: %v", got)
	}
}

// TestSetRxRatePaces: at 1,000 packets per second, 10 packets sent at once
// are delivered 1 ms apart.
func TestSetRxRatePaces(t *testing.T) {
	leaktest.Check(t)
	n, clk := manualNet(t, Config{Seed: 1})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	b.SetRxRate(1000)
	mustSend(t, a, packets(b.LocalAddr(), 0, 10))
	clk.Advance(4500 * time.Microsecond)
	if got := len(rb.deliveries()); got != 5 {
		t.Fatalf("%d delivered in 4.5 ms at 1,000/s, want 5", got)
	}
	clk.Advance(10 * time.Millisecond)
	d := rb.deliveries()
	if len(d) != 10 || d[9].At-d[0].At != 9*time.Millisecond {
		t.Fatalf("%d delivered, first at %v, last at %v", len(d), d[0].At, d[len(d)-1].At)
	}
}

// TestProcessClockHoldsTimers: a stopped process's timers fire at
// Continue, in order; one stopped meanwhile does not.
func TestProcessClockHoldsTimers(t *testing.T) {
	clk := NewManualClock(time.Time{})
	p := NewProcessClock(clk)
	var fired []int
	p.AfterFunc(time.Second, func() { fired = append(fired, 1) })
	t2 := p.AfterFunc(2*time.Second, func() { fired = append(fired, 2) })
	p.AfterFunc(3*time.Second, func() { fired = append(fired, 3) })
	p.Stop()
	clk.Advance(5 * time.Second)
	if len(fired) != 0 {
		t.Fatalf("fired while stopped: %v", fired)
	}
	if !t2.Stop() {
		t.Fatal("a held timer could not be stopped")
	}
	p.Continue()
	if len(fired) != 2 || fired[0] != 1 || fired[1] != 3 {
		t.Fatalf("fired at Continue: %v, want [1 3]", fired)
	}
	p.AfterFunc(time.Second, func() { fired = append(fired, 4) })
	clk.Advance(time.Second)
	if len(fired) != 3 {
		t.Fatalf("after Continue: %v", fired)
	}
}
