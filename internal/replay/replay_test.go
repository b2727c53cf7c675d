package replay

import (
	"math/rand/v2"
	"testing"
)

// TestEachCounterOnce: a counter is accepted once; later duplicates, in or
// out of order, are refused.
func TestEachCounterOnce(t *testing.T) {
	var w Window
	for i := uint64(1); i <= 1000; i++ {
		if !w.Accept(i) {
			t.Fatalf("fresh counter %d refused", i)
		}
	}
	for i := uint64(1); i <= 1000; i++ {
		if w.Accept(i) {
			t.Fatalf("replayed counter %d accepted", i)
		}
	}
}

// TestReorderWithinWindow: counters arriving out of order inside the
// window are accepted once each.
func TestReorderWithinWindow(t *testing.T) {
	var w Window
	perm := rand.New(rand.NewPCG(1, 2)).Perm(WindowSize - 1)
	base := uint64(1 << 40)
	w.Accept(base + WindowSize) // the newest first
	for _, p := range perm {
		c := base + uint64(p) + 1
		if !w.Accept(c) {
			t.Fatalf("reordered counter %d refused", c)
		}
		if w.Accept(c) {
			t.Fatalf("counter %d accepted twice", c)
		}
	}
}

// TestTooOld: a counter WindowSize or more behind the newest is refused
// even if never seen; a jump forward by more than the ring forgets the
// old bits without accepting old counters again.
func TestTooOld(t *testing.T) {
	var w Window
	w.Accept(100000)
	if w.Accept(100000 - WindowSize) {
		t.Fatal("counter at the window's edge accepted")
	}
	if !w.Accept(100000 - WindowSize + 1) {
		t.Fatal("oldest counter inside the window refused")
	}
	w.Accept(10000000)
	if w.Accept(100000) || w.Accept(10000000) {
		t.Fatal("old counter accepted after a jump")
	}
	if !w.Accept(10000000 - 5) {
		t.Fatal("unseen counter inside the window refused after a jump")
	}
}

// TestAgainstModel compares the window with a set over random traffic.
func TestAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var w Window
	seen := map[uint64]bool{}
	var high uint64
	started := false
	for range 200000 {
		c := high + uint64(rng.IntN(3*blockBits))
		if rng.IntN(2) == 0 && high > 2*WindowSize {
			c = high - uint64(rng.IntN(WindowSize+200))
		}
		want := !seen[c] && (!started || c > high || high-c < WindowSize)
		if got := w.Accept(c); got != want {
			t.Fatalf("Accept(%d) with newest %d = %v, want %v", c, high, got, want)
		}
		if want {
			seen[c] = true
			if !started || c > high {
				high = c
			}
			started = true
		}
	}
}
