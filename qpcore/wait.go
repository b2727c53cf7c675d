package qpcore

import (
	"context"
	"errors"
	"fmt"
)

// Waiting for a synchronous operation: the caller drives the device when it
// can (verbs.DrivenCQ), else polls the send CQ when it signals or waits for
// the dispatcher; cancelling withdraws an operation not yet posted.

// wait waits for a posted synchronous op. Cancelling ctx withdraws the op
// if it has not reached a QP; once posted, the op's memory belongs to the
// NIC until its completion, which the transport's timeouts guarantee, so
// wait does not return before it.
//
// When the device supports it (verbs.DrivenCQ), the caller drives: it may
// receive on its own goroutine and process every send completion it finds
// (its own, other callers', asynchronous ones) until its op is done, with
// no hand-off through the dispatcher.
func (n *Node) wait(ctx context.Context, o *op) {
	if n.dscq != nil {
		ready := o.ready
		if ready == nil {
			ready = func() bool { return n.opReady(o) }
		}
		for {
			err := n.dscq.Drive(ctx, o.done, ready)
			if err == nil {
				return
			}
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				n.cancel1(o, ctx.Err())
				ctx = context.Background()
				continue
			}
			break // the device is closing: wait below
		}
		if o.fin.Load() != finPending {
			return
		}
	}
	done := ctx.Done()
	for {
		select {
		case <-o.done:
			return
		case <-n.scq.Notify():
			// The notification is ours now: whoever's completions it
			// announces, poll them before leaving, or they wait in the CQ
			// for a notification that never comes (every other waiter may
			// be asleep on it).
			n.pollSend(1)
			if o.fin.Load() != finPending {
				return
			}
		case <-done:
			n.cancel1(o, ctx.Err())
			done = nil
		}
	}
}

// opReady is a driver's condition for o: done, polling the send CQ for it
// when completions are queued there.
func (n *Node) opReady(o *op) bool {
	if o.fin.Load() != finPending {
		return true
	}
	if !n.dscq.Pending() {
		return false // nothing to poll: ready runs twice before every receive
	}
	n.pollSend(-1)
	return o.fin.Load() != finPending
}

// cancel1 finishes o with err if it has not been posted.
func (n *Node) cancel1(o *op, err error) {
	p := o.p
	e := n.newEffects()
	p.mu.Lock()
	removed := false
	switch o.state {
	case opHeld:
		var empty bool
		if removed, empty = o.v.withdraw(o); empty {
			p.held.drop(o.v)
		}
	case opQueued:
		removed = p.queue(o.route).remove(o)
	}
	if removed {
		n.finishLocked(p, o, fmt.Errorf("qpcore: %v withdrawn before posting: %w", o.code, err), e)
		n.kickLocked(p, e)
	}
	p.mu.Unlock()
	n.apply(e)
}
