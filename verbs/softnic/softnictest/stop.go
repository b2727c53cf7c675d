package softnictest

import (
	"sync"
	"time"

	"github.com/krfs/krfs/clock"
)

// StopReceive stops delivery to l, as when the process that owns the
// socket is stopped (SIGSTOP): packets sent to it queue up to
// Config.QueueLimit (more are dropped, like a full socket buffer) and wait
// until ResumeReceive. A stopped link's packets are not events of a manual
// clock, so the clock moves past them.
func (l *Link) StopReceive() {
	l.net.mu.Lock()
	l.rxStopped = true
	l.net.mu.Unlock()
}

// ResumeReceive delivers to l again, starting with what queued while it
// was stopped (due at once: its due times have passed).
func (l *Link) ResumeReceive() {
	l.net.mu.Lock()
	l.rxStopped = false
	l.net.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// SetRxRate limits delivery to l to pps packets per second of the
// network's clock (0: no limit), like a process that takes 1/pps to handle
// each packet: the rest wait in the queue, which may fill up and drop
// (Config.QueueLimit). For simulating a loaded server on a manual clock.
func (l *Link) SetRxRate(pps int) {
	l.net.mu.Lock()
	defer l.net.mu.Unlock()
	l.rxEvery, l.rxFree = 0, time.Time{}
	if pps > 0 {
		l.rxEvery = time.Second / time.Duration(pps)
	}
}

// QueuedNow returns the number of packets due now (or earlier) at started
// links whose receive is neither stopped nor paced past now (SetRxRate),
// and those being delivered: what AutoFlush goroutines are about to
// deliver. A test that drives a manual clock waits for it to reach zero
// before it moves time on.
func (n *Network) QueuedNow() int {
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.delivering
	for _, l := range n.order {
		if !l.started || l.closed || l.rxStopped || l.rxFree.After(now) {
			continue
		}
		for _, p := range l.queue {
			if !p.at.After(now) {
				q++
			}
		}
	}
	return q
}

// ProcessClock is one process's view of a shared clock, for simulating a
// process that is stopped and continued (SIGSTOP, SIGCONT): its time
// keeps moving with the shared clock, but while it is stopped none of its
// timers fire; the ones that fell due fire at Continue, in deadline order,
// as a continued process finds them all expired at once. Give it to the
// process's device and engines; with StopReceive on the process's links,
// the process neither hears nor does anything while stopped.
type ProcessClock struct {
	base clock.Clock

	mu      sync.Mutex
	stopped bool
	held    []*processTimer // timers that fell due while stopped, in order
}

var _ clock.Clock = (*ProcessClock)(nil)

// NewProcessClock returns a running process clock on base.
func NewProcessClock(base clock.Clock) *ProcessClock { return &ProcessClock{base: base} }

// Now returns the shared clock's time.
func (c *ProcessClock) Now() time.Time { return c.base.Now() }

// AfterFunc calls f after d of the shared clock, or at Continue if the
// process is stopped then.
func (c *ProcessClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := &processTimer{c: c, f: f}
	t.base = c.base.AfterFunc(d, func() {
		c.mu.Lock()
		if c.stopped {
			c.held = append(c.held, t)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		f()
	})
	return t
}

// processTimer is a ProcessClock timer: stopping it while it is held
// (due, the process stopped) keeps it from running at Continue.
type processTimer struct {
	c    *ProcessClock
	f    func()
	base clock.Timer
}

func (t *processTimer) Stop() bool {
	if t.base.Stop() {
		return true
	}
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, h := range t.c.held {
		if h == t {
			t.c.held = append(t.c.held[:i], t.c.held[i+1:]...)
			return true
		}
	}
	return false
}

// Stop stops the process's timers.
func (c *ProcessClock) Stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
}

// Continue runs the callbacks that fell due while the process was stopped,
// on the calling goroutine, then lets its timers fire again.
func (c *ProcessClock) Continue() {
	for {
		c.mu.Lock()
		fs := c.held
		c.held = nil
		if len(fs) == 0 {
			c.stopped = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		for _, t := range fs {
			t.f()
		}
	}
}
