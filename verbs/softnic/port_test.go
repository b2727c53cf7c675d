package softnic_test

import (
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
)

// A port taken down (a pulled cable) sends and receives nothing: a WR
// across it runs out of retries, and memory behind it is untouched. Each
// change of state raises one port event; the port comes back to work.
func TestPortDownAndUp(t *testing.T) {
	forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
		a, b := fb.node(), fb.node()
		evs := make(chan verbs.Event, 16)
		cancel := a.dev.OnEvent(func(ev verbs.Event) { evs <- ev })
		defer cancel()
		next := func(want verbs.EventType) {
			t.Helper()
			select {
			case ev := <-evs:
				if ev.Type != want || ev.Port != 1 {
					t.Fatalf("event %v, want %v on port 1", ev, want)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no %v event", want)
			}
		}
		qa, _ := connect(t, a, b, 20*time.Millisecond)
		a.dev.SetPortActive(false)
		next(verbs.EventPortErr)
		a.dev.SetPortActive(false) // no change: no event
		copy(a.mem[:4], "lost")
		post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 4), RKey: b.mr.RKey()})
		if wc := poll(t, a.cq, 1, 30*time.Second)[0]; wc.ID != 1 || wc.Status != verbs.StatusRetryExcErr {
			t.Fatalf("WRITE across a down port: %+v, want a retry error", wc)
		}
		b.dev.SyncMemory()
		if string(b.mem[:4]) == "lost" {
			t.Fatal("a WRITE crossed a down port")
		}
		a.dev.SetPortActive(true)
		next(verbs.EventPortActive)
		qa, _ = connect(t, a, b, 0)
		post(t, qa, verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, 0, 4), RKey: b.mr.RKey()})
		if wc := poll(t, a.cq, 1, 30*time.Second)[0]; wc.ID != 2 || wc.Status != verbs.StatusSuccess {
			t.Fatalf("WRITE after the port came back: %+v", wc)
		}
		select {
		case ev := <-evs:
			t.Fatalf("unexpected event %v", ev)
		default:
		}
	})
}
