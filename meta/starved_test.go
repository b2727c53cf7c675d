package meta

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// runOnClock runs f in a goroutine and moves clk forward in steps of
// step (letting goroutines run between them) until f returns; it fails
// the test if f has not returned after limit of clock time.
func runOnClock(t *testing.T, clk *softnictest.ManualClock, step, limit time.Duration, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	for moved := time.Duration(0); ; moved += step {
		select {
		case <-done:
			return moved
		default:
		}
		if moved > limit {
			t.Fatalf("still running after %v of clock time", moved)
		}
		clk.Advance(step)
		time.Sleep(200 * time.Microsecond)
	}
}

// TestStarvedServerLoopbackRetransmits: a meta server whose host is
// starved of CPU reads its own loopback ACKs late (here: every packet
// from the server to itself arrives stall late). Its table WRITEs are
// then retransmitted at the connection ACK timeout, not every 8 ms (the
// NIC's default, with which 1% of a CPU left a real service reading
// 7,114 of its own WRITEs among 8,880 datagrams), and the registration
// completes with no repair of the loopback QP.
func TestStarvedServerLoopbackRetransmits(t *testing.T) {
	checkLeaks(t)
	const stall = 400 * time.Millisecond // a few connection ACK timeouts
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	sdev := f.device()
	srv := startServer(t, sdev, ServerConfig{Slots: 256, Clock: clk, Lease: time.Hour})
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, Clock: clk})
	ctx := ctxT(t)
	self := sdev.Addr()
	var writes atomic.Int64
	var delay atomic.Int64
	f.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if from != self || to != self {
			return softnictest.Pass
		}
		if h.Op == wire.OpWrite {
			writes.Add(1)
		}
		return softnictest.Delay(time.Duration(delay.Load()))
	})
	register := func(gid uint32) {
		runOnClock(t, clk, 5*time.Millisecond, time.Minute, func() {
			if _, err := rawRegister(ctx, c, testNode(gid, uint64(gid)), time.Hour); err != nil {
				t.Errorf("register %d: %v", gid, err)
			}
		})
	}
	register(1)
	base := writes.Load() // the WRITE packets of one registration
	writes.Store(0)
	delay.Store(int64(stall))
	register(2)
	got := writes.Load()
	t.Logf("a registration: %d loopback WRITE packets; with its ACKs %v late: %d", base, stall, got)
	// The round trip is 2*stall (WRITE and ACK both late): at
	// connQPTimeout (125 ms) a group is sent about 2*stall/125ms + 1
	// times; at 8 ms it was sent 1,806 times and the QP failed 10 times.
	if limit := base * int64(2*stall/connQPTimeout+2); got > limit {
		t.Errorf("%d loopback WRITE packets for a registration whose ACKs are %v late; want at most %d", got, stall, limit)
	}
	if n := srv.Stats().LoopRepairs; n != 0 {
		t.Errorf("%d loopback QP repairs: a slow loopback was taken for a broken one", n)
	}
}

