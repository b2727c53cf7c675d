package softnic_test

import (
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
)

// TestQuietCountsSendQueue: a device is Quiet (link.Quiescer) exactly
// while no QP has a send WR outstanding; a lingering link relies on it not
// to leave unwatched a socket whose datagrams a waiter that does not drive
// needs.
func TestQuietCountsSendQueue(t *testing.T) {
	fb := newFabric(t, "fake", faults{})
	a, s := fb.node(), fb.node()
	qa, _ := connect(t, a, s, 0)
	if !a.dev.Quiet() {
		t.Fatal("not quiet with nothing posted")
	}
	// Completed WRs leave the queue.
	post(t, qa, verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: s.mr.RKey()})
	poll(t, a.cq, 1, time.Minute)
	if !a.dev.Quiet() {
		t.Fatal("not quiet after the READ completed")
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
