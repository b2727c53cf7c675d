package clocktest

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestManualStartsAtEpoch(t *testing.T) {
	if got := NewManual(time.Time{}).Now(); !got.Equal(Epoch) {
		t.Errorf("Now = %v, want %v", got, Epoch)
	}
	start := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
	if got := NewManual(start).Now(); !got.Equal(start) {
		t.Errorf("Now = %v, want %v", got, start)
	}
}

func TestManualFiresTimersInDeadlineOrder(t *testing.T) {
	clk := NewManual(time.Time{})
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

func TestManualStop(t *testing.T) {
	clk := NewManual(time.Time{})
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

func TestManualCallbacksCanScheduleTimers(t *testing.T) {
	clk := NewManual(time.Time{})
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

func TestManualRunNext(t *testing.T) {
	clk := NewManual(time.Time{})
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

func TestManualAdvanceNegativePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("Advance(-1) did not panic")
		}
	}()
	NewManual(time.Time{}).Advance(-1)
}

// TestManualInterleavesPacketsAndTimers checks that Advance delivers
// packets at their due times between timers, a packet due at a timer's
// deadline first, and that RunNext stops at packet deliveries too.
