package qpcore

import (
	"errors"
	"testing"
)

// TestOpTableStaleIDs: a slot is reused once its op is deleted, and the
// new op's ID differs, so a late completion of the first op finds nothing.
func TestOpTableStaleIDs(t *testing.T) {
	var tab opTable
	a, b := newOp(), newOp()
	tab.add(a)
	tab.add(b)
	if a.id == b.id || a.id == 0 || b.id == 0 {
		t.Fatalf("ids %#x and %#x: want distinct and non-zero", a.id, b.id)
	}
	if tab.get(a.id) != a || tab.get(b.id) != b {
		t.Fatal("get does not return the ops added")
	}
	old := a.id
	tab.del(a)
	if tab.get(old) != nil {
		t.Fatal("a deleted op is still found")
	}
	c := newOp()
	tab.add(c)
	if uint32(c.id) != uint32(old) {
		t.Fatalf("slot %d not reused (new op in slot %d)", uint32(old), uint32(c.id))
	}
	if c.id == old || tab.get(old) != nil {
		t.Fatalf("the stale id %#x matches the slot's new op %#x", old, c.id)
	}
	if got := tab.all(); len(got) != 2 {
		t.Fatalf("all: %d ops, want 2", len(got))
	}
	tab.del(a) // deleting twice changes nothing
	if tab.get(c.id) != c || len(tab.all()) != 2 {
		t.Fatal("a second delete of a gone op removed another")
	}
	if tab.get(uint64(1)<<32|99) != nil {
		t.Fatal("an id past the table found an op")
	}
}

// TestOpTableCountSkipsZero: when the count wraps, no ID's high half is 0.
func TestOpTableCountSkipsZero(t *testing.T) {
	tab := opTable{count: ^uint32(0) - 1}
	for range 3 {
		o := newOp()
		tab.add(o)
		if o.id>>32 == 0 {
			t.Fatalf("id %#x has a zero count", o.id)
		}
		tab.del(o)
	}
}

// TestRecycleOnlyReleasedOps: a synchronous op is reused only after its
// deliverer let go of it, and comes back clean with its channel drained.
func TestRecycleOnlyReleasedOps(t *testing.T) {
	n := &Node{}
	o := n.syncOp()
	if o.done == nil || o.ready == nil {
		t.Fatal("syncOp: no done channel or ready condition")
	}
	o.err, o.old = errors.New("x"), 7
	o.fin.Store(finDone)
	o.done <- struct{}{}
	n.recycle(o) // done but not released: its deliverer may still touch it
	if n.syncOp() == o {
		t.Fatal("an op not released was recycled")
	}
	o.fin.Store(finReleased)
	n.recycle(o)
	var got *op
	for range 100 { // a sync.Pool may drop what it holds; try a few
		if got = n.syncOp(); got == o {
			break
		}
		o.fin.Store(finReleased)
		n.recycle(o)
	}
	if got != o {
		t.Skip("the pool never returned the op (sync.Pool may drop items)")
	}
	if o.fin.Load() != finPending || o.err != nil || o.old != 0 || o.sink != -1 || len(o.done) != 0 {
		t.Fatalf("recycled op not clean: fin %d err %v old %d sink %d queued %d", o.fin.Load(), o.err, o.old, o.sink, len(o.done))
	}
}

// TestOpTransitions: setState allows exactly the diagram's transitions
// and panics on any other.
func TestOpTransitions(t *testing.T) {
	allowed := map[[2]opState]bool{
		{opNew, opHeld}: true, {opNew, opQueued}: true, {opNew, opDone}: true,
		{opHeld, opQueued}: true, {opHeld, opDone}: true,
		{opQueued, opPosted}: true, {opQueued, opDone}: true,
		{opPosted, opStalled}: true, {opPosted, opDone}: true,
		{opStalled, opQueued}: true, {opStalled, opStalled}: true, {opStalled, opDone}: true,
	}
	for from := opNew; from <= opDone; from++ {
		for to := opNew; to <= opDone+1; to++ {
			o := newOp()
			o.state = from
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				o.setState(to)
				return false
			}()
			if want := allowed[[2]opState{from, to}]; panicked == want {
				t.Errorf("%v -> %v: panicked %v, want allowed %v", from, to, panicked, want)
			} else if want && o.state != to {
				t.Errorf("%v -> %v: state is %v", from, to, o.state)
			}
		}
	}
}
