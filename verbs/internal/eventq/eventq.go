// Package eventq delivers a verbs device's asynchronous events to its
// subscribers (verbs.Device.OnEvent), for every backend alike: Raise never
// blocks, so a device can raise events from its receive path with locks
// held; a goroutine started on demand delivers them in order and exits
// when the queue is empty.
package eventq

import (
	"sync"

	"github.com/krfs/krfs/verbs"
)

// Queue is a device's event queue. The zero value is ready to use.
type Queue struct {
	mu      sync.Mutex // guards the fields below
	queue   []verbs.Event
	subs    []*sub
	running bool // a delivery goroutine is running
	closed  bool
	idle    *sync.Cond // signalled when the delivery goroutine exits (on mu)

	// deliverMu is held while subscribers are called, so that a cancel
	// returns only once its subscriber is no longer being called.
	deliverMu sync.Mutex
}

type sub struct {
	fn        func(verbs.Event)
	cancelled bool // guarded by deliverMu
}

// Subscribe implements verbs.Device.OnEvent. cancel must not be called
// from fn.
func (q *Queue) Subscribe(fn func(verbs.Event)) (cancel func()) {
	s := &sub{fn: fn}
	q.mu.Lock()
	q.subs = append(q.subs, s)
	q.mu.Unlock()
	return func() {
		q.mu.Lock()
		for i, x := range q.subs {
			if x == s {
				q.subs = append(q.subs[:i:i], q.subs[i+1:]...)
				break
			}
		}
		q.mu.Unlock()
		q.deliverMu.Lock()
		s.cancelled = true
		q.deliverMu.Unlock()
	}
}

// Raise queues ev for every subscriber. It never blocks; an event raised
// while nobody subscribes is dropped.
func (q *Queue) Raise(ev verbs.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || len(q.subs) == 0 {
		return
	}
	q.queue = append(q.queue, ev)
	if !q.running {
		q.running = true
		go q.run()
	}
}

func (q *Queue) run() {
	for {
		q.mu.Lock()
		if len(q.queue) == 0 || q.closed {
			q.queue = nil
			q.running = false
			if q.idle != nil {
				q.idle.Broadcast()
			}
			q.mu.Unlock()
			return
		}
		ev := q.queue[0]
		q.queue[0] = verbs.Event{}
		q.queue = q.queue[1:]
		subs := append([]*sub(nil), q.subs...)
		q.mu.Unlock()
		q.deliverMu.Lock()
		for _, s := range subs {
			if !s.cancelled {
				s.fn(ev)
			}
		}
		q.deliverMu.Unlock()
	}
}

// Close drops the events not yet delivered and waits until the delivery
// goroutine has exited; later events are dropped. It must not be called
// from a subscriber.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	if q.idle == nil {
		q.idle = sync.NewCond(&q.mu)
	}
	for q.running {
		q.idle.Wait()
	}
}
