package meta

import (
	"sync"
	"time"

	"github.com/krfs/krfs/verbs/softnic/link"
)

// ticker delivers a tick on C every period of a link.Clock, dropping
// ticks nobody took (like time.Ticker). With a manual clock it ticks only
// as the test advances time.
type ticker struct {
	C <-chan struct{}

	clock  link.Clock
	period time.Duration
	c      chan struct{}

	mu      sync.Mutex // guards t and stopped
	t       link.Timer
	stopped bool
}

func newTicker(clock link.Clock, period time.Duration) *ticker {
	c := make(chan struct{}, 1)
	t := &ticker{C: c, clock: clock, period: period, c: c}
	t.arm()
	return t
}

func (t *ticker) arm() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.t = t.clock.AfterFunc(t.period, t.fire)
	}
}

func (t *ticker) fire() {
	select {
	case t.c <- struct{}{}:
	default:
	}
	t.arm()
}

// Stop stops the ticker; no tick is sent after it returns except one
// already queued on C.
func (t *ticker) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if t.t != nil {
		t.t.Stop()
	}
}
