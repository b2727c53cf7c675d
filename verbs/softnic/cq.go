package softnic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/link"
)

// cq is a completion queue: a bounded FIFO of WCs with a notification
// channel, so a consumer can sleep instead of spinning.
type cq struct {
	dev    *Device
	notify chan struct{}
	driven atomic.Int32 // Drive calls in progress: completions do not signal notify
	queued atomic.Int32 // n, readable without mu (Pending); written under mu
	drv    link.Driver  // the device's link, if it can drive (else nil)

	mu        sync.Mutex // guards the fields below
	wcs       []verbs.WC // ring
	head, n   int
	overflows uint64
	overrun   bool // EventCQErr was raised
	destroyed bool
}

var _ verbs.DrivenCQ = (*cq)(nil)

func newCQ(d *Device, depth int) *cq {
	c := &cq{dev: d, notify: make(chan struct{}, 1), wcs: make([]verbs.WC, depth)}
	c.drv, _ = d.link.(link.Driver)
	return c
}

// push adds a completion and reports whether it signalled Notify. On
// overflow the completion is dropped and counted, and the first overflow
// raises EventCQErr: like a hardware CQ overrun, that is the consumer's
// error. An error completion's undefined fields are poisoned first.
func (c *cq) push(wc verbs.WC) bool {
	if wc.Status != verbs.StatusSuccess {
		poison(&wc)
	}
	c.mu.Lock()
	if c.n == len(c.wcs) {
		c.overflows++
		first := !c.overrun
		c.overrun = true
		c.mu.Unlock()
		if first {
			c.dev.raise(verbs.Event{Type: verbs.EventCQErr, CQ: c})
		}
		return false
	}
	c.wcs[(c.head+c.n)%len(c.wcs)] = wc
	c.n++
	c.queued.Store(int32(c.n))
	c.mu.Unlock()
	if c.driven.Load() > 0 {
		// The drivers' ready polls it; one blocked receiving must look.
		c.dev.wakeDrivers()
		return false
	}
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return true
}

// Poison values of an error completion's undefined fields.
const (
	poisonByteLen = 0xbadc0de
	poisonQPN     = 0xbad0bd
	poisonImm     = 0xdeadbeef
)

// poison fills the fields of an error completion that verbs leaves
// undefined (as ibv_poll_cq does: mlx5 never writes them on the error
// path) with values that mislead whoever reads them: a receive is marked
// as a send and a send as a receive, with a byte count, an immediate and a
// source that were never there.
func poison(wc *verbs.WC) {
	if wc.Op == verbs.OpRecv || wc.Op == verbs.OpRecvWriteImm {
		wc.Op = verbs.OpWrite
	} else {
		wc.Op = verbs.OpRecv
	}
	wc.ByteLen, wc.Imm, wc.HasImm = poisonByteLen, poisonImm, true
	wc.SrcAddr, wc.SrcQPN = netip.AddrPort{}, poisonQPN
}

// Drive implements verbs.DrivenCQ.
func (c *cq) Drive(ctx context.Context, wake <-chan struct{}, ready func() bool) error {
	drv := c.drv
	if drv == nil {
		return c.waitReady(ctx, wake, ready)
	}
	if ctx.Done() != nil && c.wakeOnDone(ctx) {
		// A caller blocked receiving looks at ctx only every
		// link.DonePoll: wake it.
		stop := context.AfterFunc(ctx, drv.Wake)
		defer stop()
	}
	c.driven.Add(1)
	err := drv.Drive(ctx.Done(), wake, ready)
	if c.driven.Add(-1) == 0 {
		// A completion pushed while we drove did not signal Notify: do it
		// now for whoever else consumes this CQ.
		if c.queued.Load() > 0 {
			select {
			case c.notify <- struct{}{}:
			default:
			}
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, link.ErrDone):
		return ctx.Err()
	case errors.Is(err, net.ErrClosed):
		return verbs.ErrClosed
	}
	return err
}

// wakeAhead is how far away a context's deadline must be for a driver to
// go without a wake-up when it ends (see wakeOnDone).
const wakeAhead = 5 * link.DonePoll

// wakeOnDone reports whether a driver must be woken when ctx ends. A
// driver holding the receive token looks at ctx at least every
// link.DonePoll, so a context whose deadline is wakeAhead or more away
// needs no wake-up: it is seen within DonePoll of its deadline, or of an
// earlier cancel. Only a context without a deadline, or one ending
// sooner, gets one: registering it (context.AfterFunc) costs about
// 0.7 us and five allocations per operation, which every caller with a
// timeout would pay.
func (c *cq) wakeOnDone(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return !ok || dl.Sub(c.dev.clock.Now()) < wakeAhead
}

// waitReady is Drive on a link that cannot drive: sleep on the CQ's
// notifications and on wake.
func (c *cq) waitReady(ctx context.Context, wake <-chan struct{}, ready func() bool) error {
	for !ready() {
		select {
		case <-c.notify:
		case <-wake:
		case <-ctx.Done():
			if ready() {
				return nil
			}
			return ctx.Err()
		}
	}
	return nil
}

// Pending implements verbs.DrivenCQ.
func (c *cq) Pending() bool { return c.queued.Load() > 0 }

// Wake implements verbs.DrivenCQ.
func (c *cq) Wake() {
	if c.driven.Load() > 0 {
		c.dev.wakeDrivers()
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
	c.queued.Store(int32(c.n))
	more := c.n > 0
	if !more {
		// Empty: start again at the first slot, so that a CQ used one
		// completion at a time keeps touching the same, cached memory
		// instead of walking its whole ring.
		c.head = 0
	}
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
		c.dev.stopLinger()
		select {
		case <-c.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *cq) Notify() <-chan struct{} {
	c.dev.stopLinger() // whoever asks is about to wait without driving
	return c.notify
}

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
