package softnic

import (
	"context"
	"fmt"
	"sync"

	"github.com/krfs/krfs/verbs"
)

// cq is a completion queue: a bounded FIFO of WCs with a notification
// channel, so a consumer can sleep instead of spinning.
type cq struct {
	dev    *Device
	notify chan struct{}

	mu        sync.Mutex // guards the fields below
	wcs       []verbs.WC // ring
	head, n   int
	overflows uint64
	destroyed bool
}

var _ verbs.CQ = (*cq)(nil)

func newCQ(d *Device, depth int) *cq {
	return &cq{dev: d, notify: make(chan struct{}, 1), wcs: make([]verbs.WC, depth)}
}

// push adds a completion. On overflow the completion is dropped and
// counted: like a hardware CQ overrun, that is the consumer's error.
func (c *cq) push(wc verbs.WC) {
	c.mu.Lock()
	if c.n == len(c.wcs) {
		c.overflows++
		c.mu.Unlock()
		return
	}
	c.wcs[(c.head+c.n)%len(c.wcs)] = wc
	c.n++
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *cq) Poll(out []verbs.WC) int {
	c.mu.Lock()
	k := 0
	for k < len(out) && c.n > 0 {
		out[k] = c.wcs[c.head]
		c.head = (c.head + 1) % len(c.wcs)
		c.n--
		k++
	}
	more := c.n > 0
	c.mu.Unlock()
	if more {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
	return k
}

func (c *cq) Wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		n, dead := c.n, c.destroyed
		c.mu.Unlock()
		if n > 0 {
			return nil
		}
		if dead {
			return verbs.ErrDestroyed
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *cq) Notify() <-chan struct{} { return c.notify }

// Overflows reports how many completions were dropped because the CQ was
// full.
func (c *cq) Overflows() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.overflows
}

func (c *cq) Destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return fmt.Errorf("%w: CQ", verbs.ErrDestroyed)
	}
	c.destroyed = true
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return nil
}
