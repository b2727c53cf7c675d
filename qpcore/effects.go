package qpcore

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// Work that must not run under a peer's lock (delivering results, kicking
// peers, starting goroutines, destroying QPs) is collected in an effects
// while the lock is held and done by apply once it is released.

// effects is work deferred until no peer lock is held.
type effects struct {
	done    []*op
	kick    []*peer
	connect []*peer
	relook  []*peer
	down    []*peer // silent: look up again in the background
	rnr     []*peer
	destroy []*rcConn

	batch      []*op // scratch for kicks
	posting    []*op
	wrs        []verbs.SendWR
	delivering []*op // scratch: the done ops of the round being delivered

	// now, when set, is the time a post read under the peer's lock; the
	// kick of that post reuses it instead of reading the clock again.
	// Zero everywhere else.
	now time.Time
}

// clockNow returns e.now if set, else the clock's time.
func (e *effects) clockNow(c clock.Clock) time.Time {
	if !e.now.IsZero() {
		return e.now
	}
	return c.Now()
}

var effectsPool = sync.Pool{New: func() any { return new(effects) }}

// newEffects takes the node's spare effects (one atomic swap, memory the
// last apply left warm), or one from the pool when another goroutine has
// it.
func (n *Node) newEffects() *effects {
	if e := n.spare.Swap(nil); e != nil {
		return e
	}
	return effectsPool.Get().(*effects)
}

// apply does e's work, then recycles e. Each round takes the first kind
// of work in this order, so work that a step adds (a kick that finishes
// ops, a delivery whose callback kicks) is done before anything later:
//
//   - destroy first: an RC QP being torn down leaves the device and frees
//     its RC pool slot before anything below can post or reserve a slot
//     (the peer's route was already moved off it under the lock, so no
//     kick needs it).
//   - kick before deliver: the ops a kick posts were queued before
//     anything a woken caller will post next; posting them first keeps
//     each peer's operations in order, refills the QP slots and DCI that
//     the completions just freed with one doorbell, and lets a peer that
//     was handed a DCI use it before it is handed on.
//   - deliver next: callers wake (or callbacks run) only once all QP work
//     their completions made possible is posted; a callback may lock a
//     peer, which is why this runs with no lock held at all.
//   - connect, relook and RNR resumes last: they only start goroutines or
//     timers, which see the state the steps above left.
func (n *Node) apply(e *effects) {
	for {
		switch {
		case len(e.destroy) > 0:
			c := e.destroy[len(e.destroy)-1]
			e.destroy = e.destroy[:len(e.destroy)-1]
			n.destroyRC(c)
		case len(e.kick) > 0:
			p := e.kick[len(e.kick)-1]
			e.kick = e.kick[:len(e.kick)-1]
			p.mu.Lock()
			n.kickLocked(p, e)
			p.mu.Unlock()
		case len(e.done) > 0:
			// Delivered from a second slice, so that e.done takes what a
			// later round adds (no allocation per round).
			done := e.done
			e.done = e.delivering[:0]
			for _, o := range done {
				n.deliver(o)
			}
			clear(done)
			e.delivering = done[:0]
		case len(e.connect) > 0:
			p := e.connect[len(e.connect)-1]
			e.connect = e.connect[:len(e.connect)-1]
			if !n.goSafe(func() { n.connectRC(p) }) {
				p.mu.Lock()
				p.rc.abort(time.Time{})
				p.mu.Unlock()
			}
		case len(e.relook) > 0:
			p := e.relook[len(e.relook)-1]
			e.relook = e.relook[:len(e.relook)-1]
			n.goSafe(func() { n.relookup(p) })
		case len(e.down) > 0:
			p := e.down[len(e.down)-1]
			e.down = e.down[:len(e.down)-1]
			n.goSafe(func() { n.relookSilent(p) })
		case len(e.rnr) > 0:
			p := e.rnr[len(e.rnr)-1]
			e.rnr = e.rnr[:len(e.rnr)-1]
			// The resume runs in its own goroutine whatever the clock: a
			// manual clock calls timers on the goroutine that moves time.
			n.clock.AfterFunc(rnrBackoff, func() { go n.resumeRNR(p) })
		default:
			// Every user of the scratch slices clears what it used
			// before reslicing to zero, so nothing past len is set.
			clear(e.batch)
			clear(e.posting)
			clear(e.wrs)
			e.batch, e.posting, e.wrs = e.batch[:0], e.posting[:0], e.wrs[:0]
			if !n.spare.CompareAndSwap(nil, e) {
				effectsPool.Put(e)
			}
			return
		}
	}
}

// deliver hands a finished op to whoever waits for it.
func (n *Node) deliver(o *op) {
	n.mem.put(o.mem)
	o.mem = nil
	if o.tmp {
		o.lmr.Dereg()
		o.tmp = false
	}
	o.lmr = nil
	if o.sink >= 0 {
		n.sinks.put(o.sink)
		o.sink = -1
	}
	switch {
	case o.onDone != nil:
		o.onDone(o)
	case o.async:
		o.v.complete(o)
	default:
		o.fin.Store(finDone)
		o.done <- struct{}{}
		o.fin.Store(finReleased) // the last touch: o may be recycled now
		if n.dscq != nil {
			// Its waiter may be blocked receiving for the device.
			n.dscq.Wake()
		}
	}
}

// finishLocked ends o with err (nil for success).
func (n *Node) finishLocked(p *peer, o *op, err error, e *effects) {
	if o.state == opDone {
		return
	}
	if err != nil && o.mayRun && o.code.atomic() && !errors.Is(err, ErrAtomicLost) {
		// Sent and not refused: whatever ends it now (a peer found dead,
		// an expired deadline, a closing device) cannot say it did not
		// run, and an error that means "not run" would let the caller
		// apply it twice.
		err = fmt.Errorf("%w (%v)", ErrAtomicLost, err)
	}
	counted := o.state == opQueued || o.state == opPosted || o.state == opStalled
	o.setState(opDone)
	o.err = err
	o.dci, o.rc = nil, nil
	if err == nil && o.code.atomic() {
		o.old = n.sinks.value(o.sink)
	}
	if err != nil {
		n.stats.opErrors.Add(1)
	}
	p.active--
	n.ops.del(o)
	if counted {
		n.doneLocked(p, o.v, o.route)
	}
	e.done = append(e.done, o)
}
