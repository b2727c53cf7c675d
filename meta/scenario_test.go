package meta

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestLeaseExpiryRemovesCrashedNode: of two registered nodes, one keeps
// heartbeating and one crashes; once its lease ends, its entry is cleared
// from the table (not just hidden), the live one stays, and the crashed
// node's restart gets a new incarnation.
func TestLeaseExpiryRemovesCrashedNode(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	clk := softnictest.NewManualClock(time.Time{})
	srv := startServer(t, f.device(), ServerConfig{Slots: 64, Lease: time.Second, SweepInterval: 100 * time.Millisecond, Clock: clk})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, Clock: clk}
	alive, err := startClient(t, f.device(), ccfg).Register(ctx, testNode(1, 11), AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer alive.Close()
	crashCl := startClient(t, f.device(), ccfg)
	crashed, err := crashCl.Register(ctx, testNode(2, 22), AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	crashed.crash()
	peerCfg := ccfg
	peerCfg.CacheEntries = -1
	peer := startClient(t, f.device(), peerCfg)
	if _, err := peer.Lookup(ctx, 2); err != nil {
		t.Fatalf("before expiry: %v", err)
	}
	// 1.5 s in 50 ms steps; after each, the live node must have renewed
	// within the last 400 ms (it heartbeats every 333 ms).
	advance(clk, 1500*time.Millisecond, 50*time.Millisecond, func() {
		waitFor(t, 5*time.Second, "heartbeat", func() bool {
			return clk.Now().Sub(alive.Status()[0].Renewed) < 400*time.Millisecond
		})
	})
	waitFor(t, 5*time.Second, "expiry", func() bool { return srv.Stats().Expired == 1 })
	if _, err := peer.Lookup(ctx, 2); !isNotFound(err) {
		t.Fatalf("crashed node after its lease: %v", err)
	}
	if n, err := peer.Lookup(ctx, 1); err != nil || n != testNode(1, 11) {
		t.Fatalf("live node: %+v %v", n, err)
	}
	all, err := peer.List(ctx)
	if err != nil || len(all) != 1 || all[0].GID != 1 {
		t.Fatalf("List after expiry: %+v %v", all, err)
	}
	// The crashed daemon restarts: same gid, new incarnation.
	again, err := crashCl.Register(ctx, testNode(2, 0), AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if n, err := peer.Lookup(ctx, 2); err != nil || n.Incarnation == 22 || n.Incarnation != again.Info().Incarnation {
		t.Fatalf("after restart: %+v %v (agent %+v)", n, err, again.Info())
	}
}

// TestMetaRestart: the meta server restarts at the same address with an
// empty table; nodes notice (their heartbeats fail), peers keep using
// cached entries meanwhile, and every node registers again by itself
// with its gid and incarnation.
func TestMetaRestart(t *testing.T) {
	for _, kind := range fabricKinds {
		t.Run(kind, func(t *testing.T) { testMetaRestart(t, kind) })
	}
}

func testMetaRestart(t *testing.T, kind string) {
	checkLeaks(t)
	f := newFabric(t, kind, softnictest.Config{Seed: 1})
	ctx := ctxT(t)
	clk := softnictest.NewManualClock(time.Time{})
	scfg := ServerConfig{Slots: 64, Lease: time.Second, Clock: clk}
	sdev := f.device()
	srv := startServer(t, sdev, scfg)
	addr := srv.Addr()
	ccfg := ClientConfig{Servers: []netip.AddrPort{addr}, Clock: clk, RPCTimeout: 200 * time.Millisecond}
	var agents []*Agent
	for gid := uint32(1); gid <= 3; gid++ {
		a, err := startClient(t, f.device(), ccfg).Register(ctx, testNode(gid, 0), AgentConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		agents = append(agents, a)
	}
	peer := startClient(t, f.device(), ccfg)
	for gid := uint32(1); gid <= 3; gid++ {
		if _, err := peer.Lookup(ctx, gid); err != nil {
			t.Fatal(err)
		}
	}
	peer.waitDCCache().Wait()
	inc1 := srv.Bootstrap().ServerIncarnation

	srv.Close()
	sdev.Close()
	// Down: heartbeats fail, lookups are served from the cache.
	advance(clk, time.Second, 100*time.Millisecond, func() { time.Sleep(5 * time.Millisecond) })
	for gid := uint32(1); gid <= 3; gid++ {
		if n, err := peer.Lookup(ctx, gid); err != nil || n != agents[gid-1].Info() {
			t.Fatalf("cached lookup while the server is down: %+v %v", n, err)
		}
	}
	waitFor(t, 5*time.Second, "nodes noticing", func() bool {
		for _, a := range agents {
			if a.Status()[0].Err == nil {
				return false
			}
		}
		return true
	})

	srv2 := startServer(t, f.deviceAt(addr), scfg)
	if srv2.Bootstrap().ServerIncarnation == inc1 {
		t.Fatal("restarted server kept its incarnation")
	}
	waitFor(t, 10*time.Second, "re-registration", func() bool {
		clk.Advance(100 * time.Millisecond)
		return len(srv2.Nodes()) == 3
	})
	for i, n := range srv2.Nodes() {
		if n != agents[i].Info() {
			t.Fatalf("re-registered as %+v, want %+v", n, agents[i].Info())
		}
	}
	// The registry counts a node before its table entry is written, so a
	// lookup may briefly miss it: wait for the table, then compare.
	for gid := uint32(1); gid <= 3; gid++ {
		var n NodeInfo
		var err error
		waitFor(t, 10*time.Second, "a lookup from the restarted server", func() bool {
			peer.Invalidate(gid)
			n, err = peer.Lookup(ctx, gid)
			if errors.Is(err, ErrNotFound) {
				clk.Advance(10 * time.Millisecond)
				return false
			}
			return true
		})
		if err != nil || n != agents[gid-1].Info() {
			t.Fatalf("lookup from the restarted server: %+v %v", n, err)
		}
	}
}

// TestReplicaKilled: nodes register with two meta servers; one dies;
// lookups fail over, a new client still connects and resolves, and a new
// node still registers.
func TestReplicaKilled(t *testing.T) {
	for _, kind := range fabricKinds {
		t.Run(kind, func(t *testing.T) { testReplicaKilled(t, kind) })
	}
}

func testReplicaKilled(t *testing.T, kind string) {
	checkLeaks(t)
	f := newFabric(t, kind, softnictest.Config{Seed: 1})
	ctx := ctxT(t)
	d1, d2 := f.device(), f.device()
	s1 := startServer(t, d1, ServerConfig{Slots: 64})
	s2 := startServer(t, d2, ServerConfig{Slots: 64})
	both := []netip.AddrPort{s1.Addr(), s2.Addr()}
	// Real time (the fake network runs on it too): the timeouts only bound
	// how long the dead replica takes to be given up on, so they leave a
	// busy machine room to answer from the live one (8 x 25 ms per QP).
	ccfg := ClientConfig{Servers: both, QPTimeout: 25 * time.Millisecond, QPRetryCnt: 7, RPCTimeout: 2 * time.Second}
	var agents []*Agent
	for gid := uint32(1); gid <= 3; gid++ {
		a, err := startClient(t, f.device(), ccfg).Register(ctx, testNode(gid, 0), AgentConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		agents = append(agents, a)
	}
	// A replica still being connected to when a node registered gets
	// the registration from the node's agent right after.
	waitFor(t, 5*time.Second, "both replicas", func() bool { return len(s1.Nodes()) == 3 && len(s2.Nodes()) == 3 })
	pcfg := ccfg
	pcfg.CacheEntries = -1
	peer := startClient(t, f.device(), pcfg)
	waitFor(t, 5*time.Second, "peer connected to both", func() bool {
		st := peer.Servers()
		return st[0].Up && st[1].Up
	})
	peer.pref.Store(0) // it prefers the replica about to die
	if _, err := peer.Lookup(ctx, 1); err != nil {
		t.Fatal(err)
	}
	s1.Close()
	d1.Close()
	for gid := uint32(1); gid <= 3; gid++ {
		if n, err := peer.Lookup(ctx, gid); err != nil || n != agents[gid-1].Info() {
			t.Fatalf("lookup with one replica dead: %+v %v", n, err)
		}
	}
	if peer.Stats().Failovers == 0 {
		t.Fatal("no failover counted")
	}
	fresh := startClient(t, f.device(), pcfg)
	all, err := fresh.List(ctx)
	if err != nil || len(all) != 3 {
		t.Fatalf("new client with one replica dead: %+v %v", all, err)
	}
	late, err := startClient(t, f.device(), ccfg).Register(ctx, testNode(4, 0), AgentConfig{})
	if err != nil {
		t.Fatalf("registering with one replica dead: %v", err)
	}
	defer late.Close()
	if n, err := fresh.Lookup(ctx, 4); err != nil || n != late.Info() {
		t.Fatalf("node registered after the loss: %+v %v", n, err)
	}
}

// hammer re-registers gids with new incarnations (deregister, register)
// while readers look them up and list the table, and checks every entry
// a reader returns is one whole version. It returns the readers' torn
// READ count.
func hammer(t *testing.T, f *fabric, d time.Duration) uint64 {
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64, Neighborhood: 8})
	// The race runs in real time. Its RPC timeout is a hang guard, not
	// what is tested: a reply can take seconds on a host whose CPUs other
	// processes hold (it failed "did not answer in time" with the default
	// 1 s). The QP timeout stays what the default makes it (1 s / 8), so
	// losses are repaired as fast as before; a QP that runs out of retries
	// anyway is rebuilt by the client.
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1,
		RPCTimeout: 2 * time.Minute, QPTimeout: DefaultRPCTimeout / (DefaultQPRetryCnt + 1)}
	writer := startClient(t, f.device(), ccfg)
	const gids = 8
	var incs [gids + 1]atomic.Uint64
	for g := uint32(1); g <= gids; g++ {
		if _, err := rawRegister(ctx, writer, testNode(g, uint64(g)<<32), time.Minute); err != nil {
			t.Fatal(err)
		}
		incs[g].Store(uint64(g) << 32)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var updates, found, missing atomic.Uint64
	fail := make(chan error, 8)
	wg.Add(1)
	go func() { // the writer
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 1))
		for {
			select {
			case <-stop:
				return
			default:
			}
			g := 1 + rng.Uint32N(gids)
			old := incs[g].Load()
			if err := writer.each(ctx, func(cn *conn) (bool, error) {
				_, err := cn.call(ctx, message{kind: kindDeregister, node: NodeInfo{GID: g, Incarnation: old}})
				return err == nil, err
			}); err != nil {
				fail <- err
				return
			}
			if _, err := rawRegister(ctx, writer, testNode(g, old+1), time.Minute); err != nil {
				fail <- err
				return
			}
			incs[g].Store(old + 1)
			updates.Add(1)
		}
	}()
	var readers []*Client
	for r := range 2 {
		rc := startClient(t, f.device(), ccfg)
		readers = append(readers, rc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if i%50 == 49 {
					all, err := rc.List(ctx)
					if err != nil {
						fail <- err
						return
					}
					for _, n := range all {
						if !consistent(n) {
							fail <- errors.New("List returned a torn entry")
							return
						}
					}
					continue
				}
				g := 1 + rng.Uint32N(gids)
				n, err := rc.Lookup(ctx, g)
				switch {
				case isNotFound(err):
					missing.Add(1) // between deregister and register
				case err != nil:
					fail <- err
					return
				case !consistent(n) || n.GID != g:
					fail <- errors.New("Lookup returned a torn entry")
					return
				default:
					found.Add(1)
				}
			}
		}()
	}
	select {
	case err := <-fail:
		t.Error(err)
	case <-time.After(d):
	}
	close(stop)
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Error(err)
	}
	var torn uint64
	for _, rc := range readers {
		torn += rc.Stats().TornReads
	}
	t.Logf("%d updates, %d lookups found, %d between versions, %d torn READs repeated", updates.Load(), found.Load(), missing.Load(), torn)
	if updates.Load() == 0 || found.Load() == 0 {
		t.Fatal("hammer did nothing")
	}
	return torn
}

