// Package clocktest is the manual clock of krfs's tests: time moves only
// when the test says, so that timeouts, retransmissions and leases are
// tested deterministically, whatever else the machine is doing.
//
//	clk := clocktest.NewManual(time.Time{})
//	t := clk.AfterFunc(time.Second, f)
//	clk.Advance(time.Second) // f runs here, on this goroutine
//
// softnictest's in-memory network attaches to a Manual clock as a Source,
// so that packet deliveries and timers run in one time order.
package clocktest

import (
	"container/heap"
	"sync"
	"time"

	"github.com/krfs/krfs/clock"
)

// Epoch is the time at which a Manual clock created from the zero time
// starts. It is a fixed, wall-clock-only instant, so logs of manual-time
// runs are identical from one run to the next.
var Epoch = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)

// Manual is a clock.Clock whose time moves only when the test calls
// Advance or RunNext.
//
// Timer callbacks do NOT run in their own goroutines, unlike
// clock.System: Advance calls each due callback synchronously on its
// own goroutine, one at a time, in deadline order (ties in the order the
// timers were created), with Now reporting the timer's deadline during the
// call. A callback may call Now, AfterFunc and Stop; timers it schedules
// fire within the same Advance if their deadline is not past the target.
// A callback must not call Advance or RunNext (that deadlocks), nor block
// on work that needs another timer to fire. Neither may the handler of an
// event of an attached Source, since Advance runs those too.
//
// The events of every attached Source (a simulated network's packet
// deliveries, softnictest.Network) are events of the clock too: Advance
// runs one when time reaches its due time, and an event due at the same
// instant as a timer runs before the timer fires.
type Manual struct {
	// advMu serializes Advance and RunNext: one goroutine moves time.
	advMu sync.Mutex

	mu     sync.Mutex // guards the fields below
	now    time.Time
	timers timerQueue
	seq    uint64   // creation order of timers
	srcs   []Source // whose events are clock events; replaced, never mutated in place
}

var _ clock.Clock = (*Manual)(nil)

// Source is something whose events the clock runs in time order with its
// timers: a simulated network's packet deliveries.
type Source interface {
	// NextDue returns when its earliest pending event is due. The clock
	// calls it without holding its own lock, so it may read the clock.
	NextDue() (at time.Time, ok bool)
	// RunDue runs every event due at now (the clock reads now meanwhile).
	RunDue(now time.Time)
}

// NewManual returns a manual clock reading start, or Epoch if start is
// the zero time.
func NewManual(start time.Time) *Manual {
	if start.IsZero() {
		start = Epoch
	}
	return &Manual{now: start.Round(0)}
}

// Now returns the clock's time.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arranges for f to be called by the Advance that moves the
// clock to Now()+d or beyond. A timer with d <= 0 fires at the next
// Advance, even Advance(0).
func (c *Manual) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &manualTimer{c: c, at: c.now.Add(max(d, 0)), seq: c.seq, f: f}
	heap.Push(&c.timers, t)
	return t
}

// Timers returns the number of timers that have neither fired nor been
// stopped.
func (c *Manual) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Advance moves the clock forward by d, running every timer and Source
// event that falls due on the way, in time order; it returns when the
// clock reads the old time plus d and nothing due remains. It panics if d
// is negative.
//
// Advance does not return while events keep falling due at the current
// instant: two handlers that answer each other with zero-delay events
// forever make it spin.
func (c *Manual) Advance(d time.Duration) {
	if d < 0 {
		panic("clocktest: Manual.Advance with a negative duration")
	}
	c.advMu.Lock()
	defer c.advMu.Unlock()
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	c.runUntil(target)
}

// RunNext moves the clock to the earliest pending event (a timer or a
// Source's event) and runs everything due at that instant. It reports
// false, leaving the clock alone, if nothing is pending.
func (c *Manual) RunNext() bool {
	c.advMu.Lock()
	defer c.advMu.Unlock()
	at, ok := c.nextDelivery()
	c.mu.Lock()
	if len(c.timers) > 0 && (!ok || c.timers[0].at.Before(at)) {
		at, ok = c.timers[0].at, true
	}
	c.mu.Unlock()
	if ok {
		c.runUntil(at)
	}
	return ok
}

// runUntil runs events due at or before target, then sets the clock to
// target if it is still earlier. The caller holds advMu.
func (c *Manual) runUntil(target time.Time) {
	for c.step(target) {
	}
	c.mu.Lock()
	c.now = later(c.now, target)
	c.mu.Unlock()
}

// step runs the earliest event due at or before target: the due events
// of every Source if one is due no later than the earliest timer, else
// that timer. It reports whether it ran anything.
func (c *Manual) step(target time.Time) bool {
	pktAt, havePkt := c.nextDelivery()
	havePkt = havePkt && !pktAt.After(target)

	c.mu.Lock()
	var t *manualTimer
	if len(c.timers) > 0 && !c.timers[0].at.After(target) {
		t = c.timers[0]
	}
	if havePkt && (t == nil || !pktAt.After(t.at)) {
		c.now = later(c.now, pktAt)
		now, srcs := c.now, c.srcs
		c.mu.Unlock()
		for _, s := range srcs {
			s.RunDue(now)
		}
		return true
	}
	if t == nil {
		c.mu.Unlock()
		return false
	}
	heap.Pop(&c.timers)
	c.now = later(c.now, t.at)
	c.mu.Unlock()
	t.f()
	return true
}

// nextDelivery returns the earliest due time of an event of any attached
// Source. It must be called without c.mu held: sources read the clock
// while holding their own locks.
func (c *Manual) nextDelivery() (at time.Time, ok bool) {
	c.mu.Lock()
	srcs := c.srcs
	c.mu.Unlock()
	for _, s := range srcs {
		if t, has := s.NextDue(); has && (!ok || t.Before(at)) {
			at, ok = t, true
		}
	}
	return at, ok
}

// Attach makes s's events events of the clock.
func (c *Manual) Attach(s Source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	srcs := make([]Source, 0, len(c.srcs)+1)
	c.srcs = append(append(srcs, c.srcs...), s)
}

// Detach undoes Attach.
func (c *Manual) Detach(s Source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	srcs := make([]Source, 0, len(c.srcs))
	for _, m := range c.srcs {
		if m != s {
			srcs = append(srcs, m)
		}
	}
	c.srcs = srcs
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// manualTimer is a pending call of a Manual clock.
type manualTimer struct {
	c     *Manual
	at    time.Time
	seq   uint64
	f     func()
	index int // position in c.timers; -1 once fired or stopped (guarded by c.mu)
}

// Stop prevents the call if the timer has not fired; it reports whether
// it did.
func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.c.timers, t.index)
	return true
}

// timerQueue is a min-heap of timers by deadline, then creation order; it
// implements container/heap.Interface and keeps manualTimer.index.
type timerQueue []*manualTimer

func (q timerQueue) Len() int { return len(q) }
func (q timerQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q timerQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = i
	q[j].index = j
}
func (q *timerQueue) Push(x any) {
	t := x.(*manualTimer)
	t.index = len(*q)
	*q = append(*q, t)
}
func (q *timerQueue) Pop() any {
	old := *q
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*q = old[:len(old)-1]
	return t
}
