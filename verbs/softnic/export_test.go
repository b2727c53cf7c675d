package softnic

import (
	"context"
	"fmt"
	"strings"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/udplink"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

func init() {
	debugCheck = func(r *requester, h *wire.Header) {
		if r.una != r.sentHigh {
			return
		}
		for _, w := range r.sq {
			if w.assigned && !w.done {
				panic(fmt.Sprintf("una == sentHigh with WR %d not done after %+v\n%s", w.wr.ID, *h, dumpLocked(r.q)))
			}
		}
	}
}

// NoDebugCheck turns the requester's invariant check off, so that a
// benchmark measures what production runs (the check walks the send
// queue and copies the header after every response); the returned
// function turns it back on.
func NoDebugCheck() (restore func()) {
	saved := debugCheck
	debugCheck = nil
	return func() { debugCheck = saved }
}

// DebugQP describes a QP's requester state for test failure messages.
func DebugQP(v verbs.QP) string {
	q := v.(*qp)
	q.mu.Lock()
	defer q.mu.Unlock()
	return dumpLocked(q)
}

func dumpLocked(q *qp) string {
	r := &q.req
	var b strings.Builder
	fmt.Fprintf(&b, "state=%v tx=%d next=%d una=%d sentHigh=%d rdOut=%d armed=%v rnrWait=%v gap=%v/%d session=%d\n",
		q.state, r.tx, r.nextPSN, r.una, r.sentHigh, r.rdOut, r.armed, r.rnrWait, r.gapValid, r.gapPSN, r.session)
	for i, w := range r.sq {
		fmt.Fprintf(&b, "  [%d] %v id=%d assigned=%v first=%d n=%d sent=%d rsp=%d done=%v fence=%v\n",
			i, w.wr.Op, w.wr.ID, w.assigned, w.first, w.npkts, w.sent, w.rsp, w.done, w.wr.Flags&verbs.Fence != 0)
	}
	return b.String()
}

// WakeOnDone reports whether a driver of c needs a wake-up when ctx ends
// (see cq.wakeOnDone).
func WakeOnDone(c verbs.CQ, ctx context.Context) bool { return c.(*cq).wakeOnDone(ctx) }

// LinkCounters returns the counters of d's link, a *udplink.Link.
func LinkCounters(d *Device) udplink.Counters { return d.link.(*udplink.Link).Counters() }

// RxOutboxHigh is the most packets the receive path's outbox held when
// it was sent.
func (d *Device) RxOutboxHigh() int {
	d.lockRx()
	defer d.rxMu.Unlock()
	return d.rxOut.high
}

// ServeBatch is the bound on the packets one READ adds to an outbox
// before it is sent.
const ServeBatch = serveBatch
