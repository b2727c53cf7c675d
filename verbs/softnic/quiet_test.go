package softnic_test

import (
	"context"
	"testing"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/link"
)

// TestQuietCountsSendQueue: a device is Quiet (link.Quiescer) exactly
// while no QP has a send WR outstanding; a lingering link relies on it not
// to leave unwatched a socket whose datagrams a waiter that does not drive
// needs. Pending (verbs.DrivenCQ) says whether a completion waits.
func TestQuietCountsSendQueue(t *testing.T) {
	fb := newFabric(t, "fake", faults{})
	a, s := fb.node(), fb.node()
	qa, _ := connect(t, a, s, 0)
	if !a.dev.Quiet() {
		t.Fatal("not quiet with nothing posted")
	}
	// Completed WRs leave the queue.
	dcq := a.cq.(verbs.DrivenCQ)
	if dcq.Pending() {
		t.Fatal("CQ pending with nothing posted")
	}
	post(t, qa, verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: s.mr.RKey()})
	if err := a.cq.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !dcq.Pending() {
		t.Fatal("CQ not pending with a completion to poll")
	}
	poll(t, a.cq, 1, time.Minute)
	if !a.dev.Quiet() {
		t.Fatal("not quiet after the READ completed")
	}
	if dcq.Pending() {
		t.Fatal("CQ pending after its completion was polled")
	}
	// The responder is gone: READs stay outstanding (the fake clock never
	// moves, so no ACK timeout ends them).
	s.dev.Close()
	post(t, qa, verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: s.mr.RKey()},
		verbs.SendWR{Op: verbs.OpRead, Local: sge(a, 8, 8), RKey: s.mr.RKey()})
	if a.dev.Quiet() {
		t.Fatal("quiet with two READs outstanding")
	}
	// Destroying the QP drops its queue.
	if err := qa.Destroy(); err != nil {
		t.Fatal(err)
	}
	if !a.dev.Quiet() {
		t.Fatal("not quiet after the QP holding the READs was destroyed")
	}
}

// TestWakeOnDone: a driver is woken when its context ends only if that
// may happen before it looks by itself (link.DonePoll): a context without
// a deadline, or one ending within a few DonePolls. A far deadline
// (an operation's usual timeout) costs no registration per operation.
func TestWakeOnDone(t *testing.T) {
	fb := newFabric(t, "fake", faults{})
	a := fb.node()
	cancelOnly, cancel := context.WithCancel(context.Background())
	defer cancel()
	far, cancelFar := clock.WithTimeout(context.Background(), fb.clock, time.Second)
	defer cancelFar()
	near, cancelNear := clock.WithTimeout(context.Background(), fb.clock, 2*link.DonePoll)
	defer cancelNear()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"no deadline", cancelOnly, true},
		{"deadline in 1 s", far, false},
		{"deadline in 2 DonePolls", near, true},
	} {
		if got := softnic.WakeOnDone(a.cq, tc.ctx); got != tc.want {
			t.Errorf("%s: wake-up %v, want %v", tc.name, got, tc.want)
		}
	}
}
