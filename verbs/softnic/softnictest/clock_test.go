package softnictest

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/wire"
)

func TestManualClockStartsAtEpoch(t *testing.T) {
	if got := NewManualClock(time.Time{}).Now(); !got.Equal(Epoch) {
		t.Errorf("Now = %v, want %v", got, Epoch)
	}
	start := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
	if got := NewManualClock(start).Now(); !got.Equal(start) {
		t.Errorf("Now = %v, want %v", got, start)
	}
}

func TestManualClockFiresTimersInDeadlineOrder(t *testing.T) {
	clk := NewManualClock(time.Time{})
	var log []string
	add := func(name string, d time.Duration) {
		clk.AfterFunc(d, func() {
			log = append(log, fmt.Sprintf("%s@%v", name, clk.Now().Sub(Epoch)))
		})
	}
	add("c", 3*time.Second)
	add("a", time.Second)
	add("b1", 2*time.Second)
	add("b2", 2*time.Second) // same deadline: creation order
	add("late", 10*time.Second)

	clk.Advance(5 * time.Second)
	want := []string{"a@1s", "b1@2s", "b2@2s", "c@3s"}
	if !slices.Equal(log, want) {
		t.Fatalf("fired %v, want %v", log, want)
	}
	if got := clk.Now().Sub(Epoch); got != 5*time.Second {
		t.Errorf("after Advance(5s) Now is %v", got)
	}
	if clk.Timers() != 1 {
		t.Errorf("%d timers pending, want 1", clk.Timers())
	}
}

func TestManualClockStop(t *testing.T) {
	clk := NewManualClock(time.Time{})
	fired := false
	tm := clk.AfterFunc(time.Second, func() { fired = true })
	other := clk.AfterFunc(time.Second, func() {})
	if !tm.Stop() {
		t.Errorf("Stop of a pending timer reported false")
	}
	if tm.Stop() {
		t.Errorf("second Stop reported true")
	}
	clk.Advance(time.Second)
	if fired {
		t.Errorf("stopped timer fired")
	}
	if other.Stop() {
		t.Errorf("Stop of a fired timer reported true")
	}
}

func TestManualClockCallbacksCanScheduleTimers(t *testing.T) {
	clk := NewManualClock(time.Time{})
	var at []time.Duration
	var tick func()
	tick = func() {
		at = append(at, clk.Now().Sub(Epoch))
		clk.AfterFunc(300*time.Millisecond, tick)
	}
	clk.AfterFunc(0, tick)
	clk.Advance(0)
	clk.Advance(time.Second)
	want := []time.Duration{0, 300 * time.Millisecond, 600 * time.Millisecond, 900 * time.Millisecond}
	if !slices.Equal(at, want) {
		t.Errorf("periodic timer ran at %v, want %v", at, want)
	}
}

func TestManualClockRunNext(t *testing.T) {
	clk := NewManualClock(time.Time{})
	if clk.RunNext() {
		t.Fatalf("RunNext with nothing pending reported true")
	}
	n := 0
	clk.AfterFunc(time.Minute, func() { n++ })
	clk.AfterFunc(time.Minute, func() { n++ })
	clk.AfterFunc(time.Hour, func() { n++ })
	if !clk.RunNext() || n != 2 || clk.Now().Sub(Epoch) != time.Minute {
		t.Errorf("RunNext ran %d timers, Now %v; want both 1m timers at 1m", n, clk.Now().Sub(Epoch))
	}
}

func TestManualClockAdvanceNegativePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("Advance(-1) did not panic")
		}
	}()
	NewManualClock(time.Time{}).Advance(-1)
}

// TestManualClockInterleavesPacketsAndTimers checks that Advance delivers
// packets at their due times between timers, a packet due at a timer's
// deadline first, and that RunNext stops at packet deliveries too.
func TestManualClockInterleavesPacketsAndTimers(t *testing.T) {
	n, clk := manualNet(t, Config{Delay: 2 * time.Millisecond})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	var log []string
	rb.onDeliver = func(_ netip.AddrPort, h wire.Header, _ []byte) {
		log = append(log, fmt.Sprintf("pkt%d@%v", h.PSN, clk.Now().Sub(Epoch)))
	}
	for _, d := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond} {
		clk.AfterFunc(d, func() {
			log = append(log, fmt.Sprintf("timer@%v", clk.Now().Sub(Epoch)))
			if d == time.Millisecond { // a packet sent from a timer callback
				mustSend(t, a, packets(b.LocalAddr(), 1, 1))
			}
		})
	}
	mustSend(t, a, packets(b.LocalAddr(), 0, 1))
	clk.Advance(5 * time.Millisecond)
	want := []string{"timer@1ms", "pkt0@2ms", "timer@2ms", "pkt1@3ms", "timer@3ms"}
	if !slices.Equal(log, want) {
		t.Errorf("events %v, want %v", log, want)
	}

	log = nil
	mustSend(t, a, packets(b.LocalAddr(), 2, 1))
	if !clk.RunNext() || !slices.Equal(log, []string{"pkt2@7ms"}) {
		t.Errorf("RunNext: events %v, want pkt2@7ms", log)
	}
}

func TestNetworksCanShareAManualClock(t *testing.T) {
	clk := NewManualClock(time.Time{})
	n1 := NewNetwork(Config{Clock: clk, Delay: time.Millisecond})
	n2 := NewNetwork(Config{Clock: clk, Delay: 2 * time.Millisecond})
	a1, _ := startedLink(n1)
	b1, r1 := startedLink(n1)
	a2, _ := startedLink(n2)
	b2, r2 := startedLink(n2)
	mustSend(t, a1, packets(b1.LocalAddr(), 0, 1))
	mustSend(t, a2, packets(b2.LocalAddr(), 0, 1))
	clk.Advance(5 * time.Millisecond)
	if d1, d2 := r1.deliveries(), r2.deliveries(); len(d1) != 1 || len(d2) != 1 ||
		d1[0].At != time.Millisecond || d2[0].At != 2*time.Millisecond {
		t.Errorf("deliveries %+v and %+v", d1, d2)
	}

	// A closed network is no longer driven by the clock.
	mustSend(t, a2, packets(b2.LocalAddr(), 1, 1))
	n2.Close()
	if _, ok := n2.nextDue(); ok {
		t.Errorf("closed network still has deliveries due")
	}
	clk.Advance(5 * time.Millisecond)
	n1.Close()
	if clk.RunNext() {
		t.Errorf("events pending after both networks closed")
	}
}
