package fs

import (
	"context"
	"testing"
	"time"
)

// TestDeadlinesShareAWindow: operations that start within one window share
// its context; the next window gets a new one; every operation's deadline
// lies between Timeout and Timeout+deadlineWindow after its start; close
// cancels the open window.
func TestDeadlinesShareAWindow(t *testing.T) {
	start := time.Now()
	now := start
	d := &deadlines{timeout: 2 * time.Second, now: func() time.Time { return now }}
	bound := func(ctx context.Context, at time.Time) {
		t.Helper()
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("no deadline")
		}
		if left := dl.Sub(at); left < d.timeout || left > d.timeout+deadlineWindow {
			t.Fatalf("deadline %v after the start, want within [%v, %v]", left, d.timeout, d.timeout+deadlineWindow)
		}
	}
	a := d.get()
	bound(a, now)
	now = now.Add(deadlineWindow - time.Nanosecond)
	if b := d.get(); b != a {
		t.Fatal("an operation in the same window got another context")
	}
	bound(a, now)
	now = now.Add(time.Nanosecond)
	c := d.get()
	if c == a {
		t.Fatal("an operation after the window got its context")
	}
	bound(c, now)
	if a.Err() != nil || c.Err() != nil {
		t.Fatalf("contexts ended early: %v, %v", a.Err(), c.Err())
	}
	d.close()
	if c.Err() == nil {
		t.Fatal("close left the open window's context running")
	}
	if e := d.get(); e == c || e.Err() != nil {
		t.Fatalf("after close: %v (same: %v)", e.Err(), e == c)
	}
	d.close()
}

// TestDeadlinesAllocateNothing: handing out a window's context allocates
// nothing.
func TestDeadlinesAllocateNothing(t *testing.T) {
	d := &deadlines{timeout: time.Hour, now: time.Now}
	defer d.close()
	d.get()
	if n := testing.AllocsPerRun(1000, func() { d.get() }); n != 0 {
		t.Fatalf("%v allocations per get", n)
	}
}
