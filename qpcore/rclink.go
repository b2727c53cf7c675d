package qpcore

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/verbs"
)

// A peer's RC connection lifecycle, one type: rcLink holds the phase, the
// QP while it is ready or draining, the traffic meter that says when the
// peer turned hot, and when a connection may be tried again. The phase
// changes only here, through set, which refuses an edge the diagram below
// does not have (a panic: it is a bug in qpcore). The node coordinates
// what goes with each transition (rc.go): the pool slot, the connection
// itself, the VQPs' fences (fence.go), destroying the QP.
//
//	none --(hot)--> connecting --(handshake done)--> ready --(idle, LRU victim,
//	  ^                 |                              |     peer changed)--> draining
//	  +----(failed)-----+                              |                         |
//	  +--------------------(QP error)------------------+                         |
//	  +----------------------------(drained, or QP error)------------------------+

// rcPhase is the state of a peer's RC connection.
type rcPhase uint8

const (
	rcNone rcPhase = iota
	rcConnecting
	rcReady
	rcDraining
)

func (s rcPhase) String() string {
	switch s {
	case rcNone:
		return "none"
	case rcConnecting:
		return "connecting"
	case rcReady:
		return "ready"
	case rcDraining:
		return "draining"
	}
	return fmt.Sprintf("rcPhase(%d)", uint8(s))
}

func rcTransitionOK(from, to rcPhase) bool {
	switch to {
	case rcConnecting:
		return from == rcNone
	case rcReady:
		return from == rcConnecting
	case rcDraining:
		return from == rcReady
	case rcNone:
		return from != rcNone
	}
	return false
}

// rcLink is a peer's RC connection. Guarded by the peer's mu.
type rcLink struct {
	phase   rcPhase
	conn    *rcConn   // the QP, while ready or draining
	retryAt time.Time // no new connection before then
	meter   meter     // the peer's operations in the current RCWindow
}

// set moves the connection to phase to, checking the edge.
func (l *rcLink) set(to rcPhase) {
	if !rcTransitionOK(l.phase, to) {
		panic(fmt.Sprintf("qpcore: RC connection %v -> %v", l.phase, to))
	}
	l.phase = to
}

// idle reports whether there is no connection, not even one being made.
func (l *rcLink) idle() bool { return l.phase == rcNone }

// connecting reports whether a connection is being made.
func (l *rcLink) connecting() bool { return l.phase == rcConnecting }

// ready reports whether new operations may go on the QP.
func (l *rcLink) ready() bool { return l.phase == rcReady && l.conn != nil }

// postable returns the QP if operations queued for it may be posted
// (ready or draining, not errored), else nil.
func (l *rcLink) postable() *rcConn {
	if c := l.conn; c != nil && !c.errored {
		return c
	}
	return nil
}

// hot accounts k new operations at now and starts connecting (none ->
// connecting) when they make threshold within window, unless a failed or
// dropped connection said to wait until retryAt. It reports whether it
// started.
func (l *rcLink) hot(now time.Time, window time.Duration, threshold, k int) bool {
	if l.phase != rcNone || now.Before(l.retryAt) {
		return false
	}
	if l.meter.add(now, window, k) < threshold {
		return false
	}
	l.set(rcConnecting)
	return true
}

// connect starts connecting at once (none -> connecting): an RC-only
// peer's first operation. It reports whether it started.
func (l *rcLink) connect() bool {
	if l.phase != rcNone {
		return false
	}
	l.set(rcConnecting)
	return true
}

// abort ends a connection that could not be made (connecting -> none);
// next is when to try again, or zero to keep the current bound.
func (l *rcLink) abort(next time.Time) {
	if l.phase == rcConnecting {
		l.set(rcNone)
	}
	if !next.IsZero() {
		l.retryAt = next
	}
}

// up adopts the connected QP c (connecting -> ready).
func (l *rcLink) up(c *rcConn) {
	l.set(rcReady)
	l.conn = c
}

// drain stops new operations from taking the QP (ready -> draining); the
// QP goes once what is queued and in flight on it is done (closeDrained).
// It reports whether it did.
func (l *rcLink) drain() bool {
	if !l.ready() {
		return false
	}
	l.set(rcDraining)
	return true
}

// closeDrained ends a draining connection with nothing queued (queued
// ops) or in flight on its QP (draining -> none) and returns the QP to
// destroy, else nil.
func (l *rcLink) closeDrained(queued int) *rcConn {
	c := l.conn
	if c == nil || l.phase != rcDraining || c.out > 0 || c.errored || queued > 0 {
		return nil
	}
	l.conn = nil
	l.set(rcNone)
	return c
}

// drop ends the connection of errored QP c, nothing in flight on it (ready
// or draining -> none); no new one before next.
func (l *rcLink) drop(c *rcConn, next time.Time) {
	if l.conn != c {
		panic(fmt.Sprintf("qpcore: dropping an RC QP the peer does not have (%v)", l.phase))
	}
	l.conn = nil
	l.set(rcNone)
	l.retryAt = next
}

// rcConn is an RC QP this node initiated to a peer. Its fields other
// than lastUsed are guarded by the peer's mu.
type rcConn struct {
	p        *peer
	qp       verbs.QP
	out      int
	errored  bool
	failed   []failure
	lastUsed atomic.Int64 // unix nanoseconds of the last post
}

// meter counts operations in a tumbling window.
type meter struct {
	start time.Time
	n     int
}

func (m *meter) add(now time.Time, window time.Duration, k int) int {
	if now.Sub(m.start) > window {
		m.start, m.n = now, 0
	}
	m.n += k
	return m.n
}
