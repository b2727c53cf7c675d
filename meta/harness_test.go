package meta

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// fabric makes devices of one kind: on the in-memory fake network (real
// time, optional faults) or on real UDP sockets on 127.0.0.1.
type fabric struct {
	t    testing.TB
	kind string
	net  *softnictest.Network
	clk  *softnictest.ManualClock // the network's and devices' clock, if manual
}

var fabricKinds = []string{"fake", "udp"}

func newFabric(t testing.TB, kind string, cfg softnictest.Config) *fabric {
	f := &fabric{t: t, kind: kind}
	if kind == "fake" {
		f.net = softnictest.NewNetwork(cfg)
		f.clk = cfg.Clock
		t.Cleanup(func() { f.net.Close() })
	}
	return f
}

// devClock is the clock of the fabric's devices: the network's manual
// clock, or nil (the system clock).
func (f *fabric) devClock() clock.Clock {
	if f.clk == nil {
		return nil
	}
	return f.clk
}

func fakeFabric(t testing.TB) *fabric { return newFabric(t, "fake", softnictest.Config{Seed: 1}) }

// device opens a device; it is closed at cleanup (closing twice is fine).
func (f *fabric) device() *softnic.Device {
	f.t.Helper()
	if f.net == nil {
		d, err := softnic.OpenUDP("127.0.0.1:0")
		if err != nil {
			f.t.Fatalf("OpenUDP: %v", err)
		}
		f.t.Cleanup(func() { d.Close() })
		return d
	}
	d, err := softnic.Open(softnic.Config{Link: f.net.NewLink(), Clock: f.devClock()})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { d.Close() })
	return d
}

// deviceAt opens a device at addr: a restarted host.
func (f *fabric) deviceAt(addr netip.AddrPort) *softnic.Device {
	f.t.Helper()
	var d *softnic.Device
	var err error
	if f.net == nil {
		d, err = softnic.OpenUDP(addr.String())
	} else {
		var l *softnictest.Link
		if l, err = f.net.NewLinkAt(addr); err == nil {
			d, err = softnic.Open(softnic.Config{Link: l, Clock: f.devClock()})
		}
	}
	if err != nil {
		f.t.Fatalf("device at %v: %v", addr, err)
	}
	f.t.Cleanup(func() { d.Close() })
	return d
}

