package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/clock/clocktest"
)

func TestAfterFiresOnlyWhenTimeMoves(t *testing.T) {
	clk := clocktest.NewManual(time.Time{})
	ch, stop := clock.After(clk, 10*time.Millisecond)
	clk.Advance(9 * time.Millisecond)
	select {
	case <-ch:
		t.Fatal("fired early")
	default:
	}
	clk.Advance(time.Millisecond)
	select {
	case <-ch:
	default:
		t.Fatal("did not fire at its deadline")
	}
	if stop() {
		t.Fatal("Stop after firing reported a stopped timer")
	}
	_, stop = clock.After(clk, time.Second)
	if !stop() || clk.Timers() != 0 {
		t.Fatalf("Stop left %d timers", clk.Timers())
	}
}

func TestWithTimeout(t *testing.T) {
	clk := clocktest.NewManual(time.Time{})
	ctx, cancel := clock.WithTimeout(context.Background(), clk, time.Second)
	defer cancel()
	clk.Advance(999 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatalf("ended early: %v", ctx.Err())
	}
	clk.Advance(time.Millisecond)
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err %v, want DeadlineExceeded", ctx.Err())
	}
	ctx2, cancel2 := clock.WithTimeout(context.Background(), clk, time.Second)
	cancel2()
	if !errors.Is(ctx2.Err(), context.Canceled) || clk.Timers() != 0 {
		t.Fatalf("cancel: %v, %d timers left", ctx2.Err(), clk.Timers())
	}
	// The system clock gives the standard library's context.
	sctx, scancel := clock.WithTimeout(context.Background(), clock.System{}, time.Hour)
	defer scancel()
	if _, ok := sctx.Deadline(); !ok {
		t.Fatal("system-clock context has no deadline")
	}
}

func TestTickerDropsUntakenTicks(t *testing.T) {
	clk := clocktest.NewManual(time.Time{})
	tk := clock.NewTicker(clk, 10*time.Millisecond)
	clk.Advance(35 * time.Millisecond) // three ticks, one kept
	n := 0
	for {
		select {
		case <-tk.C:
			n++
			continue
		default:
		}
		break
	}
	if n != 1 {
		t.Fatalf("%d ticks queued, want 1", n)
	}
	tk.Stop()
	clk.Advance(time.Second)
	select {
	case <-tk.C:
		t.Fatal("tick after Stop")
	default:
	}
	if clk.Timers() != 0 {
		t.Fatalf("%d timers after Stop", clk.Timers())
	}
}

// TestSystemTicker: on the real clock the ticker is a time.Ticker; it
// delivers ticks in time order until stopped.
func TestSystemTicker(t *testing.T) {
	tk := clock.NewTicker(clock.System{}, time.Millisecond)
	defer tk.Stop()
	guard := time.After(time.Minute) // a hang guard, not a speed limit
	var last time.Time
	for range 3 {
		select {
		case now := <-tk.C:
			if !now.After(last) {
				t.Fatalf("tick at %v after one at %v", now, last)
			}
			last = now
		case <-guard:
			t.Fatal("no tick within a minute")
		}
	}
}

func TestOrSystemAndSince(t *testing.T) {
	if _, ok := clock.OrSystem(nil).(clock.System); !ok {
		t.Fatal("OrSystem(nil) is not the system clock")
	}
	clk := clocktest.NewManual(time.Time{})
	if clock.OrSystem(clk) != clock.Clock(clk) {
		t.Fatal("OrSystem replaced a clock")
	}
	t0 := clk.Now()
	clk.Advance(3 * time.Second)
	if d := clock.Since(clk, t0); d != 3*time.Second {
		t.Fatalf("Since %v", d)
	}
}
