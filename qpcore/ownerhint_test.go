package qpcore_test

import (
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// TestFreshRegionOwnerHint: a cold peer's default region is described in
// full (length, mode, owner) from the meta entry, with no directory READ,
// while the hint is at most maxAge old; a chmod on the peer shows once
// that bound has passed on the clock (the directory is read then). A hint
// seeded from an entry the DCCache still holds carries the old mode for
// at most maxAge more; a fresh entry carries the new one.
func TestFreshRegionOwnerHint(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 4096, qpcore.Config{})
	if _, err := b.n.SetOwner(qpcore.DefaultRegion, 0o640, 1000, 100); err != nil {
		t.Fatal(err)
	}
	oldEntry := b.n.Info()
	if !oldEntry.MemOwnerKnown || oldEntry.MemMode != 0o640 || oldEntry.MemUID != 1000 || oldEntry.MemGID != 100 {
		t.Fatalf("Info() publishes owner %v %#o %d:%d, want 0640 1000:100",
			oldEntry.MemOwnerKnown, oldEntry.MemMode, oldEntry.MemUID, oldEntry.MemGID)
	}
	c.res.set(oldEntry)
	const maxAge = time.Second
	// stat does not move the clock (the fake network delivers without
	// it): the checks below sit exactly at maxAge, and a clock moved while
	// a loaded machine ran the stat slowly crossed it.
	stat := func(v *qpcore.VQP) qpcore.Region {
		t.Helper()
		r, err := v.FreshRegion(ctxT(t, 0), qpcore.DefaultRegion, maxAge)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	want := func(r qpcore.Region, mode uint32, reads, hints uint64) {
		t.Helper()
		s := a.n.Stats()
		if r.Len != 4096 || r.Mode != mode || r.UID != 1000 || r.GID != 100 || s.DirReads != reads || s.DirHints != hints {
			t.Fatalf("stat of mem: %d bytes mode %#o %d:%d, %d directory READs, %d hints; want 4096 %#o 1000:100, %d, %d",
				r.Len, r.Mode, r.UID, r.GID, s.DirReads, s.DirHints, mode, reads, hints)
		}
	}

	v := mustConnect(t, a.n, 2)
	want(stat(v), 0o640, 0, 1)
	// The peer's owner changes mem's mode (its directory says so at once).
	if _, err := b.n.SetOwner(qpcore.DefaultRegion, 0o604, 1000, 100); err != nil {
		t.Fatal(err)
	}
	c.advance(maxAge, maxAge, nil)
	want(stat(v), 0o640, 0, 2) // maxAge old: still the hint, still the old mode
	c.advance(time.Millisecond, time.Millisecond, nil)
	want(stat(v), 0o604, 1, 2) // past the bound: the directory, the new mode
	v.Close()

	// Forgotten, and looked up again while the DCCache still holds the old
	// entry: the old mode again, for at most maxAge.
	if !a.n.Forget(2) {
		t.Fatal("Forget(2) refused")
	}
	v = mustConnect(t, a.n, 2)
	want(stat(v), 0o640, 1, 3)
	c.advance(maxAge+time.Millisecond, maxAge, nil)
	want(stat(v), 0o604, 2, 3)
	v.Close()

	// The entry republished (what a node does on chmod of its mem) and
	// the cache expired: a new hint carries the new mode.
	c.res.set(b.n.Info())
	if !a.n.Forget(2) {
		t.Fatal("Forget(2) refused")
	}
	v = mustConnect(t, a.n, 2)
	want(stat(v), 0o604, 2, 4)
	noQPErrors(t, a.n, b.n)
}

// TestFreshRegionOldEntry: an entry that does not carry the owner (a node
// of before, or one that published none) is a hint for data and sizes
// only: a stat reads the directory, which has the real mode, even a mode
// of 0.
func TestFreshRegionOldEntry(t *testing.T) {
	checkLeaks(t)
	forEachFabric(t, func(t *testing.T, c *cluster) {
		a := c.add(1, 0, qpcore.Config{})
		b := c.add(2, 4096, qpcore.Config{})
		if _, err := b.n.SetOwner(qpcore.DefaultRegion, 0, 7, 8); err != nil {
			t.Fatal(err)
		}
		info := b.n.Info()
		info.MemOwnerKnown, info.MemMode, info.MemUID, info.MemGID = false, 0, 0, 0
		c.res.set(info)
		v := mustConnect(t, a.n, 2)
		if n, err := v.FreshSize(ctxT(t, 0), qpcore.DefaultRegion, time.Second); err != nil || n != 4096 {
			t.Fatalf("FreshSize(mem) = %d, %v", n, err)
		}
		if s := a.n.Stats(); s.DirReads != 0 || s.DirHints != 1 {
			t.Fatalf("sizing from an entry without owner: %d directory READs, %d hints; want 0, 1", s.DirReads, s.DirHints)
		}
		var r qpcore.Region
		if _, err := c.drive(time.Millisecond, time.Second, func() (err error) {
			r, err = v.FreshRegion(ctxT(t, 0), qpcore.DefaultRegion, time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if s := a.n.Stats(); r.Mode != 0 || r.UID != 7 || r.GID != 8 || r.Len != 4096 || s.DirReads != 1 {
			t.Fatalf("stat from an entry without owner: mode %#o %d:%d %d bytes, %d directory READs; want 0 7:8 4096, 1",
				r.Mode, r.UID, r.GID, r.Len, s.DirReads)
		}
		noQPErrors(t, a.n, b.n)
	})
}

// TestFreshSizeDefaultRegionAnyAge: a warm open of the default region is
// sized from the cached directory copy however old it is (its length
// comes with the rkey the data path uses, which the peer checks); another
// region still needs a copy no older than maxAge. A resize on the peer is
// caught by the data path: the old rkey is refused, the directory read
// again, and the size follows.
func TestFreshSizeDefaultRegionAnyAge(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 4096, qpcore.Config{})
	if _, err := b.n.Export("other", verbs.PageAligned(192), fullAccess); err != nil {
		t.Fatal(err)
	}
	v := mustConnect(t, a.n, 2)
	size := func(name string) uint64 {
		t.Helper()
		var n uint64
		if _, err := c.drive(time.Millisecond, time.Second, func() (err error) {
			n, err = v.FreshSize(ctxT(t, 0), name, time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := size("other"); n != 192 || a.n.Stats().DirReads != 1 {
		t.Fatalf("FreshSize(other) = %d after %d directory READs, want 192 after 1", n, a.n.Stats().DirReads)
	}
	c.advance(time.Hour, time.Minute, nil)
	if n := size(qpcore.DefaultRegion); n != 4096 || a.n.Stats().DirReads != 1 {
		t.Fatalf("FreshSize(mem) from an hour-old copy = %d after %d directory READs, want 4096 after 1", n, a.n.Stats().DirReads)
	}
	if n := size("other"); n != 192 || a.n.Stats().DirReads != 2 {
		t.Fatalf("FreshSize(other) from an hour-old copy = %d after %d directory READs, want 192 after 2", n, a.n.Stats().DirReads)
	}
	// The peer exports mem again, larger: the stale rkey is refused once,
	// and the directory read again gives the new size.
	if err := b.n.Unexport(qpcore.DefaultRegion); err != nil {
		t.Fatal(err)
	}
	if _, err := b.n.Export(qpcore.DefaultRegion, verbs.PageAligned(8192), fullAccess); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	_, err := c.drive(time.Millisecond, time.Minute, func() error {
		return v.Read(ctxT(t, 0), buf, qpcore.DefaultRegion, 0)
	})
	if !qpcore.RetryableStale(err) {
		t.Fatalf("READ through the old rkey: %v, want a retryable refusal", err)
	}
	if n := size(qpcore.DefaultRegion); n != 8192 || a.n.Stats().DirReads != 3 {
		t.Fatalf("FreshSize(mem) after the refusal = %d after %d directory READs, want 8192 after 3", n, a.n.Stats().DirReads)
	}
}
