package qpcore_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/bench/baseline"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

const fullAccess = verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic

// TestColdPeerDefaultRegionNoDirectoryRead: the meta entry carries the
// default region's rkey and length, so the first READ of a new peer's
// "mem" follows the lookup directly (no directory READ); another region
// is found through the directory, read once.
func TestColdPeerDefaultRegionNoDirectoryRead(t *testing.T) {
	checkLeaks(t)
	forEachFabric(t, func(t *testing.T, c *cluster) {
		a := c.add(1, 0, qpcore.Config{})
		b := c.add(2, 4096, qpcore.Config{})
		copy(b.mem, "hint-ok!")
		if _, err := b.n.Export("other", verbs.PageAligned(64), fullAccess); err != nil {
			t.Fatal(err)
		}
		c.res.set(b.n.Info())
		if info := b.n.Info(); info.MemRKey == 0 || info.MemLen != 4096 || info.MemAccess&fullAccess != fullAccess {
			t.Fatalf("Info does not carry the default region: %+v", info)
		}
		v := mustConnect(t, a.n, 2)
		buf := make([]byte, 8)
		if _, err := c.drive(time.Millisecond, time.Second, func() error { return v.Read(ctxT(t, 0), buf, "mem", 0) }); err != nil {
			t.Fatal(err)
		}
		if string(buf) != "hint-ok!" {
			t.Fatalf("read %q", buf)
		}
		if s := a.n.Stats(); s.DirReads != 0 || s.DirHints == 0 {
			t.Fatalf("first READ of mem: %d directory READs, %d hints; want 0 and >0", s.DirReads, s.DirHints)
		}
		if _, err := c.drive(time.Millisecond, time.Second, func() error { return v.Read(ctxT(t, 0), buf, "other", 0) }); err != nil {
			t.Fatal(err)
		}
		if s := a.n.Stats(); s.DirReads != 1 {
			t.Fatalf("first READ of another region: %d directory READs, want 1", s.DirReads)
		}
		rs, err := v.Regions(ctxT(t, 0))
		if err != nil || len(rs) != 2 {
			t.Fatalf("Regions after the hint: %v %v, want mem and other", rs, err)
		}
		noQPErrors(t, a.n, b.n)
	})
}

// TestStaleDefaultRegionHint: the peer exported "mem" again after its
// entry was published (new rkey, new size). The first operation through
// the stale hint fails with an error RetryableStale recognizes, and the
// retry reads the directory and succeeds. A READ at the end of the new
// size is refused locally (bounds), never on the wire.
func TestStaleDefaultRegionHint(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 4096, qpcore.Config{})
	if err := b.n.Unexport("mem"); err != nil {
		t.Fatal(err)
	}
	mem := verbs.PageAligned(128)
	copy(mem, "regrown!")
	if _, err := b.n.Export("mem", mem, fullAccess); err != nil {
		t.Fatal(err)
	}
	// c.res still holds the entry published before the re-export.
	v := mustConnect(t, a.n, 2)
	buf := make([]byte, 8)
	read := func(off uint64) error {
		_, err := c.drive(time.Millisecond, 2*time.Second, func() error { return v.Read(ctxT(t, 0), buf, "mem", off) })
		return err
	}
	err := read(0)
	if err == nil || !qpcore.RetryableStale(err) {
		t.Fatalf("READ through a stale hint: %v, want a retryable stale error", err)
	}
	if err := read(0); err != nil || string(buf) != "regrown!" {
		t.Fatalf("retry: %q %v", buf, err)
	}
	if err := read(128); !errors.Is(err, qpcore.ErrRemoteBounds) {
		t.Fatalf("READ at the new end: %v, want ErrRemoteBounds", err)
	}
	r, err := v.FreshRegion(ctxT(t, 0), "mem", 0)
	if err != nil || r.Len != 128 {
		t.Fatalf("FreshRegion: %+v %v", r, err)
	}
}

// TestTransportMismatch: a node refuses a peer whose meta entry names
// another transport, with an error that is EPROTO at the file level; a
// peer that names none is softnic/udp.
func TestTransportMismatch(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	c.add(2, 64, qpcore.Config{Transport: "rdma/roce"})
	b3 := c.add(3, 64, qpcore.Config{})
	_, err := a.n.Connect(ctxT(t, 0), 2)
	if !errors.Is(err, qpcore.ErrTransportMismatch) || !errors.Is(err, syscall.EPROTO) {
		t.Fatalf("Connect to an rdma/roce peer from softnic: %v, want ErrTransportMismatch (EPROTO)", err)
	}
	if info := b3.n.Info(); info.Transport != "" {
		t.Fatalf("default transport published as %q", info.Transport)
	}
	mustConnect(t, a.n, 3)
}

// TestMetaUnreachableErrno: a lookup the meta service does not answer
// surfaces with the meta error's errno (EHOSTDOWN), not as "no such peer".
func TestMetaUnreachableErrno(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	c.res.err = meta.ErrUnreachable
	_, err := a.n.Connect(ctxT(t, 0), 9)
	var me *meta.Error
	if !errors.Is(err, meta.ErrUnreachable) || errors.Is(err, qpcore.ErrNoPeer) || !errors.As(err, &me) || me.Errno() != syscall.EHOSTDOWN {
		t.Fatalf("Connect with the meta service down: %v", err)
	}
}

// BenchmarkQPCoreColdRead measures, in one run over real UDP: a cold
// connect (one one-sided READ of a meta entry) plus the first 8-byte READ
// of the peer's default region, against one warm READ on an open VQP. The
// meta entry carries the region's rkey, so the cold path is two round
// trips; the target is cold <= 2.3x warm.
func BenchmarkQPCoreColdRead(b *testing.B) {
	ctx := context.Background()
	res := newReadResolver(b, 4)
	a, peer, done := benchNodes(b, res, res.set)
	defer done()
	if _, err := peer.Export("mem", verbs.PageAligned(4096), fullAccess); err != nil {
		b.Fatal(err)
	}
	res.set(peer.Info())
	iters := min(max(b.N, 200), 2000)
	buf := make([]byte, 8)
	cold := make(baseline.Latencies, 0, iters)
	first := make(baseline.Latencies, 0, iters)
	warm := make(baseline.Latencies, 0, iters)
	dir0 := a.Stats().DirReads
	b.ResetTimer()
	for range iters {
		if !a.Forget(2) {
			b.Fatal("peer still in use")
		}
		t0 := time.Now()
		v, err := a.Connect(ctx, 2)
		t1 := time.Now()
		if err == nil {
			err = v.Read(ctx, buf, "mem", 0)
		}
		cold = append(cold, time.Since(t0))
		first = append(first, time.Since(t1))
		if err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		err = v.Read(ctx, buf, "mem", 0)
		warm = append(warm, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		v.Close()
	}
	b.StopTimer()
	cs := reportLat(b, "cold-connect+read", cold)
	ws := reportLat(b, "warm-read", warm)
	reportLat(b, "first-read", first)
	b.ReportMetric(baseline.Ratio(cs.Typical, ws.Typical), "cold-x-warm")
	b.ReportMetric(float64(a.Stats().DirReads-dir0)/float64(iters), "dir-reads/cold")
}
