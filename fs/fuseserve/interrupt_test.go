package fuseserve

import "testing"

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// An INTERRUPT that comes (through /dev/fuse) before its request (through
// a ring) is not lost: the request starts interrupted. Interrupts of
// requests never seen are kept only up to maxEarly.
func TestInterruptBeforeItsRequest(t *testing.T) {
	s := &Server{intr: map[uint64]chan struct{}{}}
	s.interrupt(7)
	if ch := s.interruptible(7); !closed(ch) {
		t.Fatal("a request whose INTERRUPT came first is not interrupted")
	}
	ch := s.interruptible(9)
	if closed(ch) {
		t.Fatal("a request nobody interrupted starts interrupted")
	}
	s.interrupt(9)
	if !closed(ch) {
		t.Fatal("INTERRUPT of a known request did not cancel it")
	}
	// 7's early interrupt was claimed: a later request 7 (uniques are not
	// reused, but the table must not keep it) is not interrupted.
	if ch := s.interruptible(7); closed(ch) {
		t.Fatal("an early interrupt was claimed twice")
	}
	for u := uint64(100); u < 100+2*maxEarly; u++ {
		s.interrupt(u)
	}
	if len(s.early) != maxEarly {
		t.Fatalf("%d early interrupts kept, want %d", len(s.early), maxEarly)
	}
	if ch := s.interruptible(100 + 2*maxEarly - 1); !closed(ch) {
		t.Fatal("the latest early interrupt was dropped")
	}
}