func startServer(t testing.TB, dev *softnic.Device, cfg ServerConfig) *Server {
	t.Helper()
	s, err := NewServer(dev, cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// startClient makes a client and waits until its DCCache is built, so
// that what a test reads is cached (see TestDCCacheBuiltInBackground for
// the time before).
func startClient(t testing.TB, dev *softnic.Device, cfg ClientConfig) *Client {
	t.Helper()
	c, err := NewClient(context.Background(), dev, cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	<-c.dcReady
	return c
}

// waitDCCache returns c's DCCache once built (nil if disabled).
func (c *Client) waitDCCache() *ristretto.Cache[uint32, NodeInfo] {
	<-c.dcReady
	return c.dc.Load()
}

// ctxT returns a context that guards a test against a hang: two minutes of
// real time, far beyond what any test needs even on a busy machine (what
// is timed runs on a manual clock or is judged by counts).
func ctxT(t testing.TB) context.Context {
	// Five minutes: a hang guard. TestTenThousandNodes (on a manual clock
	// that never moves) took over two minutes of real time with -race on
	// a 2-vCPU machine busy with other test processes.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// testNode returns a node whose fields all derive from (gid, inc), so
// that any mix of two versions of an entry is detectable: consistent
// checks the derivation.
func testNode(gid uint32, inc uint64) NodeInfo {
	n := NodeInfo{
		GID:         gid,
		Incarnation: inc,
		Addr:        netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(inc >> 16), byte(inc >> 8), byte(inc)}), uint16(inc>>24)|1),
		DCTN:        uint32(inc*7) & 0xffffff,
		DCKey:       inc * 0x9e3779b97f4a7c15,
		DirRKey:     uint32(inc>>32) ^ gid,
		DirLen:      uint32(inc) * 3,
		MemRKey:     uint32(inc>>8) ^ gid,
		MemLen:      inc * 5,
		MemAccess:   verbs.Access(inc) & verbs.AccessAll,
		Transport:   []string{"softnic/udp", "rdma/roce", "rdma/ib", ""}[inc%4],
	}
	if inc%3 != 0 { // some entries know the default region's owner, some not
		n.MemOwnerKnown, n.MemMode, n.MemUID, n.MemGID = true, uint32(inc)&0o7777, uint32(inc>>12), uint32(inc>>20)
	}
	return n
}

func consistent(n NodeInfo) bool { return n == testNode(n.GID, n.Incarnation) }

// waitFor polls cond every few milliseconds for up to d, or two minutes
// if that is longer: the wait guards against a hang, it does not judge
// speed (other processes may hold the 2 vCPUs for seconds).
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	d = max(d, 2*time.Minute)
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// rawRegister registers n over a client's connection without an Agent
// (no heartbeats): a node that will crash.
func rawRegister(ctx context.Context, c *Client, n NodeInfo, lease time.Duration) (NodeInfo, error) {
	var out NodeInfo
	err := c.each(ctx, func(cn *conn) (bool, error) {
		rep, err := cn.call(ctx, message{kind: kindRegister, node: n, leaseMs: uint32(lease / time.Millisecond)})
		if err != nil {
			return false, err
		}
		if err := rep.status.err(); err != nil {
			return true, err
		}
		out = n
		out.GID, out.Incarnation = rep.node.GID, rep.node.Incarnation
		return true, nil
	})
	return out, err
}

func checkLeaks(t *testing.T) { leaktest.Check(t) }

// advance moves a manual clock forward in steps, letting goroutines that
// the steps wake (heartbeats, sweeps) run between them.
func advance(clk *softnictest.ManualClock, d, step time.Duration, between func()) {
	for d > 0 {
		s := min(d, step)
		clk.Advance(s)
		d -= s
		if between != nil {
			between()
		}
	}
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// settle waits until the fabric's network has nothing waiting and the
// server's loop has not woken for a few polls: what a manual-clock test
// does before it moves time on, so that time moves only when the system
// has done what the current instant allows (however slow the machine).
func settle(f *fabric, srvs ...*Server) {
	turns := func() uint64 {
		var n uint64
		for _, s := range srvs {
			n += s.turns.Load()
		}
		return n
	}
	quiet := 0
	for quiet < 3 {
		q, n := f.net.QueuedNow(), turns()
		time.Sleep(200 * time.Microsecond)
		if q == 0 && f.net.QueuedNow() == 0 && turns() == n {
			quiet++
		} else {
			quiet = 0
		}
	}
}

// drive advances clk in steps of step, settling before each, until cond
// holds or limit of clock time has passed; it returns the clock time it
// took and whether cond held.
func drive(f *fabric, clk *softnictest.ManualClock, step, limit time.Duration, cond func() bool, srvs ...*Server) (time.Duration, bool) {
	start := clk.Now()
	for {
		settle(f, srvs...)
		if cond() {
			return clk.Now().Sub(start), true
		}
		if clk.Now().Sub(start) >= limit {
			return clk.Now().Sub(start), false
		}
		clk.Advance(step)
	}
}

// hostDevice opens a device on the fake network at host i's own address
// (10.x.y.z:4791), so that the per-source limits of the meta service and
// the connection manager see many hosts, as a cluster's service does.
func (f *fabric) hostDevice(i int) *softnic.Device {
	f.t.Helper()
	return f.deviceAt(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 4791))
}

// forEachGID calls f for gids 1..n on workers goroutines and waits.
func forEachGID(n uint32, workers int, f func(g uint32)) {
	var wg sync.WaitGroup
	var next atomic.Uint32
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := next.Add(1); g <= n; g = next.Add(1) {
				f(g)
			}
		}()
	}
	wg.Wait()
}

// untilAnswered runs f until it returns something other than
// ErrUnreachable (at most 20 times), waiting a reconnection backoff on clk
// in between: what a daemon does while it starts.
func untilAnswered(ctx context.Context, clk clock.Clock, f func() error) error {
	cfg := ClientConfig{Servers: []netip.AddrPort{{}}}
	for try := 1; ; try++ {
		err := f()
		if err == nil || try == 20 || !errors.Is(err, ErrUnreachable) {
			return err
		}
		ch, stop := clock.After(clk, retryDelayFor(cfg, try))
		select {
		case <-ch:
		case <-ctx.Done():
			stop()
			return err
		}
	}
}
