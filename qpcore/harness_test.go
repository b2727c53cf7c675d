package qpcore_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// The meta client is a Resolver.
var _ qpcore.Resolver = (*meta.Client)(nil)

// mapResolver is a Resolver over a map, standing in for the meta client.
type mapResolver struct {
	mu      sync.Mutex
	m       map[uint32]meta.NodeInfo
	lookups atomic.Int64
	invals  atomic.Int64
	delay   time.Duration // added to every lookup, on clk
	clk     clock.Clock
	err     error // if set, every lookup fails with it (a meta service down)
}

func newResolver(clk clock.Clock) *mapResolver {
	return &mapResolver{m: make(map[uint32]meta.NodeInfo), clk: clk}
}

func (r *mapResolver) Lookup(ctx context.Context, gid uint32) (meta.NodeInfo, error) {
	r.lookups.Add(1)
	if r.delay > 0 {
		pause, stop := clock.After(r.clk, r.delay)
		defer stop()
		select {
		case <-pause:
		case <-ctx.Done():
			return meta.NodeInfo{}, ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return meta.NodeInfo{}, r.err
	}
	info, ok := r.m[gid]
	if !ok {
		return meta.NodeInfo{}, fmt.Errorf("gid %d: %w", gid, meta.ErrNotFound)
	}
	return info, nil
}

func (r *mapResolver) Invalidate(uint32) { r.invals.Add(1) }

func (r *mapResolver) set(info meta.NodeInfo) {
	r.mu.Lock()
	r.m[info.GID] = info
	r.mu.Unlock()
}

// tnode is a node of a test cluster: a softnic device (on the fake
// network or real UDP), a qpcore node, and its exported region "mem".
type tnode struct {
	t    testing.TB
	gid  uint32
	addr string
	dev  *softnic.Device
	n    *qpcore.Node
	mem  []byte
}

// A cluster runs on one fabric:
//
//   - "fake": softnictest's in-memory network on a manual clock (with
//     AutoFlush, so packets flow as soon as they are sent). Devices, nodes
//     and the resolver share the clock: no timeout, retransmission or
//     housekeeping tick happens unless the test moves time with advance,
//     so a busy machine cannot make an operation time out.
//   - "udp": softnic devices on real UDP sockets on 127.0.0.1 and the
//     system clock: the production path.
//
// newCluster makes a fake cluster; forEachFabric runs a test over both.
type cluster struct {
	t     testing.TB
	kind  string
	net   *softnictest.Network     // fake only
	clk   *softnictest.ManualClock // fake only
	clock clock.Clock              // clk, or the system clock
	res   *mapResolver
	nodes map[uint32]*tnode
	// noAtomics opens the devices of nodes added from now on without
	// atomics (softnic.Config.NoAtomics; fake fabric only).
	noAtomics bool
}

var fabricKinds = []string{"fake", "udp"}

func newCluster(t testing.TB) *cluster { return newClusterOn(t, "fake") }

func newClusterOn(t testing.TB, kind string) *cluster {
	c := &cluster{t: t, kind: kind, clock: clock.System{}, nodes: make(map[uint32]*tnode)}
	if kind == "fake" {
		c.clk = softnictest.NewManualClock(time.Time{})
		c.clock = c.clk
		c.net = softnictest.NewNetwork(softnictest.Config{Seed: 7, Clock: c.clk, AutoFlush: true})
	}
	c.res = newResolver(c.clock)
	t.Cleanup(func() {
		for _, tn := range c.nodes {
			tn.close()
		}
		if c.net != nil {
			c.net.Close()
		}
	})
	return c
}

// forEachFabric runs f as a subtest on a fresh cluster of each kind.
func forEachFabric(t *testing.T, f func(t *testing.T, c *cluster)) {
	for _, kind := range fabricKinds {
		t.Run(kind, func(t *testing.T) { f(t, newClusterOn(t, kind)) })
	}
}

// advance moves a fake cluster's clock forward by d in steps of step,
// calling between (if not nil) after each step so that goroutines the
// step woke can act. On UDP it fails the test: time-driven tests run on
// the fake fabric only.
func (c *cluster) advance(d, step time.Duration, between func()) {
	c.t.Helper()
	if c.clk == nil {
		c.t.Fatal("advance on a real-time cluster")
	}
	for d > 0 {
		s := min(d, step)
		c.clk.Advance(s)
		d -= s
		if between != nil {
			between()
		}
	}
}

// until advances a fake cluster's clock in steps of step until cond holds,
// failing after max of clock time. After each step it waits until every
// open node's dispatcher has done the housekeeping that came due (see
// housekept), so that a starved dispatcher does not let the clock run
// past what cond waits for: yielding alone did not make it run on a
// machine with CPU-bound processes beside the test.
func (c *cluster) until(what string, step, max time.Duration, cond func() bool) {
	c.t.Helper()
	for waited := time.Duration(0); !cond(); waited += step {
		if waited > max {
			c.t.Fatalf("%s: not after %v of clock time", what, max)
		}
		c.clk.Advance(step)
		c.housekept()
	}
}

// housekept waits until every open node's dispatcher has housekept within
// one Tick of the clock's time: it has handled the last tick that fell
// due. The deadline guards against a hang, not a slow machine.
func (c *cluster) housekept() {
	c.t.Helper()
	now := c.clk.Now()
	guard := time.Now().Add(2 * time.Minute)
	for _, tn := range c.nodes {
		for tn.n != nil { // nil: closed by the test (tnode.close)
			at, open := tn.n.HousekeptAt()
			if !open || at.After(now.Add(-tn.n.Config().Tick)) {
				break
			}
			if time.Now().After(guard) {
				c.t.Fatalf("node %d: last housekeeping at %v, clock at %v", tn.gid, at, now)
			}
			runtime.Gosched()
		}
	}
}

// settle lets runnable goroutines run (the manual clock's timers hand work
// to goroutines; this gives them the CPU before the test looks).
func settle() {
	for range 50 {
		runtime.Gosched()
	}
}

// add starts node gid on a fresh address exporting memSize bytes as
// "mem".
func (c *cluster) add(gid uint32, memSize int, cfg qpcore.Config) *tnode {
	return c.addAt(gid, "", memSize, cfg)
}

// device opens a device at addr ("" for a fresh one).
func (c *cluster) device(addr string) (*softnic.Device, error) {
	if c.net == nil {
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		return softnic.OpenUDP(addr)
	}
	var l *softnictest.Link
	var err error
	if addr == "" {
		l = c.net.NewLink()
	} else {
		ap, perr := netip.ParseAddrPort(addr)
		if perr != nil {
			return nil, perr
		}
		if l, err = c.net.NewLinkAt(ap); err != nil {
			return nil, err
		}
	}
	return softnic.Open(softnic.Config{Link: l, Clock: c.clk, NoAtomics: c.noAtomics})
}

func (c *cluster) addAt(gid uint32, addr string, memSize int, cfg qpcore.Config) *tnode {
	t := c.t
	t.Helper()
	dev, err := c.device(addr)
	if err != nil {
		t.Fatalf("device(%q): %v", addr, err)
	}
	cfg.GID = gid
	cfg.Clock = c.clock
	n, err := qpcore.NewNode(dev, c.res, cfg)
	if err != nil {
		dev.Close()
		t.Fatalf("NewNode: %v", err)
	}
	tn := &tnode{t: t, gid: gid, addr: dev.Addr().String(), dev: dev, n: n}
	if memSize > 0 {
		tn.mem = verbs.PageAligned(memSize)
		if _, err := n.Export("mem", tn.mem, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
			t.Fatal(err)
		}
	}
	c.res.set(n.Info())
	c.nodes[gid] = tn
	return tn
}

func (tn *tnode) close() {
	if tn.n != nil {
		tn.n.Close()
		tn.n = nil
	}
	if tn.dev != nil {
		tn.dev.Close()
		tn.dev = nil
	}
}

// ctxT returns a context that ends after d of real time, but never less
// than five minutes: it guards against a hang, it does not judge speed (time
// that matters runs on the cluster's clock).
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), max(d, 5*time.Minute))
	t.Cleanup(cancel)
	return ctx
}

