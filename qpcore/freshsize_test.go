package qpcore_test

import (
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// TestFreshSizeFromHint: an open of a cold peer's default region is sized
// from the meta entry (no directory READ); another region, and the
// default region once the directory replaced the hint, from a directory
// copy no older than maxAge.
func TestFreshSizeFromHint(t *testing.T) {
	checkLeaks(t)
	forEachFabric(t, func(t *testing.T, c *cluster) {
		a := c.add(1, 0, qpcore.Config{})
		b := c.add(2, 4096, qpcore.Config{})
		if _, err := b.n.Export("other", verbs.PageAligned(192), fullAccess); err != nil {
			t.Fatal(err)
		}
		c.res.set(b.n.Info())
		v := mustConnect(t, a.n, 2)
		n, err := v.FreshSize(ctxT(t, 0), qpcore.DefaultRegion, time.Second)
		if err != nil || n != 4096 {
			t.Fatalf("FreshSize(mem) = %d, %v; want 4096", n, err)
		}
		if s := a.n.Stats(); s.DirReads != 0 || s.DirHints != 1 {
			t.Fatalf("sizing mem from the hint: %d directory READs, %d hints; want 0 and 1", s.DirReads, s.DirHints)
		}
		if _, err := c.drive(time.Millisecond, time.Second, func() error {
			n, err = v.FreshSize(ctxT(t, 0), "other", time.Second)
			return err
		}); err != nil || n != 192 {
			t.Fatalf("FreshSize(other) = %d, %v; want 192", n, err)
		}
		if s := a.n.Stats(); s.DirReads != 1 {
			t.Fatalf("sizing another region: %d directory READs, want 1", s.DirReads)
		}
		// The directory replaced the hint: mem is sized from it now.
		if n, err = v.FreshSize(ctxT(t, 0), qpcore.DefaultRegion, time.Hour); err != nil || n != 4096 {
			t.Fatalf("FreshSize(mem) from the directory = %d, %v", n, err)
		}
		if s := a.n.Stats(); s.DirReads != 1 || s.DirHints != 1 {
			t.Fatalf("after the directory READ: %d READs, %d hints; want 1 and 1", s.DirReads, s.DirHints)
		}
		noQPErrors(t, a.n, b.n)
	})
}
