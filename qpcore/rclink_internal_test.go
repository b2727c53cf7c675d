package qpcore

import (
	"testing"
	"time"
)

// The RC connection lifecycle as a state machine: each method takes only
// its own edges of the diagram in rclink.go, and a call on the wrong
// phase either does nothing (the conditional ones) or panics (a bug).
func TestRCLinkLifecycle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var l rcLink
	if !l.idle() || l.ready() || l.postable() != nil {
		t.Fatal("a new link is not idle")
	}
	// Hot: below the threshold nothing starts; at it, connecting.
	if l.hot(t0, time.Second, 3, 2) || !l.idle() {
		t.Fatal("started below the threshold")
	}
	if !l.hot(t0, time.Second, 3, 1) || !l.connecting() {
		t.Fatalf("not connecting at the threshold: %v", l.phase)
	}
	if l.connect() || l.hot(t0, time.Second, 1, 10) {
		t.Fatal("started twice")
	}
	// A failed connection goes back to none and defers the next one.
	l.abort(t0.Add(time.Second))
	if !l.idle() || l.hot(t0.Add(time.Second/2), time.Second, 1, 10) {
		t.Fatalf("after a failure: %v, or connecting before retryAt", l.phase)
	}
	if !l.connect() {
		t.Fatal("RC-only connect refused")
	}
	c := &rcConn{}
	l.up(c)
	if !l.ready() || l.postable() != c {
		t.Fatal("not ready after up")
	}
	// Draining: no new operations; closed only with nothing queued or in flight.
	c.out = 1
	if !l.drain() || l.ready() || l.postable() != c || l.drain() {
		t.Fatalf("drain: %v", l.phase)
	}
	if l.closeDrained(0) != nil {
		t.Fatal("closed with a WR in flight")
	}
	c.out = 0
	if l.closeDrained(1) != nil {
		t.Fatal("closed with an operation queued")
	}
	if l.closeDrained(0) != c || !l.idle() || l.conn != nil {
		t.Fatalf("not closed when drained: %v", l.phase)
	}
	// An errored QP is dropped from ready, and the next connection waits.
	l.connect()
	l.up(c)
	c.errored = true
	if l.postable() != nil {
		t.Fatal("errored QP still postable")
	}
	l.drop(c, t0.Add(time.Hour))
	if !l.idle() || l.hot(t0, time.Second, 1, 1) {
		t.Fatal("reconnecting right after an error")
	}

	for name, bad := range map[string]func(l *rcLink){
		"up from none":       func(l *rcLink) { l.up(&rcConn{}) },
		"drop of another QP": func(l *rcLink) { l.drop(&rcConn{}, t0) },
		"none to none":       func(l *rcLink) { l.set(rcNone) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			bad(&rcLink{})
		}()
	}
}
