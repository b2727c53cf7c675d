// Package clock is the time source of krfs: every timer, timeout and time
// read of the engine (softnic), the control plane (qpcore) and the meta
// service goes through a Clock, so that tests can run them on manual time
// (clocktest.Manual) and never depend on how busy the machine is.
//
// Production code uses System, the real clock. The helpers below build the
// usual shapes on any Clock: a one-shot channel (After), a periodic tick
// (NewTicker) and a context deadline (WithTimeout); on System, NewTicker
// is a time.Ticker and WithTimeout is context.WithTimeout. With a manual
// clock all of them fire only when the test advances time.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock is a source of time and timers.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f after d. With System, f runs in its own
	// goroutine; a manual clock may run it on the goroutine that moves
	// time, so f must not block.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable timer from a Clock.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it
	// did.
	Stop() bool
}

// System is the real clock (package time).
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (System) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// OrSystem returns c, or System if c is nil.
func OrSystem(c Clock) Clock {
	if c == nil {
		return System{}
	}
	return c
}

// Since returns the time elapsed on c since t.
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// After returns a channel closed once d has passed on c, and a function
// that stops the timer (call it when the channel is no longer wanted).
func After(c Clock, d time.Duration) (<-chan struct{}, func() bool) {
	ch := make(chan struct{})
	t := c.AfterFunc(d, func() { close(ch) })
	return ch, t.Stop
}

// WithTimeout is context.WithTimeout on c: the returned context is
// cancelled with context.DeadlineExceeded once d has passed on c, or when
// the returned cancel function is called, or when parent ends.
func WithTimeout(parent context.Context, c Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := c.(System); ok {
		return context.WithTimeout(parent, d)
	}
	ctx, cancel := context.WithCancelCause(parent)
	t := c.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return &causeCtx{ctx}, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// causeCtx reports its cancellation cause as its error, so that a manual
// clock's deadline reads as context.DeadlineExceeded like a real one.
type causeCtx struct{ context.Context }

func (c *causeCtx) Err() error {
	if c.Context.Err() == nil {
		return nil
	}
	return context.Cause(c.Context)
}

// Ticker delivers the time on C every period of a Clock, dropping ticks
// nobody took (like time.Ticker). With a manual clock it ticks only as the
// test advances time. On System it is a time.Ticker: the runtime's own
// periodic timer, which an idle process pays least for (a ticker re-armed
// with AfterFunc at every tick made a new timer, a goroutine and a wake-up
// of the runtime's network poller each time: about 2% of a vCPU for an
// idle krfs daemon, whose dispatcher ticks every 20 ms).
type Ticker struct {
	C <-chan time.Time

	sys *time.Ticker // on System

	clock  Clock
	period time.Duration
	c      chan time.Time

	mu      sync.Mutex // guards t and stopped
	t       Timer
	stopped bool
}

// NewTicker returns a started Ticker; stop it with Stop.
func NewTicker(c Clock, period time.Duration) *Ticker {
	if _, ok := c.(System); ok {
		st := time.NewTicker(period)
		return &Ticker{C: st.C, sys: st}
	}
	ch := make(chan time.Time, 1)
	t := &Ticker{C: ch, clock: c, period: period, c: ch}
	t.arm()
	return t
}

func (t *Ticker) arm() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.t = t.clock.AfterFunc(t.period, t.fire)
	}
}

func (t *Ticker) fire() {
	select {
	case t.c <- t.clock.Now():
	default:
	}
	t.arm()
}

// Stop stops the ticker; no tick is sent after it returns except one
// already queued on C.
func (t *Ticker) Stop() {
	if t.sys != nil {
		t.sys.Stop()
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if t.t != nil {
		t.t.Stop()
	}
}
