package dct

import "fmt"

// DCIState is the assignment state of one DCI of an Arbiter.
type DCIState uint8

const (
	// Free: on the LIFO stack, owned by no endpoint.
	Free DCIState = iota
	// Busy: owned by one endpoint, which posts its WRs to it.
	Busy
	// Recovering: owned, in ERR or on its way back to RTS; its owner
	// posts nothing until FinishRecovery.
	Recovering
)

func (s DCIState) String() string {
	switch s {
	case Free:
		return "free"
	case Busy:
		return "busy"
	case Recovering:
		return "recovering"
	}
	return fmt.Sprintf("DCIState(%d)", uint8(s))
}

// Arbiter assigns n DCIs, numbered 0..n-1, to endpoints of type E with the
// dcs_quota policy described in the package doc. It is not safe for
// concurrent use: the caller serializes calls with its own lock.
type Arbiter[E comparable] struct {
	quota   int
	state   []DCIState
	owner   []E
	free    []int // LIFO stack: the top is free[len(free)-1]
	waiters []E   // FIFO of endpoints waiting for a DCI
	waiting map[E]struct{}
}

// NewArbiter returns an arbiter for n DCIs, all free, with the given quota
// (WRs an endpoint may post on a DCI while others wait; at least 1).
func NewArbiter[E comparable](n, quota int) *Arbiter[E] {
	if n < 1 {
		panic("dct: an arbiter needs at least one DCI")
	}
	a := &Arbiter[E]{
		quota:   max(quota, 1),
		state:   make([]DCIState, n),
		owner:   make([]E, n),
		free:    make([]int, n),
		waiting: make(map[E]struct{}),
	}
	// DCI 0 on top: a lightly loaded node keeps using the same few DCIs.
	for i := range a.free {
		a.free[i] = n - 1 - i
	}
	return a
}

// Len is the number of DCIs.
func (a *Arbiter[E]) Len() int { return len(a.state) }

// Quota is the per-turn WR quota.
func (a *Arbiter[E]) Quota() int { return a.quota }

// State returns DCI i's state.
func (a *Arbiter[E]) State(i int) DCIState { return a.state[i] }

// Owner returns the endpoint owning DCI i (the zero E when free).
func (a *Arbiter[E]) Owner(i int) E { return a.owner[i] }

// FreeCount is how many DCIs are on the free stack.
func (a *Arbiter[E]) FreeCount() int { return len(a.free) }

// Waiting is how many endpoints wait for a DCI.
func (a *Arbiter[E]) Waiting() int { return len(a.waiters) }

// IsWaiting reports whether e is queued for a DCI.
func (a *Arbiter[E]) IsWaiting(e E) bool {
	_, ok := a.waiting[e]
	return ok
}

// Acquire gives e the DCI on top of the free stack. When none is free, e
// joins the wait queue (once, however often it asks) and ok is false; a
// later Release hands e a DCI. An endpoint must not hold two DCIs.
func (a *Arbiter[E]) Acquire(e E) (i int, ok bool) {
	if n := len(a.free); n > 0 {
		i = a.free[n-1]
		a.free = a.free[:n-1]
		a.transition(i, Free, Busy)
		a.owner[i] = e
		return i, true
	}
	if _, dup := a.waiting[e]; !dup {
		a.waiting[e] = struct{}{}
		a.waiters = append(a.waiters, e)
	}
	return -1, false
}

// Release gives up DCI i, whose owner's work on it has drained. If an
// endpoint waits, the DCI goes straight to the first one, which is
// returned with handed set; otherwise it goes on top of the free stack.
func (a *Arbiter[E]) Release(i int) (next E, handed bool) {
	if a.state[i] != Busy {
		panic(fmt.Sprintf("dct: release of DCI %d in state %v", i, a.state[i]))
	}
	if len(a.waiters) > 0 {
		next = a.waiters[0]
		var zero E
		a.waiters[0] = zero
		a.waiters = a.waiters[1:]
		delete(a.waiting, next)
		a.owner[i] = next
		return next, true
	}
	a.transition(i, Busy, Free)
	var zero E
	a.owner[i] = zero
	a.free = append(a.free, i)
	return zero, false
}

// Cancel removes e from the wait queue (it no longer has work).
func (a *Arbiter[E]) Cancel(e E) {
	if len(a.waiters) == 0 {
		return // the common case: a map lookup per kick otherwise
	}
	if _, ok := a.waiting[e]; !ok {
		return
	}
	delete(a.waiting, e)
	for k, w := range a.waiters {
		if w == e {
			copy(a.waiters[k:], a.waiters[k+1:])
			var zero E
			a.waiters[len(a.waiters)-1] = zero
			a.waiters = a.waiters[:len(a.waiters)-1]
			return
		}
	}
}

// Yield reports whether an endpoint that posted posted WRs on its DCI in
// this turn must stop posting and give the DCI up once drained: its quota
// is used and another endpoint waits.
func (a *Arbiter[E]) Yield(posted int) bool {
	return posted >= a.quota && len(a.waiters) > 0
}

// Room is how many more WRs an endpoint that posted posted WRs in this
// turn may post now (ignoring the DCI's queue depth): unlimited (-1) while
// nobody waits, the rest of its quota otherwise.
func (a *Arbiter[E]) Room(posted int) int {
	if len(a.waiters) == 0 {
		return -1
	}
	return max(a.quota-posted, 0)
}

// StartRecovery marks the owned DCI i as recovering.
func (a *Arbiter[E]) StartRecovery(i int) { a.transition(i, Busy, Recovering) }

// FinishRecovery marks DCI i, back in RTS, as busy again under its owner.
func (a *Arbiter[E]) FinishRecovery(i int) { a.transition(i, Recovering, Busy) }

func (a *Arbiter[E]) transition(i int, from, to DCIState) {
	if a.state[i] != from {
		panic(fmt.Sprintf("dct: DCI %d: %v -> %v from state %v", i, from, to, a.state[i]))
	}
	a.state[i] = to
}
