package meta

import (
	"context"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// drive waits for the READ in o by receiving on the caller's goroutine,
// when the device can (verbs.DrivenCQ): run to completion, as qpcore's
// synchronous operations wait. A lookup is one READ of the meta table;
// waiting on the CQ's notification, its answer reached the caller through
// the device's receive goroutine and a wake-up of the caller's thread, two
// thread wake-ups that cost more than the round trip on a small machine
// (a cold connect took about twice a raw UDP round trip to the meta
// service's host). drive gives up after rto, the conn's ACK timeout, and
// reports how long the READ took, whether it finished, and whether rto
// passed without it; what it leaves (a READ still out, a dead conn, ctx)
// the ordinary wait handles.
func (cn *conn) drive(ctx context.Context, o *op, rto time.Duration) (took time.Duration, done, late bool) {
	d, ok := cn.cq.(verbs.DrivenCQ)
	if !ok || rto <= 0 {
		return 0, false, false
	}
	clk := cn.cl.clock
	t0 := clk.Now()
	dctx, cancel := clock.WithTimeout(ctx, clk, rto)
	defer cancel()
	ready := func() bool {
		cn.pollMu.Lock()
		cn.pollLocked()
		f := o.finished
		cn.pollMu.Unlock()
		return f
	}
	if d.Drive(dctx, o.done, ready) != nil {
		return 0, false, ctx.Err() == nil && dctx.Err() != nil
	}
	cn.cl.st.drivenReads.Add(1)
	return clk.Now().Sub(t0), true, false
}

// wakeDriver tells a caller that may be receiving in drive that an op
// finished on another goroutine (verbs.DrivenCQ's contract): it looks at
// its own again. Two atomic operations when nobody drives.
func (cn *conn) wakeDriver() {
	if d, ok := cn.cq.(verbs.DrivenCQ); ok {
		d.Wake()
	}
}