// TestUpdatesRacingReads: the server's table writes race the readers'
// READs. The loopback WRITEs that carry entry bodies are delayed, so that
// readers often READ a slot in the middle of a write; every such READ is
// detected and repeated, and no reader ever returns a torn entry.
func TestUpdatesRacingReads(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	f.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, payload []byte) softnictest.Verdict {
		if from == to && h.Op == wire.OpWrite && len(payload) == offTail-offGID {
			return softnictest.Delay(300 * time.Microsecond)
		}
		return softnictest.Pass
	})
	if torn := hammer(t, f, 1500*time.Millisecond); torn == 0 {
		t.Fatal("no READ ever saw a write in progress: the test did not race")
	}
}

// TestUpdatesRacingReadsLossy is the same race over a network that
// drops, duplicates and reorders packets (READ responses are served
// again, WRITEs retransmitted).
func TestUpdatesRacingReadsLossy(t *testing.T) {
	checkLeaks(t)
	f := newFabric(t, "fake", softnictest.Config{Seed: 5, Drop: 0.02, Dup: 0.02, Reorder: 0.02, ReorderDelay: 100 * time.Microsecond})
	hammer(t, f, time.Second)
}

// TestTenThousandNodes: 10,000 nodes register; every one resolves by one
// READ, the listing has them all, and a gid nobody registered is not
// found.
func TestTenThousandNodes(t *testing.T) {
	checkLeaks(t)
	// Everything runs on one manual clock that never moves: leases never
	// run out, and neither do RPC timeouts nor the devices' ACK timeouts,
	// however long a busy machine keeps the server from answering.
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Clock: clk})
	const nodes = 10000
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1, Clock: clk}
	inc := func(g uint32) uint64 { return uint64(g)*1000 + 1 }
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	var next atomic.Uint32
	for range 4 {
		c := startClient(t, f.device(), ccfg)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					g := next.Add(1)
					if g > nodes {
						return
					}
					if _, err := rawRegister(ctx, c, testNode(g, inc(g)), 0); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := srv.Stats(); st.Nodes != nodes {
		t.Fatalf("server holds %d nodes", st.Nodes)
	}
	reader := startClient(t, f.device(), ccfg)
	var bad atomic.Uint32
	next.Store(0)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				g := next.Add(1)
				if g > nodes {
					return
				}
				n, err := reader.Lookup(ctx, g)
				if err != nil || n != testNode(g, inc(g)) {
					if bad.Add(1) < 5 {
						t.Errorf("gid %d: %+v %v", g, n, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatalf("%d of %d nodes did not resolve", bad.Load(), nodes)
	}
	if st := reader.Stats(); st.Reads != nodes {
		t.Fatalf("%d READs for %d lookups", st.Reads, nodes)
	}
	// From the membership map: the map, the live slots (runs of
	// adjacent ones in one READ each), the map's generation again.
	reads := reader.Stats().Reads
	all, err := reader.List(ctx)
	if err != nil || len(all) != nodes {
		t.Fatalf("List: %d nodes, %v", len(all), err)
	}
	if got := reader.Stats().Reads - reads; got < 3 || got > nodes+2 {
		t.Fatalf("List from the map took %d READs for %d nodes", got, nodes)
	}
	for i, n := range all {
		if n != testNode(uint32(i+1), inc(uint32(i+1))) {
			t.Fatalf("List[%d] = %+v", i, n)
		}
	}
	// Without the map (an older server): the 4 MiB table in 64 KiB
	// READs, one doorbell (ListChunk is 16 MiB).
	cn := reader.servers[0].live()
	cn.boot.MapOffset = 0
	cn.unref()
	defer func(c int) { listChunk = c }(listChunk)
	listChunk = 64 << 10
	reads = reader.Stats().Reads
	all, err = reader.List(ctx)
	if err != nil || len(all) != nodes {
		t.Fatalf("List: %d nodes, %v", len(all), err)
	}
	if got, want := reader.Stats().Reads-reads, uint64(srv.Bootstrap().TableLen+64<<10-1)/(64<<10); got != want {
		t.Fatalf("List took %d READs, want %d", got, want)
	}
	for i, n := range all {
		if n != testNode(uint32(i+1), inc(uint32(i+1))) {
			t.Fatalf("List[%d] = %+v", i, n)
		}
	}
	if _, err := reader.Lookup(ctx, nodes+1); !isNotFound(err) {
		t.Fatalf("unregistered gid: %v", err)
	}
	t.Logf("server: %+v", srv.Stats())
}

// rawCall sends b as a request on cn and waits for a reply; b's request
// ID is set to the op's.
func rawCall(ctx context.Context, cn *conn, b []byte) (message, error) {
	slot, seq, err := cn.acquire(ctx, opRPC)
	if err != nil {
		return message{}, err
	}
	if len(b) >= msgHdrLen {
		id := reqID(slot, seq)
		b[4], b[5], b[6], b[7] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
	}
	if err := cn.qp.PostSend([]verbs.SendWR{{ID: wrID(slot, seq), Op: verbs.OpSend, Flags: verbs.Inline, InlineData: b}}); err != nil {
		return message{}, err
	}
	timeout, stop := clock.After(cn.cl.clock, time.Second)
	defer stop()
	if abandoned, err := cn.wait(ctx, slot, seq, timeout, false); err != nil {
		if !abandoned {
			cn.finish(slot)
		}
		return message{}, err
	}
	cn.pollMu.Lock()
	rep := cn.ops[slot].reply
	cn.pollMu.Unlock()
	cn.finish(slot)
	return rep, nil
}

// TestMalformedRejectedAndCounted: registration messages that do not
// parse are refused with a malformed reply when their header allows one,
// counted, and change nothing.
func TestMalformedRejectedAndCounted(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	good := message{kind: kindRegister, node: testNode(4, 4)}
	enc := func(m message) []byte { return m.append(nil) }
	withByte := func(i int, v byte) []byte { b := enc(good); b[i] = v; return b }
	answered := [][]byte{
		enc(good)[:20], // truncated body
		append(enc(good), 1, 2, 3),
		withByte(8+8+26, 0x40), // unknown address flags
		enc(message{kind: kindRegister, node: NodeInfo{Addr: netip.MustParseAddrPort("[::]:9")}}), // no address
		withByte(3, byte(stInUse)), // a status in a request
	}
	unanswered := [][]byte{
		{1, 2, 3},                               // no header
		withByte(0, 'X'),                        // bad magic
		withByte(2, 0x7e),                       // unknown kind
		enc(message{kind: kindPing | replyBit}), // a reply sent to the server
	}
	cn := c.anyLive()
	defer cn.unref()
	for i, b := range answered {
		rep, err := rawCall(ctx, cn, b)
		if err != nil || rep.status != stMalformed || rep.kind != kindRegister|replyBit {
			t.Fatalf("malformed message %d: reply %+v, %v", i, rep, err)
		}
	}
	for _, b := range unanswered {
		if err := cn.qp.PostSend([]verbs.SendWR{{Op: verbs.OpSend, Flags: verbs.Inline, InlineData: b}}); err != nil {
			t.Fatal(err)
		}
	}
	want := uint64(len(answered) + len(unanswered))
	waitFor(t, 5*time.Second, "malformed count", func() bool { return srv.Stats().Malformed == want })
	if st := srv.Stats(); st.Nodes != 0 || st.Registered != 0 {
		t.Fatalf("a malformed message changed the table: %+v", st)
	}
	// The server is fine, and so is the connection.
	if _, err := rawRegister(ctx, c, testNode(4, 4), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Lookup(ctx, 4); err != nil || n != testNode(4, 4) {
		t.Fatalf("after malformed messages: %+v %v", n, err)
	}
	if c.Stats().Connects != 1 {
		t.Fatalf("the connection was lost: %+v", c.Stats())
	}
}

// TestPreviousVersionNode: a node of the previous release (version 2
// messages: records without the default region's owner) registers with
// this server, is answered in version 2, and is found with its owner
// unknown, so that peers read its region directory for mem's mode.
func TestPreviousVersionNode(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	n := testNode(5, 7)
	if !n.MemOwnerKnown {
		t.Fatal("test node without an owner")
	}
	cn := c.anyLive()
	defer cn.unref()
	reg := message{kind: kindRegister, leaseMs: 3000, node: n, version: msgVersionNoOwner}
	rep, err := rawCall(ctx, cn, reg.append(nil))
	if err != nil || rep.status != stOK || rep.kind != kindRegister|replyBit || rep.version != msgVersionNoOwner {
		t.Fatalf("version 2 registration: reply %+v, %v", rep, err)
	}
	want := n
	want.MemOwnerKnown, want.MemMode, want.MemUID, want.MemGID = false, 0, 0, 0
	lk := message{kind: kindLookup, node: NodeInfo{GID: n.GID}, version: msgVersionNoOwner}
	rep, err = rawCall(ctx, cn, lk.append(nil))
	if err != nil || rep.status != stOK || rep.version != msgVersionNoOwner || rep.node != want {
		t.Fatalf("version 2 lookup: reply %+v, %v; want node %+v", rep, err, want)
	}
	if got, err := c.Lookup(ctx, n.GID); err != nil || got != want {
		t.Fatalf("one-sided lookup of a version 2 node: %+v, %v; want %+v", got, err, want)
	}
}

// TestEmbedded runs the meta server inside a node's process, on the
// node's own device (krfs mount's single-node default).
func TestEmbedded(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	dev := f.device()
	srv := startServer(t, dev, ServerConfig{Slots: 64})
	c := startClient(t, dev, ClientConfig{Servers: []netip.AddrPort{dev.Addr()}})
	a, err := c.Register(ctx, NodeInfo{Addr: dev.Addr(), DCTN: 77, DCKey: 78}, AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Info().GID != DefaultFirstAssignedGID {
		t.Fatalf("assigned gid %d", a.Info().GID)
	}
	if n, err := c.Lookup(ctx, a.Info().GID); err != nil || n != a.Info() {
		t.Fatalf("embedded lookup: %+v %v", n, err)
	}
	if len(srv.Nodes()) != 1 {
		t.Fatal(srv.Nodes())
	}
}

// TestTableAccess: clients may READ the table, through their RC
// connection or through a DCI at the server's DCT, and may not write it.
func TestTableAccess(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	dev := f.device()
	c := startClient(t, dev, ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	if _, err := rawRegister(ctx, c, testNode(1, 1), 0); err != nil {
		t.Fatal(err)
	}
	boot := c.Servers()[0].Bootstrap
	if boot != srv.Bootstrap() {
		t.Fatalf("client bootstrap %+v, server %+v", boot, srv.Bootstrap())
	}
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	defer cq.Destroy()
	mem := make([]byte, boot.TableLen)
	mr, _ := pd.RegMR(mem, verbs.AccessLocalWrite)
	defer mr.Dereg()
	dci, err := pd.CreateQP(verbs.QPConfig{Type: verbs.DCI, SendCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	defer dci.Destroy()
	for _, st := range []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		if err := dci.Modify(verbs.QPAttr{State: st}); err != nil {
			t.Fatal(err)
		}
	}
	tgt := &verbs.DCTarget{Addr: srv.Addr(), DCTN: boot.DCTN, DCKey: boot.DCKey}
	post := func(q verbs.QP, wr verbs.SendWR) verbs.WC {
		t.Helper()
		wr.Flags |= verbs.Signaled
		if err := q.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		var wc [1]verbs.WC
		cq.Poll(wc[:])
		return wc[0]
	}
	wc := post(dci, verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: mr, Length: boot.TableLen}, RKey: boot.TableRKey, Target: tgt})
	if wc.Err() != nil {
		t.Fatalf("DCI READ of the table: %v", wc.Err())
	}
	h, err := parseHeader(mem)
	if err != nil || h.geom.slots != 64 || h.serverInc != boot.ServerIncarnation {
		t.Fatalf("table header: %+v %v", h, err)
	}
	n, found, torn := scanNeighbourhood(mem[slotOffset(h.geom.home(1)):][:h.geom.nbhdBytes()], 1)
	if !found || torn || n != testNode(1, 1) {
		t.Fatalf("entry via DCI: %+v found=%v torn=%v", n, found, torn)
	}
	wc = post(dci, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: mr, Length: 8}, RemoteAddr: slotOffset(0), RKey: boot.TableRKey, Target: tgt})
	if wc.Status != verbs.StatusRemAccessErr {
		t.Fatalf("DCI WRITE to the table: %+v", wc)
	}
	// An RC connection of a client may not write either, whatever rkey.
	cn, err := c.dial(ctx, srv.Addr(), 99)
	if err != nil {
		t.Fatal(err)
	}
	defer cn.unref()
	defer cn.kill()
	if err := cn.qp.PostSend([]verbs.SendWR{{Op: verbs.OpWrite, Flags: verbs.Signaled | verbs.Inline, InlineData: []byte("evil"), RemoteAddr: slotOffset(0), RKey: boot.TableRKey}}); err != nil {
		t.Fatal(err)
	}
	// Skip the receives the error flushes: an error completion has no
	// opcode, its ID says what it completes.
	wcs := [1]verbs.WC{{ID: recvBit}}
	for wcs[0].ID&recvBit != 0 {
		if err := cn.cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		cn.cq.Poll(wcs[:])
	}
	if wcs[0].Status != verbs.StatusRemAccessErr || wcs[0].Reason != verbs.ReasonPerm {
		t.Fatalf("RC WRITE to the table: %+v", wcs[0])
	}
	if n, err := c.LookupRPC(ctx, 1); err != nil || n != testNode(1, 1) {
		t.Fatalf("table after refused writes: %+v %v", n, err)
	}
}

// TestMovesUnderLookups: in a small table with a small neighbourhood,
// new registrations displace entries (hopscotch moves) while readers look
// the displaced entries up; none is ever reported missing.
func TestMovesUnderLookups(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64, Neighborhood: 4})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1}
	writer := startClient(t, f.device(), ccfg)
	readers := []*Client{startClient(t, f.device(), ccfg), startClient(t, f.device(), ccfg)}
	g, _ := newGeom(64, 4)
	// Seven gids whose homes crowd slots 8..11, which must share slots
	// 8..14: they push each other around.
	var crowd []uint32
	for gid := uint32(1); len(crowd) < 7; gid++ {
		if h := g.home(gid); h >= 8 && h < 12 {
			crowd = append(crowd, gid)
		}
	}
	rng := rand.New(rand.NewPCG(9, 9))
	var lookups atomic.Uint64
	for round := range 8 {
		var registered sync.Map
		stop := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, len(readers))
		for r, rc := range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := r; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					gid := crowd[i%len(crowd)]
					if _, ok := registered.Load(gid); !ok {
						continue
					}
					if _, err := rc.Lookup(ctx, gid); err != nil {
						errs <- err
						return
					}
					lookups.Add(1)
				}
			}()
		}
		order := rng.Perm(len(crowd))
		var placed []uint32
		for _, i := range order {
			gid := crowd[i]
			_, err := rawRegister(ctx, writer, testNode(gid, uint64(round+1)), time.Minute)
			if errors.Is(err, ErrTableFull) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			placed = append(placed, gid)
			registered.Store(gid, true)
			time.Sleep(time.Millisecond) // let the readers run
		}
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, gid := range placed {
			if err := writer.each(ctx, func(cn *conn) (bool, error) {
				_, err := cn.call(ctx, message{kind: kindDeregister, node: NodeInfo{GID: gid, Incarnation: uint64(round + 1)}})
				return err == nil, err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := srv.Stats(); st.Moves == 0 {
		t.Fatalf("no entry was moved: %+v", st)
	}
	t.Logf("%d lookups during %d moves", lookups.Load(), srv.Stats().Moves)
}

// TestOversizedMessageRepostsItsBuffer: a message longer than the
// server's receive buffers completes in error (a local length error at
// the server, whose QP to that client moves to ERR). An error completion
// has no opcode: the server tells it is a receive by its ID, counts it as
// malformed and posts the buffer again. Sending more of them than the
// server has buffers leaves it serving.
func TestOversizedMessageRepostsItsBuffer(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	const depth = 4
	srv := startServer(t, f.device(), ServerConfig{Slots: 64, RecvDepth: depth})
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	big := make([]byte, MaxMessage+64)
	mr, err := c.pd.RegMR(big, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Dereg()
	for i := range 2 * depth {
		cn, err := c.dial(ctx, srv.Addr(), uint64(100+i))
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if err := cn.qp.PostSend([]verbs.SendWR{{Op: verbs.OpSend, Local: verbs.SGE{MR: mr, Length: uint32(len(big))}}}); err != nil {
			t.Fatal(err)
		}
		want := uint64(i + 1)
		waitFor(t, 5*time.Second, "malformed count", func() bool { return srv.Stats().Malformed == want })
		cn.kill()
		cn.unref()
	}
	// Every buffer came back: the server still answers.
	if _, err := rawRegister(ctx, c, testNode(4, 4), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := c.LookupRPC(ctx, 4); err != nil || n != testNode(4, 4) {
		t.Fatalf("after oversized messages: %+v %v", n, err)
	}
}
