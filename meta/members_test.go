package meta

import (
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestListReadsMembers: List READs the membership map and the live slots,
// not the whole table (4 MiB by default): with 64 nodes, a few dozen
// READs of 128 bytes and two of the map. Deregistered nodes leave it.
func TestListReadsMembers(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}}
	reg := startClient(t, f.device(), ccfg)
	const nodes = 64
	var ags []*Agent
	for g := uint32(1); g <= nodes; g++ {
		a, err := reg.Register(ctx, testNode(g, uint64(g)), AgentConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ags = append(ags, a)
	}
	for _, a := range ags[nodes/2:] {
		a.Close()
	}
	for _, a := range ags[:nodes/2] {
		defer a.Close()
	}
	c := startClient(t, f.device(), ccfg)
	all, err := c.List(ctx)
	if err != nil || len(all) != nodes/2 {
		t.Fatalf("List: %d nodes, %v; want %d", len(all), err, nodes/2)
	}
	for i, n := range all {
		if n != testNode(uint32(i+1), uint64(i+1)) {
			t.Fatalf("List[%d] = %+v", i, n)
		}
	}
	if r := c.Stats().Reads; r > nodes/2+2 {
		t.Fatalf("List took %d READs for %d nodes", r, nodes/2)
	}
}

// TestListDuringMoves: Lists race registrations into a small table, where
// insertions move entries to other slots (hopscotch). Every List holds
// every node registered before it began, each exactly as registered: the
// map's generation makes a List that saw occupancy change read again.
func TestListDuringMoves(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64, Neighborhood: 8})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1}
	reg := startClient(t, f.device(), ccfg)
	const before, during = 12, 8
	// Gids whose homes crowd the first 16 slots, so that insertions
	// move entries.
	g, _ := newGeom(64, 8)
	var gids []uint32
	for x := uint32(1); len(gids) < before+during; x++ {
		if g.home(x) < 16 {
			gids = append(gids, x)
		}
	}
	gid := func(i int) uint32 { return gids[i] }
	for i := range before {
		if _, err := rawRegister(ctx, reg, testNode(gid(i), uint64(i+1)), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := before; i < before+during; i++ {
			if _, err := rawRegister(ctx, reg, testNode(gid(i), uint64(i+1)), time.Minute); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	c := startClient(t, f.device(), ccfg)
	for range 50 {
		all, err := c.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seen := make(map[uint32]bool)
		for _, n := range all {
			if !consistent(n) || seen[n.GID] {
				t.Fatalf("List: %+v (inconsistent or twice)", n)
			}
			seen[n.GID] = true
		}
		for i := range before {
			if !seen[gid(i)] {
				t.Fatalf("List of %d nodes misses gid %d, registered before it", len(all), gid(i))
			}
		}
	}
	wg.Wait()
	all, err := c.List(ctx)
	if err != nil || len(all) != before+during {
		t.Fatalf("final List: %d nodes, %v", len(all), err)
	}
	if srv.Stats().Moves == 0 {
		t.Fatal("no entry moved: the test did not race moves")
	}
	t.Logf("moves %d, map retries %d", srv.Stats().Moves, c.Stats().MapRetries)
}
