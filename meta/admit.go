package meta

import (
	"fmt"
	"syscall"
)

// Admission: the meta service admits the load it can serve and sheds the
// rest early, with an answer the client backs off from (see "Start
// storms" in the package doc).
//
//   - Connections: at most ServerConfig.MaxHalfOpen connections may be
//     half-open (accepted, no message heard yet). Past that, a connection
//     request is rejected with busyReject, before any QP is made; the
//     client retries after an exponential, jittered backoff.
//   - Registrations: a registration makes table WRITEs, which the loopback
//     QP executes at the NIC's pace. While more than
//     ServerConfig.MaxPendingWrites WRITEs wait or are in flight, a
//     registration is answered stBusy at once (no WRITE queued) and the
//     agent backs off. Heartbeats, deregistrations, lookups and pings are
//     always served: they keep registered nodes alive and cost at most one
//     4-byte WRITE.
//
// ServerStats.Busy counts both kinds of refusal; HalfOpen and
// PendingWrites (now) and PeakHalfOpen and PeakPendingWrites show how
// close the service came to its bounds.

// busyReject is the reason a busy meta service gives when it rejects a
// connection request; a client seeing it backs off (errBusyReject).
const busyReject = "meta: busy, retry later"

// Admission defaults.
const (
	// DefaultMaxHalfOpen is half of DefaultMaxConns: a bound on what
	// clients not yet heard from hold, not the main throttle (a
	// registration storm is shed by MaxPendingWrites).
	DefaultMaxHalfOpen = DefaultMaxConns / 2
	// DefaultMaxPendingWrites is two loopback send queues of table
	// WRITEs: about 2,000 registrations waiting to be published.
	DefaultMaxPendingWrites = 2 * loopDepth
)

// ErrBusy: the meta service is shedding load (a start storm); try again
// after a backoff. Clients back off and retry by themselves while the
// caller's context lasts, so callers see it only when that ends.
var ErrBusy = newError("meta service busy", syscall.EAGAIN)

// admitConnLocked decides whether a connection request may be accepted
// now. connMu held.
func (s *Server) admitConnLocked() error {
	if s.halfOpen >= s.cfg.MaxHalfOpen {
		s.st.busy.Add(1)
		return fmt.Errorf("%s (%d connections half-open)", busyReject, s.halfOpen)
	}
	return nil
}

// heardLocked notes the first message of connection c. connMu held.
func (s *Server) heardLocked(c *srvConn) {
	if !c.heard {
		c.heard = true
		s.halfOpen--
	}
}

// pendingWrites returns the table WRITEs waiting or in flight, plus those
// of wb (the batch being built): a count kept as groups are queued and
// complete, not a walk over the groups, which is asked at every
// registration and batch. Loop only.
func (s *Server) pendingWrites(wb *writeBatch) int {
	return len(wb.wrs) + s.queued
}

// admitRegister reports whether a registration may be served now: false
// while the table WRITEs it would add wait behind more than
// MaxPendingWrites. Loop only.
func (s *Server) admitRegister(wb *writeBatch) bool {
	if s.pendingWrites(wb) > s.cfg.MaxPendingWrites {
		s.st.busy.Add(1)
		return false
	}
	return true
}

// checkPending, set by the package's tests, checks Server.queued against
// the groups it counts. Loop only.
var checkPending func(s *Server)

// notePending updates the pending-WRITEs gauge and its peak. Loop only.
func (s *Server) notePending() {
	if checkPending != nil {
		checkPending(s)
	}
	n := s.pendingWrites(&writeBatch{})
	s.st.pending.Store(int64(n))
	if uint64(n) > s.st.peakPending.Load() {
		s.st.peakPending.Store(uint64(n))
	}
}
