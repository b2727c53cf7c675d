package qpcore

import (
	"context"
	"sync"
	"testing"

	"github.com/krfs/krfs/verbs"
)

// stubCQ is a send CQ whose content and notification the test controls.
type stubCQ struct {
	mu     sync.Mutex
	wcs    []verbs.WC
	notify chan struct{}
}

func (c *stubCQ) Poll(out []verbs.WC) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := copy(out, c.wcs)
	c.wcs = c.wcs[k:]
	return k
}

func (c *stubCQ) Wait(ctx context.Context) error { return ctx.Err() }
func (c *stubCQ) Notify() <-chan struct{}        { return c.notify }
func (c *stubCQ) Destroy() error                 { return nil }

func (c *stubCQ) left() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.wcs)
}

// TestWaitKeepsNotification: a synchronous waiter that takes the send
// CQ's notification polls the completions it announces even when its own
// op turns out to be finished already (by another poller, between its
// fin flag and its done signal). Returning without polling left another
// caller's completion in the CQ with no notification pending, and that
// caller, asleep on the notification, waited forever (a READ of
// TestCoalescing hung for 15 minutes in CI).
func TestWaitKeepsNotification(t *testing.T) {
	cq := &stubCQ{notify: make(chan struct{}, 1)}
	n := &Node{scq: cq}

	// Another caller's completion, announced once.
	cq.wcs = append(cq.wcs, verbs.WC{ID: 12345, Status: verbs.StatusSuccess})
	cq.notify <- struct{}{}

	// Our op: finished, its done signal not sent yet.
	o := newOp()
	o.done = make(chan struct{}, 1)
	o.fin.Store(finDone)
	n.wait(context.Background(), o)

	pending := len(cq.notify) > 0
	if left := cq.left(); left > 0 && !pending {
		t.Fatalf("wait consumed the CQ's notification and left %d completion(s) unpolled with none pending", left)
	}
}
