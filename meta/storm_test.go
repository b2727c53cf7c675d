package meta

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// stormResult is what a start storm ends with.
type stormResult struct {
	converged time.Duration // clock time from the first start to the last node done
	stats     []ServerStats
	dropped   uint64 // packets the servers' full receive queues dropped
	// lookupRetries counts lookups asked again (no server reachable, or
	// the node not registered at that moment).
	lookupRetries int
}

// startStorm starts nodes nodes within window against the
// meta servers (each on its own host, receiving at most pps packets per
// second of clock: a loaded process), every node on one of the hosts'
// devices with a client of its own: it connects, registers through an
// Agent and looks itself and another registered node up. It drives the
// clock until every node is done (or limit) and reports.
//
// It runs in a testing/synctest bubble on the real-time fake network: time
// is the bubble's fake clock, which moves only when every goroutine of the
// simulation is blocked, so the service's only cost is the pacing of its
// receive (however slow the machine running the test), and no time passes
// while anything can still run.
func startStorm(t *testing.T, nodes, servers, pps int, window, limit time.Duration) stormResult {
	f := newFabric(t, "fake", softnictest.Config{Seed: 7})
	var srvs []*Server
	var links []*softnictest.Link
	var addrs []netip.AddrPort
	for i := range servers {
		l, err := f.net.NewLinkAt(netip.MustParseAddrPort("10.255.0." + string(rune('1'+i)) + ":4791"))
		if err != nil {
			t.Fatal(err)
		}
		l.SetRxRate(pps)
		dev, err := softnic.Open(softnic.Config{Link: l})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		s := startServer(t, dev, ServerConfig{MaxConns: 2 * nodes, MaxConnsPerSource: nodes})
		srvs, links, addrs = append(srvs, s), append(links, l), append(addrs, s.Addr())
	}
	ccfg := ClientConfig{Servers: addrs, CacheEntries: -1, Depth: 4}
	hosts := max(nodes/10, 1)
	devs := make([]*softnic.Device, hosts)
	for i := range devs {
		devs[i] = f.hostDevice(i + 1)
	}
	ctx := ctxT(t)
	var done, retried atomic.Int32
	var failed atomic.Int32
	var regMu sync.Mutex
	var registered []uint32
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range nodes {
		gid := uint32(i + 1)
		wg.Add(1)
		run := func() {
			defer wg.Done()
			defer done.Add(1)
			fail := func(what string, err error) {
				if failed.Add(1) <= 5 {
					t.Errorf("node %d: %s: %v", gid, what, err)
				}
			}
			// As a daemon starts (node.Start): a service that did not
			// answer is asked again, after a backoff.
			var c *Client
			var err error
			for try := 1; ; try++ {
				if c, err = NewClient(ctx, devs[i%hosts], ccfg); err == nil || try == 20 {
					break
				}
				time.Sleep(retryDelayFor(ccfg, try))
			}
			if err != nil {
				fail("NewClient", err)
				return
			}
			t.Cleanup(func() { c.Close() })
			var a *Agent
			for try := 1; ; try++ {
				if a, err = c.Register(ctx, testNode(gid, uint64(gid)*1000+1), AgentConfig{}); err == nil || try == 20 {
					break
				}
				time.Sleep(c.retryDelay(try))
			}
			if err != nil {
				fail("Register", err)
				return
			}
			t.Cleanup(func() { a.Close() })
			regMu.Lock()
			registered = append(registered, gid)
			other := registered[rand.IntN(len(registered))]
			regMu.Unlock()
			// A lookup that finds no server (its connection broke and
			// the service is shedding) or not the node (its agent is
			// registering again after its lease ran out in the storm)
			// is asked again after a backoff, as an application would.
			for _, g := range []uint32{gid, other} {
				var n NodeInfo
				for try := 1; ; try++ {
					n, err = c.Lookup(ctx, g)
					if err == nil || try == 20 || !errors.Is(err, ErrUnreachable) && !errors.Is(err, ErrNotFound) {
						break
					}
					retried.Add(1)
					time.Sleep(c.retryDelay(try))
				}
				if err != nil || n != testNode(g, uint64(g)*1000+1) {
					fail("Lookup", err)
					return
				}
			}
		}
		// Started within the window, in random order.
		time.AfterFunc(time.Duration(rng.Int64N(int64(window))), run)
	}
	// Converged: every node done, and every server holds every node (an
	// agent registers with the replicas that did not answer at first in
	// the background).
	converged := func() bool {
		if done.Load() < int32(nodes) {
			return false
		}
		for _, s := range srvs {
			if s.Stats().Nodes < nodes {
				return false
			}
		}
		return true
	}
	start := time.Now()
	for !converged() && time.Since(start) < limit {
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	if !converged() {
		for _, s := range srvs {
			t.Logf("server: %+v", s.Stats())
		}
		t.Fatalf("start storm: %d of %d nodes done after %v", done.Load(), nodes, took)
	}
	wg.Wait()
	if failed.Load() > 0 {
		for _, s := range srvs {
			t.Logf("server: %+v", s.Stats())
		}
		t.Fatalf("start storm: %d of %d nodes failed", failed.Load(), nodes)
	}
	r := stormResult{converged: took, lookupRetries: int(retried.Load())}
	for i, s := range srvs {
		r.stats = append(r.stats, s.Stats())
		r.dropped += links[i].Counters().Overflow
	}
	return r
}

// stormSize is the start storm's size: 10,000 nodes starting within 1 s,
// or, under -short or the race detector (about ten times slower), 2,000
// within 0.2 s - the same rate of arrivals, for a fifth of the time. make
// test runs both: the 2,000-node storm with the rest of the suite under
// -race, then the 10,000-node storm without it (about half a minute of
// real time on 2 vCPUs).
func stormSize() (nodes int, window time.Duration) {
	if testing.Short() || raceEnabled {
		return 2000, 200 * time.Millisecond
	}
	return 10000, time.Second
}

// stormPPS is the packets per second a simulated meta service handles. A
// full receive queue (softnictest's default 4,096 packets, like a socket
// buffer) then waits about 80 ms.
const stormPPS = 50000

// TestStartStorm: 10,000 nodes start within one second against one meta
// service that handles at most 50,000 packets per second (about 14 per
// node: the handshake, the registration and its table WRITEs, two lookup
// READs, their ACKs), so the storm asks for about three seconds of its
// work in one. Every node registers and looks up; the service's pending
// table WRITEs and half-open connections stay within their bounds (it
// sheds the rest as busy, and the nodes back off), and its receive queue
// is bounded by construction (a full one drops, like a socket).
func TestStartStorm(t *testing.T) {
	checkLeaks(t)
	nodes, window := stormSize()
	var r stormResult
	synctest.Test(t, func(t *testing.T) { r = startStorm(t, nodes, 1, stormPPS, window, 5*time.Minute) })
	checkStorm(t, r, nodes)
}

// TestStartStormReplicas: the same storm against three replicas; every
// node registers with all three.
func TestStartStormReplicas(t *testing.T) {
	checkLeaks(t)
	nodes, window := stormSize()
	nodes, window = nodes/5, window/5 // three connections per node
	var r stormResult
	synctest.Test(t, func(t *testing.T) { r = startStorm(t, nodes, 3, stormPPS, window, 5*time.Minute) })
	checkStorm(t, r, nodes)
}

func checkStorm(t *testing.T, r stormResult, nodes int) {
	t.Helper()
	for i, st := range r.stats {
		if st.Nodes != nodes {
			t.Fatalf("server %d holds %d of %d nodes", i, st.Nodes, nodes)
		}
		// One batch of completions (up to 128 registrations) may be
		// admitted past the bound before it is checked again.
		if st.PeakPendingWrites > uint64(DefaultMaxPendingWrites+128*8) || st.PeakHalfOpen > DefaultMaxHalfOpen {
			t.Fatalf("server %d: bounds exceeded: %+v", i, st)
		}
		t.Logf("server %d: busy %d, peak %d WRITEs pending, peak %d half-open, %d conns, %d leases expired in the storm, %d loopback repairs",
			i, st.Busy, st.PeakPendingWrites, st.PeakHalfOpen, st.Conns, st.Expired, st.LoopRepairs)
	}
	t.Logf("%d nodes against %d server(s) converged %v after the first start; %d packets dropped at full server queues; %d lookups asked again",
		nodes, len(r.stats), r.converged, r.dropped, r.lookupRetries)
}

// retryDelayFor is Client.retryDelay for a client not made yet.
func retryDelayFor(cfg ClientConfig, try int) time.Duration {
	_ = cfg.fill()
	return (&Client{cfg: cfg}).retryDelay(try)
}
