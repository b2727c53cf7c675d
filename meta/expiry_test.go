package meta

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// registerMany registers gids 1..n over a few clients (no heartbeats),
// with inc(g) as each incarnation and lease as the lease asked for.
func registerMany(t *testing.T, f *fabric, ccfg ClientConfig, n uint32, lease time.Duration, inc func(uint32) uint64) {
	t.Helper()
	ctx := ctxT(t)
	var clients []*Client
	for range 4 {
		clients = append(clients, startClient(t, f.device(), ccfg))
	}
	var failed atomic.Uint32
	forEachGID(n, 32, func(g uint32) {
		if _, err := rawRegister(ctx, clients[g%4], testNode(g, inc(g)), lease); err != nil && failed.Add(1) < 5 {
			t.Errorf("gid %d: %v", g, err)
		}
	})
	if failed.Load() > 0 {
		t.Fatalf("%d of %d registrations failed", failed.Load(), n)
	}
}

// TestMassExpiryKeepsAnswering: 10,000 leases run out at once (a meta
// service that was stopped, or a rack that lost power). One sweep removes
// them all - about 40,000 table WRITEs, ten times the loopback send queue
// - and the service keeps answering: a ping at once, a new registration
// once the table shows the removals, and the table ends up holding only
// the new node. Before the sweep's writes were split into groups that fit
// the send queue, the group was never posted and every later reply that
// waited for the table waited forever.
func TestMassExpiryKeepsAnswering(t *testing.T) {
	checkLeaks(t)
	// One manual clock for everything: it moves only when the test says,
	// so the leases run out together and no timeout fires while the
	// server works through the removals.
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	srv := startServer(t, f.device(), ServerConfig{Clock: clk, Lease: time.Second, SweepInterval: 100 * time.Millisecond})
	nodes := uint32(10000)
	if testing.Short() {
		nodes = 2000 // still a group of 8,000 WRITEs, twice the send queue
	}
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1, Clock: clk}
	inc := func(g uint32) uint64 { return uint64(g)*1000 + 1 }
	registerMany(t, f, ccfg, nodes, time.Second, inc)
	if st := srv.Stats(); st.Nodes != int(nodes) {
		t.Fatalf("server holds %d nodes", st.Nodes)
	}
	cl := startClient(t, f.device(), ccfg)
	writes := srv.Stats().TableWrites
	// Every lease ends; the next sweep removes them all at once.
	clk.Advance(1100 * time.Millisecond)
	waitFor(t, time.Minute, "the sweep", func() bool { return srv.Stats().Expired == uint64(nodes) })
	// The service answers while it writes the removals: a ping, and a
	// registration whose reply waits for the table. Time moves in steps
	// once the system is quiet (settle), as it would for a live service.
	fresh := testNode(nodes+1, 7)
	var pingErr, regErr error
	var answered atomic.Bool
	go func() {
		defer answered.Store(true)
		ctx := ctxT(t)
		cn, err := cl.connect(ctx, cl.servers[0], false)
		if err != nil {
			pingErr = err
			return
		}
		_, pingErr = cn.call(ctx, message{kind: kindPing})
		cn.unref()
		// Answered busy while the removals are pending: back off and ask
		// again, as an agent does.
		regErr = cl.whileBusy(ctx, func() error {
			_, err := rawRegister(ctx, cl, fresh, time.Minute)
			return err
		})
	}()
	took, ok := drive(f, clk, 10*time.Millisecond, 30*time.Second, answered.Load, srv)
	if !ok {
		t.Fatalf("no answer within %v of clock time after the mass expiry", took)
	}
	if pingErr != nil || regErr != nil {
		t.Fatalf("after the mass expiry: ping %v, registration %v", pingErr, regErr)
	}
	t.Logf("%d leases expired at once; a registration was answered after %v of clock time (%d busy answers first; peak %d table WRITEs pending)",
		nodes, took, cl.Stats().Busy, srv.Stats().PeakPendingWrites)
	ctx := ctxT(t)
	st := srv.Stats()
	if st.Nodes != 1 {
		t.Fatalf("server holds %d nodes", st.Nodes)
	}
	// Four WRITEs per removed slot at least, all posted.
	if got := st.TableWrites - writes; got < 4*uint64(nodes) {
		t.Fatalf("%d table WRITEs for %d removals", got, nodes)
	}
	all, err := cl.List(ctx)
	if err != nil || len(all) != 1 || all[0] != fresh {
		t.Fatalf("List after the mass expiry: %d nodes (%v)", len(all), err)
	}
	if n, err := cl.Lookup(ctx, 1); !isNotFound(err) {
		t.Fatalf("an expired node: %+v %v", n, err)
	}
}