func mustConnect(t testing.TB, n *qpcore.Node, gid uint32) *qpcore.VQP {
	t.Helper()
	v, err := n.Connect(ctxT(t, 5*time.Second), gid)
	if err != nil {
		t.Fatalf("Connect(%d): %v", gid, err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

func checkLeaks(t *testing.T) { leaktest.Check(t) }

// noQPErrors fails if any node saw an error completion on a QP.
func noQPErrors(t testing.TB, ns ...*qpcore.Node) {
	t.Helper()
	for _, n := range ns {
		if s := n.Stats(); s.QPErrors != 0 || s.PostErrors != 0 {
			t.Errorf("node %d: %d QP errors, %d post errors (%+v)", n.GID(), s.QPErrors, s.PostErrors, s)
		}
	}
}

// drive runs f in its own goroutine and, on a fake cluster, advances the
// clock in steps of step until f returns, failing once more than max of
// clock time went by. It returns the clock time f took (read by f's
// goroutine as f returns) and f's error. After each step it waits until
// the nodes' housekeeping caught up (housekept), which expires operations;
// between steps it waits up to a millisecond of real time for f: real
// time only paces the clock, it never decides a result. On UDP it just
// waits for f and returns the real time it took.
func (c *cluster) drive(step, max time.Duration, f func() error) (time.Duration, error) {
	c.t.Helper()
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	t0 := c.clock.Now()
	go func() {
		err := f()
		done <- result{err, c.clock.Now().Sub(t0)}
	}()
	if c.clk == nil {
		r := <-done
		return r.took, r.err
	}
	for {
		select {
		case r := <-done:
			return r.took, r.err
		case <-time.After(time.Millisecond):
		}
		if c.clk.Now().Sub(t0) > max {
			c.t.Fatalf("still running after %v of clock time", max)
		}
		c.clk.Advance(step)
		c.housekept()
	}
}

// pump advances a fake cluster's clock by step about every 100
// microseconds of real time until the returned stop is called: for tests
// whose goroutines need time to pass (RNR back-off) while the test
// goroutine blocks elsewhere. A no-op on UDP.
func (c *cluster) pump(step time.Duration) (stop func()) {
	if c.clk == nil {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(100 * time.Microsecond):
			}
			c.clk.Advance(step)
		}
	}()
	return func() { close(quit); <-done }
}

// eventually waits, yielding, until cond holds; it fails after a minute of
// real time, a guard against a hang, never a verdict on speed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	guard := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(guard) {
			t.Fatalf("%s: never happened", what)
		}
		settle()
	}
}
