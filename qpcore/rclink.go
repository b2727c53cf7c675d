package qpcore

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/verbs"
)

// rcPhase is the state of a peer's RC connection.
//
//	none --(hot)--> connecting --(handshake done)--> ready --(idle, LRU victim,
//	  ^                 |                              |     peer changed)--> draining
//	  +----(failed)-----+                              |                         |
//	  +--------------------(QP error)------------------+                         |
//	  +----------------------------(drained, or QP error)------------------------+
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

func (p *peer) setRCLocked(to rcPhase) {
	if !rcTransitionOK(p.rcPhase, to) {
		panic(fmt.Sprintf("qpcore: peer %d: RC %v -> %v", p.gid, p.rcPhase, to))
	}
	p.rcPhase = to
}
