package dct

import (
	"testing"
)

func TestArbiterLIFO(t *testing.T) {
	a := NewArbiter[string](3, 4)
	i, ok := a.Acquire("p")
	if !ok || i != 0 {
		t.Fatalf("first acquire: %d %v, want DCI 0", i, ok)
	}
	j, _ := a.Acquire("q")
	if j != 1 {
		t.Fatalf("second acquire got %d, want 1", j)
	}
	// Releasing 1 then acquiring gives 1 back: the most recently used DCI.
	if _, handed := a.Release(j); handed {
		t.Fatal("release with no waiters handed the DCI over")
	}
	if k, _ := a.Acquire("r"); k != 1 {
		t.Fatalf("LIFO: got DCI %d, want 1", k)
	}
	if a.Owner(1) != "r" || a.State(1) != Busy || a.FreeCount() != 1 {
		t.Fatalf("owner %q state %v free %d", a.Owner(1), a.State(1), a.FreeCount())
	}
}

func TestArbiterWaitersAreServedInOrder(t *testing.T) {
	a := NewArbiter[int](1, 2)
	if _, ok := a.Acquire(1); !ok {
		t.Fatal("acquire of a free DCI failed")
	}
	for _, e := range []int{2, 3, 2} { // 2 asks twice: queued once
		if _, ok := a.Acquire(e); ok {
			t.Fatalf("endpoint %d got a DCI while none is free", e)
		}
	}
	if a.Waiting() != 2 || !a.IsWaiting(2) {
		t.Fatalf("waiting %d", a.Waiting())
	}
	next, handed := a.Release(0)
	if !handed || next != 2 || a.Owner(0) != 2 || a.State(0) != Busy {
		t.Fatalf("release handed to %d (%v), owner %d", next, handed, a.Owner(0))
	}
	a.Cancel(3)
	if next, handed := a.Release(0); handed || next != 0 || a.State(0) != Free {
		t.Fatalf("release after cancel: %d %v %v", next, handed, a.State(0))
	}
}

func TestArbiterQuotaOnlyWhenOthersWait(t *testing.T) {
	a := NewArbiter[int](1, 3)
	a.Acquire(1)
	if a.Yield(100) || a.Room(100) != -1 {
		t.Fatal("quota applied with nobody waiting")
	}
	a.Acquire(2)
	if a.Yield(2) || a.Room(2) != 1 {
		t.Fatalf("room %d after 2 of 3", a.Room(2))
	}
	if !a.Yield(3) || a.Room(3) != 0 {
		t.Fatal("quota used but no yield")
	}
}

func TestArbiterRecovery(t *testing.T) {
	a := NewArbiter[int](2, 1)
	i, _ := a.Acquire(7)
	a.StartRecovery(i)
	if a.State(i) != Recovering || a.Owner(i) != 7 {
		t.Fatalf("state %v owner %d", a.State(i), a.Owner(i))
	}
	mustPanic(t, "release while recovering", func() { a.Release(i) })
	a.FinishRecovery(i)
	a.Release(i)
	mustPanic(t, "double release", func() { a.Release(i) })
	mustPanic(t, "recovery of a free DCI", func() { a.StartRecovery(i) })
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

func TestDCIStateString(t *testing.T) {
	for s, want := range map[DCIState]string{Free: "free", Busy: "busy", Recovering: "recovering", 9: "DCIState(9)"} {
		if s.String() != want {
			t.Errorf("%d: %q", s, s.String())
		}
	}
}
