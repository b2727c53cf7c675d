package qpcore_test

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// restart replaces node gid by a new one (new device, DCT, keys, rkeys,
// incarnation) at addr, with fresh memory holding fill, and updates the
// resolver.
func (c *cluster) restart(gid uint32, addr string, fill []byte, cfg qpcore.Config) *tnode {
	old := c.nodes[gid]
	old.close()
	tn := c.addAt(gid, addr, 1<<20, cfg)
	copy(tn.mem, fill)
	tn.dev.SyncMemory()
	return tn
}

// A peer restarted with new metadata (same gid) is recovered
// transparently: the stale DC target is NAKed (or times out when the
// address changed), the peer is looked up again and the operation retried,
// on DC and from RC.
func TestPeerRestartRecovered(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sameAddr bool
		hot      bool
		late     time.Duration // the resolver serves the old metadata this long
	}{
		{"same address", true, false, 0},
		{"same address from RC", true, true, 0},
		{"new address", false, false, 0},
		{"late re-registration", true, false, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			c := newCluster(t)
			cfg := qpcore.Config{PeerTimeout: 300 * time.Millisecond, RCThreshold: 50, DisableRC: !tc.hot}
			a := c.add(1, 0, cfg)
			b := c.add(2, 1<<20, peerCfg)
			ctx := ctxT(t, 20*time.Second)
			v := mustConnect(t, a.n, 2)
			payload := bytes.Repeat([]byte("before"), 100)
			for i := 0; i < 200; i++ {
				if err := v.Write(ctx, payload, "mem", 0); err != nil {
					t.Fatal(err)
				}
			}
			if tc.hot {
				for i := 0; v.Transport() != qpcore.RC; i++ {
					if err := v.Write(ctx, payload, "mem", 0); err != nil {
						t.Fatal(err)
					}
					if i > 100000 {
						t.Fatal("never switched to RC")
					}
				}
				v.Write(ctx, payload, "mem", 0)
			}
			oldInfo := b.n.Info()
			addr := b.addr
			if !tc.sameAddr {
				addr = "127.0.0.1:0"
			}
			fill := bytes.Repeat([]byte("after!"), 100)
			nb := c.restart(2, addr, fill, peerCfg)
			ni := nb.n.Info()
			if ni.DCKey == oldInfo.DCKey || ni.Incarnation == oldInfo.Incarnation {
				t.Fatal("restart kept the keys")
			}
			if tc.late > 0 {
				c.res.set(oldInfo)
				timer := c.clock.AfterFunc(tc.late, func() { c.res.set(ni) })
				defer timer.Stop()
			}
			got := make([]byte, len(fill))
			// A new address is found out by a timeout, a late
			// re-registration by waiting: the clock moves until the read
			// is done.
			took, err := c.drive(10*time.Millisecond, 10*time.Second, func() error { return v.Read(ctx, got, "mem", 0) })
			if err != nil {
				t.Fatalf("read after restart: %v", err)
			}
			if !bytes.Equal(got, fill) {
				t.Fatalf("read after restart returned old data")
			}
			if err := v.Write(ctx, payload, "mem", 4096); err != nil {
				t.Fatal(err)
			}
			s := a.n.Stats()
			t.Logf("recovered in %v of clock time: relookups %d, stale retries %d, QP errors %d, RC errors %d, dir reads %d",
				took, s.Relookups, s.StaleRetries, s.QPErrors, s.RCErrors, s.DirReads)
			// A stale key is retried after the re-lookup; a silent old
			// address is looked up in the background and the operation
			// posted again (a loss retry) to the new one.
			if s.StaleRetries+s.LossRetries < 1 || s.Relookups < 1 || c.res.invals.Load() < 1 {
				t.Fatalf("no re-lookup: %+v", s)
			}
			if v.PeerInfo().Incarnation != ni.Incarnation {
				t.Fatal("VQP still on the old incarnation")
			}
		})
	}
}

