package meta

import (
	"context"
	"errors"
	"fmt"
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

// TestIdleClientSleeps: an idle client keeps its connections (a ping each
// IdleTimeout/3) without waking at every RetryInterval: over two minutes
// it arms a few timers per ping, not one per 200 ms tick (600, as its
// maintenance ticker did, a wake-up of every idle node five times a
// second, most of a 10,000-node simulation's time once it converged). A
// connection that dies is still made again at the next tick, with one
// server or with replicas whose connections are live.
func TestIdleClientSleeps(t *testing.T) {
	for _, servers := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d servers", servers), func(t *testing.T) { testIdleClientSleeps(t, servers) })
	}
}

func testIdleClientSleeps(t *testing.T, servers int) {
	checkLeaks(t)
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	var srvs []*Server
	var addrs []netip.AddrPort
	for range servers {
		s := startServer(t, f.device(), ServerConfig{Clock: clk})
		srvs, addrs = append(srvs, s), append(addrs, s.Addr())
	}
	cc := &countingClock{ManualClock: clk}
	cl := startClient(t, f.device(), ClientConfig{Servers: addrs, CacheEntries: -1, Clock: cc})
	quiet := func() { settle(f, srvs...) }
	waitFor(t, time.Minute, "every server connected", func() bool { return cl.Stats().Connects == uint64(servers) })
	quiet()
	armed := cc.timers.Load()
	const idle = 2 * time.Minute // four times the servers' IdleTimeout
	advance(clk, idle, 100*time.Millisecond, quiet)
	ticks := int64(idle / DefaultRetryInterval)
	n := cc.timers.Load() - armed
	t.Logf("an idle client of %d servers armed %d timers in %v", servers, n, idle)
	if n > int64(servers)*ticks/10 {
		t.Fatalf("an idle client of %d servers armed %d timers in %v (%d ticks of %v)", servers, n, idle, ticks, DefaultRetryInterval)
	}
	for _, s := range srvs {
		if st := cl.Stats(); st.Connects != uint64(servers) || s.Stats().Conns != 1 || s.Stats().Reaped != 0 {
			t.Fatalf("idle connection not kept: client %+v, server %+v", st, s.Stats())
		}
	}
	cn := cl.servers[0].live()
	if cn == nil {
		t.Fatal("no live connection")
	}
	cn.kill()
	cn.unref()
	advance(clk, DefaultRetryInterval, 10*time.Millisecond, quiet)
	if st := cl.Stats(); st.Connects != uint64(servers)+1 {
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
