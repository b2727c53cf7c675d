package meta

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

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
	srv := startServer(t, f.device(), ServerConfig{Clock: clk})
	const nodes = 10000
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1, Clock: clk}
	inc := func(g uint32) uint64 { return uint64(g)*1000 + 1 }
	registerMany(t, f, ccfg, nodes, 0, inc)
	if st := srv.Stats(); st.Nodes != nodes {
		t.Fatalf("server holds %d nodes", st.Nodes)
	}
	reader := startClient(t, f.device(), ccfg)
	var bad atomic.Uint32
	ctx := ctxT(t)
	forEachGID(nodes, 8, func(g uint32) {
		n, err := reader.Lookup(ctx, g)
		if err != nil || n != testNode(g, inc(g)) {
			if bad.Add(1) < 5 {
				t.Errorf("gid %d: %+v %v", g, n, err)
			}
		}
	})
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
