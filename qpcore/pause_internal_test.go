package qpcore

import "testing"

// A peer's pause as a state machine: RNR only from none, a re-lookup
// takes over an RNR backoff, and ending gives the stalled ops back in
// order.
func TestPauseStates(t *testing.T) {
	var s peerPause
	a, b, c := &op{state: opPosted}, &op{state: opPosted}, &op{state: opPosted, retries: 1}
	s.stall([]*op{a})
	if !s.rnr() || !s.is(pauseRNR) || s.rnr() {
		t.Fatal("RNR backoff not started once")
	}
	s.stall([]*op{b, c})
	if !s.resolve() || !s.is(pauseResolve) || s.resolve() || s.rnr() {
		t.Fatal("a re-lookup did not take over the backoff, once")
	}
	if !s.fresh() || a.state != opStalled {
		t.Fatal("stalled ops")
	}
	if got := s.expire(func(o *op) bool { return o == b }); len(got) != 1 || got[0] != b {
		t.Fatalf("expired %v", got)
	}
	if got := s.end(); len(got) != 2 || got[0] != a || got[1] != c || s.active() || s.fresh() {
		t.Fatalf("end gave %v, active %v", got, s.active())
	}
}
