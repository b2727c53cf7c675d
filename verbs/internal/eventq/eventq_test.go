package eventq

import (
	"testing"

	"github.com/krfs/krfs/verbs"
)

func TestOrderAndCancel(t *testing.T) {
	var q Queue
	q.Raise(verbs.Event{Type: verbs.EventPortErr, Port: 1}) // nobody listens: dropped
	got := make(chan verbs.Event, 16)
	cancel := q.Subscribe(func(ev verbs.Event) { got <- ev })
	for p := 1; p <= 5; p++ {
		q.Raise(verbs.Event{Type: verbs.EventPortActive, Port: p})
	}
	for p := 1; p <= 5; p++ {
		if ev := <-got; ev.Port != p {
			t.Fatalf("event %d delivered as %v", p, ev)
		}
	}
	cancel()
	q.Raise(verbs.Event{Type: verbs.EventPortActive, Port: 9})
	q.Close()
	select {
	case ev := <-got:
		t.Fatalf("event %v delivered after cancel", ev)
	default:
	}
}

func TestCloseWaitsForDelivery(t *testing.T) {
	var q Queue
	release := make(chan struct{})
	in := make(chan struct{})
	done := false
	q.Subscribe(func(verbs.Event) {
		close(in)
		<-release
		done = true
	})
	q.Raise(verbs.Event{Type: verbs.EventDeviceFatal})
	<-in
	closed := make(chan struct{})
	go func() { q.Close(); close(closed) }()
	close(release)
	<-closed
	if !done {
		t.Fatal("Close returned while a subscriber ran")
	}
	q.Raise(verbs.Event{Type: verbs.EventDeviceFatal}) // after Close: dropped, no goroutine
}