// A dead peer gives ErrPeerUnreachable (EHOSTDOWN) within the timeout,
// for every operation in flight, and new operations fail at once for a
// while; an unknown gid gives ErrNoPeer.
func TestDeadPeerTimesOut(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	const timeout = 400 * time.Millisecond
	a := c.add(1, 0, qpcore.Config{PeerTimeout: timeout, DCIs: 2})
	b := c.add(2, 1<<20, peerCfg)
	c.add(3, 1<<20, peerCfg)
	ctx := ctxT(t, 20*time.Second)
	v := mustConnect(t, a.n, 2)
	other := mustConnect(t, a.n, 3)
	buf := make([]byte, 64)
	if err := v.Read(ctx, buf, "mem", 0); err != nil {
		t.Fatal(err)
	}
	b.close()
	// Several operations in flight at once, sync and async.
	wrs := make([]qpcore.WR, 8)
	for i := range wrs {
		wrs[i] = qpcore.WR{ID: uint64(i), Op: qpcore.OpRead, Local: make([]byte, 64), Region: "mem", Offset: uint64(i * 64)}
	}
	t0 := c.clock.Now()
	if n, err := v.Post(ctx, wrs, 0); n != len(wrs) || err != nil {
		t.Fatalf("post: %d %v", n, err)
	}
	// Meanwhile the dead peer holds a DCI; the other peer is not blocked
	// behind it (no head-of-line blocking across targets): 20 READs to it
	// finish while the clock stands still.
	for range 20 {
		if err := other.Read(ctx, make([]byte, 8), "mem", 0); err != nil {
			t.Fatalf("live peer while a dead peer held a DCI: %v", err)
		}
	}
	if c.clock.Now() != t0 {
		t.Fatal("the clock moved")
	}
	_, err := c.drive(10*time.Millisecond, 10*timeout, func() error { return v.Read(ctx, buf, "mem", 0) })
	el := c.clock.Now().Sub(t0)
	if !errors.Is(err, qpcore.ErrPeerUnreachable) || !errors.Is(err, syscall.EHOSTDOWN) {
		t.Fatalf("read from a dead peer: %v", err)
	}
	if el < timeout/2 || el > timeout+timeout/2+100*time.Millisecond {
		t.Fatalf("error after %v of clock time, timeout %v", el, timeout)
	}
	cs := make([]qpcore.Completion, 8)
	for got := 0; got < len(wrs); {
		if err := v.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		k := v.Poll(cs)
		for _, c := range cs[:k] {
			if !errors.Is(c.Err, qpcore.ErrPeerUnreachable) {
				t.Fatalf("async op to a dead peer: %v", c.Err)
			}
		}
		got += k
	}
	// Fails at once: the clock does not move.
	if err := v.Write(ctx, buf, "mem", 0); !errors.Is(err, qpcore.ErrPeerUnreachable) {
		t.Fatalf("second op: %v", err)
	}
	// The other peer is unaffected.
	if err := other.Read(ctx, buf, "mem", 0); err != nil {
		t.Fatalf("other peer: %v", err)
	}
	if _, err := a.n.Connect(ctx, 99); !errors.Is(err, qpcore.ErrNoPeer) || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("unknown gid: %v", err)
	}
	t.Logf("dead peer reported after %v of clock time (timeout %v)", el, timeout)
}

// A wrong DC key (stale metadata) is NAKed: the resolver entry is
// invalidated, the peer looked up again and the operation retried once.
// If the resolver keeps serving the wrong key, the operation fails with
// ErrStale after about PeerTimeout (waiting for new metadata), and nothing
// is retried forever.
func TestStaleDCKey(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	const timeout = 200 * time.Millisecond
	a := c.add(1, 0, qpcore.Config{PeerTimeout: timeout})
	b := c.add(2, 4096, peerCfg)
	ctx := ctxT(t, 10*time.Second)
	good := b.n.Info()
	bad := good
	bad.DCKey ^= 0xdead
	c.res.set(bad)
	v := mustConnect(t, a.n, 2)
	c.res.set(good) // what a fresh lookup returns
	if err := v.Write(ctx, []byte("hello"), "mem", 0); err != nil {
		t.Fatalf("write with a stale key: %v", err)
	}
	s := a.n.Stats()
	if s.StaleRetries != 1 || c.res.invals.Load() == 0 || b.dev.Stats().DCKeyRejects == 0 {
		t.Fatalf("no stale retry: %+v, %d DC key rejects", s, b.dev.Stats().DCKeyRejects)
	}
	// A key that stays wrong.
	v.Close()
	if !a.n.Forget(2) {
		t.Fatal("Forget refused")
	}
	c.res.set(bad)
	v2 := mustConnect(t, a.n, 2)
	d, err := c.drive(5*time.Millisecond, 10*timeout, func() error { return v2.Write(ctx, []byte("hello"), "mem", 0) })
	if !errors.Is(err, qpcore.ErrStale) && !errors.Is(err, qpcore.ErrDirectory) {
		t.Fatalf("write with a key that stays wrong: %v", err)
	}
	if d > timeout+timeout/2+100*time.Millisecond {
		t.Fatalf("took %v of clock time", d)
	}
	t.Logf("wrong key for good: %v after %v of clock time", err, d)
}

// The first directory READ after a peer restarted (its old DC key is
// refused, the peer is looked up again) is retried against the new
// incarnation's directory, not the old directory's rkey: a region other
// than mem is found at once.
func TestRestartDirectoryReadRetried(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{PeerTimeout: 300 * time.Millisecond})
	b := c.add(2, 1<<20, peerCfg)
	if _, err := b.n.Export("r", verbs.PageAligned(64), fullAccess); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	v := mustConnect(t, a.n, 2)
	if _, err := v.FreshRegion(ctx, "r", 0); err != nil {
		t.Fatal(err)
	}
	nb := c.restart(2, b.addr, nil, peerCfg)
	if _, err := nb.n.Export("r", verbs.PageAligned(64), fullAccess); err != nil {
		t.Fatal(err)
	}
	c.clk.Advance(time.Millisecond) // the cached directory is older than 0
	before := a.n.Stats()
	_, err := c.drive(10*time.Millisecond, 10*time.Second, func() error {
		_, err := v.FreshRegion(ctx, "r", 0)
		return err
	})
	if err != nil {
		t.Fatalf("first directory read after the restart: %v", err)
	}
	s := a.n.Stats()
	t.Logf("relookups %d stale retries %d dir reads %d remote errors %d", s.Relookups-before.Relookups, s.StaleRetries-before.StaleRetries, s.DirReads-before.DirReads, s.RemoteErrors-before.RemoteErrors)
	if d := s.DirReads - before.DirReads; d > 2 {
		t.Errorf("%d directory READs for one look after a restart, want at most 2 (the refused one and its retry)", d)
	}
}