// TestLookupsBackOffFromASlowServer: established connections to a meta
// server whose answers are all stall late (longer than the RC retry
// budget of QPTimeout*(QPRetryCnt+1), 1 s). Each client's READs back off
// (the connection's ACK timeout doubles while a READ waits), so every
// lookup completes on the connection it has, with a few copies of each
// READ request; at a fixed 125 ms each READ was sent 8 times and then the
// connection failed, and its reconnection (ConnectTimeout, 1 s) failed
// too: the 64-process mesh's "connection request timed out".
func TestLookupsBackOffFromASlowServer(t *testing.T) {
	checkLeaks(t)
	const (
		clients = 8
		gids    = 8
		stall   = 1500 * time.Millisecond
	)
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	ctx := ctxT(t)
	sdev := f.device()
	srv := startServer(t, sdev, ServerConfig{Slots: 256, Clock: clk, Lease: time.Hour})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, Clock: clk, CacheEntries: -1}
	reg := startClient(t, f.device(), ccfg)
	for g := uint32(1); g <= gids; g++ {
		if _, err := rawRegister(ctx, reg, testNode(g, uint64(g)), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	cs := make([]*Client, clients)
	for i := range cs {
		cs[i] = startClient(t, f.device(), ccfg)
	}
	self := sdev.Addr()
	var readReqs atomic.Int64
	f.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if h.Op == wire.OpReadReq && to == self {
			readReqs.Add(1)
		}
		if from == self && to != self {
			return softnictest.Delay(stall)
		}
		return softnictest.Pass
	})
	errs := make(chan error, clients*gids)
	moved := runOnClock(t, clk, 5*time.Millisecond, 10*time.Minute, func() {
		var wg sync.WaitGroup
		for _, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for g := uint32(1); g <= gids; g++ {
					n, err := c.Lookup(ctx, g)
					if err == nil && (!consistent(n) || n.GID != g) {
						err = fmt.Errorf("lookup %d: got %+v", g, n)
					}
					if err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
	})
	f.net.SetFilter(nil)
	close(errs)
	for err := range errs {
		t.Errorf("lookup from a server %v late: %v", stall, err)
	}
	lookups := int64(clients * gids)
	t.Logf("%d lookups in %v of clock time: %d READ requests", lookups, moved, readReqs.Load())
	// Copies of the first READ at 0, 125, 375, 875 ms (then the timeout
	// is MaxQPTimeout, 1 s): 4; of each later one at 0 and 1 s: 2.
	if got, limit := readReqs.Load(), lookups*3; got > limit {
		t.Errorf("%d READ requests for %d lookups; want at most %d", got, lookups, limit)
	}
	for i, c := range cs {
		st := c.Stats()
		if st.Connects != 1 || st.Rebuilds != 0 || st.Backoffs == 0 {
			t.Errorf("client %d: %d connects, %d rebuilds, %d backoffs; want 1 connect, no rebuild, some backoff", i, st.Connects, st.Rebuilds, st.Backoffs)
		}
	}
}

// TestAgentAttemptLastsOnePeriod: an agent's renewal attempt ends within
// one heartbeat period when the server does not answer, even on a
// connection whose ACK timeout backed off to MaxQPTimeout (its RPC
// timeout is then 8 s, longer than the lease): the server renews a lease
// when a heartbeat arrives, so the next one must leave on time rather
// than wait for a late reply or a slow reconnection.
func TestAgentAttemptLastsOnePeriod(t *testing.T) {
	checkLeaks(t)
	const lease = 3 * time.Second
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64, Clock: clk, Lease: lease})
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, Clock: clk})
	info := testNode(5, 9)
	info.MemRKey, info.MemLen, info.MemAccess, info.Transport = 0, 0, 0, "softnic/udp"
	var a *Agent
	runOnClock(t, clk, 5*time.Millisecond, time.Minute, func() {
		var err error
		if a, err = c.Register(ctx, info, AgentConfig{}); err != nil {
			t.Error(err)
		}
	})
	if a == nil {
		t.FailNow()
	}
	defer a.Close()
	cn := c.servers[0].live()
	cn.rtoMu.Lock()
	cn.rto = c.cfg.MaxQPTimeout // as after READs that waited for a slow server
	cn.rtoMu.Unlock()
	cn.setAckTimeout(c.cfg.MaxQPTimeout)
	rpc := cn.rpcTimeout()
	cn.unref()
	if rpc <= lease {
		t.Fatalf("RPC timeout %v: the test needs one longer than the lease", rpc)
	}
	f.net.Isolate(srv.Addr())
	defer f.net.Heal()
	period := a.period(0)
	took := runOnClock(t, clk, 5*time.Millisecond, time.Minute, func() { a.maintain(a.ctx, 0) })
	if took > period+50*time.Millisecond {
		t.Errorf("a renewal attempt to a server that does not answer lasted %v of clock time; want at most the period, %v (RPC timeout %v)", took, period, rpc)
	}
}
