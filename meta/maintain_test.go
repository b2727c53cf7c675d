package meta

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// countingClock counts the timers armed on it.
type countingClock struct {
	*softnictest.ManualClock
	timers atomic.Int64
}

func (c *countingClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.timers.Add(1)
	return c.ManualClock.AfterFunc(d, f)
}

// TestIdleClientSleeps: an idle client keeps its connection (a ping each
// IdleTimeout/3) without waking at every RetryInterval: over two minutes
// it arms a few timers per ping, not one per 200 ms tick (600, as its
// maintenance ticker did, a wake-up of every idle node five times a
// second, most of a 10,000-node simulation's time once it converged). A
// connection that dies is still made again at the next tick.
func TestIdleClientSleeps(t *testing.T) {
	checkLeaks(t)
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	srv := startServer(t, f.device(), ServerConfig{Clock: clk})
	cc := &countingClock{ManualClock: clk}
	cl := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1, Clock: cc})
	settle(f, srv)
	armed := cc.timers.Load()
	const idle = 2 * time.Minute // four times the server's IdleTimeout
	advance(clk, idle, 100*time.Millisecond, func() { settle(f, srv) })
	ticks := int64(idle / DefaultRetryInterval)
	if n := cc.timers.Load() - armed; n > ticks/10 {
		t.Fatalf("an idle client armed %d timers in %v (%d ticks of %v)", n, idle, ticks, DefaultRetryInterval)
	}
	t.Logf("an idle client armed %d timers in %v", cc.timers.Load()-armed, idle)
	if st := cl.Stats(); st.Connects != 1 || srv.Stats().Conns != 1 || srv.Stats().Reaped != 0 {
		t.Fatalf("idle connection not kept: client %+v, server %+v", st, srv.Stats())
	}
	cn := cl.servers[0].live()
	if cn == nil {
		t.Fatal("no live connection")
	}
	cn.kill()
	cn.unref()
	advance(clk, DefaultRetryInterval, 10*time.Millisecond, func() { settle(f, srv) })
	if st := cl.Stats(); st.Connects != 2 {
		t.Fatalf("a connection that died was not made again within a tick: %+v", st)
	}
}

// TestBusyAttemptsReuseQP: a client answered busy at every connection
// attempt makes one QP and uses it for every attempt (its connection
// requests all carry one QPN), where it made and dropped a QP and a CQ
// per attempt: most of what a 10,000-node start storm allocated.
func TestBusyAttemptsReuseQP(t *testing.T) {
	checkLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		f := newFabric(t, "fake", softnictest.Config{Seed: 1})
		srv := f.hostDevice(1)
		if err := srv.ListenRC(DefaultService, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
			return nil, nil, errors.New(busyReject)
		}); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		reqs, qpns := map[uint64]bool{}, map[uint32]bool{}
		f.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
			if to == srv.Addr() && h.Op == wire.OpCMReq {
				mu.Lock()
				reqs[h.ConnID], qpns[h.CMQPN] = true, true
				mu.Unlock()
			}
			return softnictest.Pass
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := NewClient(ctx, f.hostDevice(2), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1})
		if err == nil {
			t.Fatal("NewClient against a service always busy succeeded")
		}
		mu.Lock()
		defer mu.Unlock()
		if len(reqs) < 4 || len(qpns) != 1 {
			t.Fatalf("%d connection attempts from %d QPs, want one QP", len(reqs), len(qpns))
		}
		t.Logf("%d connection attempts answered busy, all from one QP", len(reqs))
	})
}
