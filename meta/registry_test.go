package meta

import (
	"math/rand/v2"
	"testing"
	"time"
)

// checkIndex verifies the hopscotch invariant and the free count.
func checkIndex(t *testing.T, x *index, want map[uint32]bool) {
	t.Helper()
	free := 0
	for i, g := range x.gids {
		if g == 0 {
			free++
			continue
		}
		h := x.geom.home(g)
		if i < h || i >= h+x.geom.nbhd {
			t.Fatalf("gid %d at slot %d outside its neighbourhood [%d, %d)", g, i, h, h+x.geom.nbhd)
		}
		if !want[g] {
			t.Fatalf("gid %d in the index but not inserted", g)
		}
	}
	if free != x.free {
		t.Fatalf("free count %d, actual %d", x.free, free)
	}
	for g := range want {
		if x.find(g) < 0 {
			t.Fatalf("gid %d lost", g)
		}
	}
}

func TestIndexInsertRemove(t *testing.T) {
	g, _ := newGeom(256, 4)
	x := newIndex(g)
	rng := rand.New(rand.NewPCG(3, 4))
	want := make(map[uint32]bool)
	moves, full := 0, 0
	for range 20000 {
		gid := 1 + rng.Uint32N(600)
		if want[gid] {
			if rng.IntN(2) == 0 {
				x.remove(gid)
				delete(want, gid)
			}
			continue
		}
		slot, mv, ok := x.insert(gid)
		if !ok {
			full++
			continue
		}
		if x.gids[slot] != gid {
			t.Fatalf("insert returned slot %d holding %d", slot, x.gids[slot])
		}
		for _, m := range mv {
			if m.to <= m.from {
				t.Fatalf("move %+v goes down", m)
			}
		}
		moves += len(mv)
		want[gid] = true
		checkIndex(t, x, want)
	}
	if moves == 0 || full == 0 {
		t.Fatalf("test too easy: %d moves, %d refused inserts", moves, full)
	}
}

func TestIndexLoadHalf(t *testing.T) {
	// The default sizing (load 1/2, H 16) takes random gids without
	// failing; loads past ~0.7 may fail, which the config doc says.
	g, _ := newGeom(1<<14, 16)
	for seed := range uint64(5) {
		x := newIndex(g)
		rng := rand.New(rand.NewPCG(seed, 9))
		used := make(map[uint32]bool)
		for len(used) < 1<<13 {
			gid := rng.Uint32()
			if gid == 0 || used[gid] {
				continue
			}
			if _, _, ok := x.insert(gid); !ok {
				t.Fatalf("seed %d: insert failed at load %.2f", seed, float64(len(used))/float64(1<<14))
			}
			used[gid] = true
		}
	}
}

func testRegistry(t *testing.T) (*registry, time.Time) {
	cfg := ServerConfig{Slots: 64, Neighborhood: 8, Lease: time.Second}
	if err := cfg.fill(); err != nil {
		t.Fatal(err)
	}
	g, _ := newGeom(cfg.Slots, cfg.Neighborhood)
	now := time.Unix(1000, 0)
	return newRegistry(g, now, &cfg, 1), now
}

func regMsg(n NodeInfo, lease time.Duration) *message {
	return &message{kind: kindRegister, reqID: 1, node: n, leaseMs: uint32(lease / time.Millisecond)}
}

func TestRegistryLeases(t *testing.T) {
	r, now := testRegistry(t)
	a := testNode(7, 100)
	rep, ws := r.register(regMsg(a, 0), now)
	if rep.status != stOK || rep.node != a || rep.leaseMs != 1000 || len(ws) != 1 || !ws[0].e.live {
		t.Fatalf("register: %+v %+v", rep, ws)
	}
	// Same gid, other incarnation, lease live: refused.
	if rep, ws := r.register(regMsg(testNode(7, 101), 0), now.Add(500*time.Millisecond)); rep.status != stInUse || ws != nil {
		t.Fatalf("duplicate: %+v %+v", rep, ws)
	}
	// Same gid and address, other incarnation: the holder died and
	// restarted on its address (no two live processes can bind it), so
	// it takes over at once.
	restarted := a
	restarted.Incarnation = 102
	if rep, ws := r.register(regMsg(restarted, 0), now.Add(550*time.Millisecond)); rep.status != stOK || len(ws) != 1 || rep.node.Incarnation != 102 {
		t.Fatalf("restart on the same address: %+v %+v", rep, ws)
	}
	if rep, _ := r.register(regMsg(a, 0), now.Add(560*time.Millisecond)); rep.status != stOK {
		t.Fatalf("back to the first incarnation: %+v", rep)
	}
	// Same incarnation again: a refresh, written in place.
	if rep, ws := r.register(regMsg(a, 0), now.Add(600*time.Millisecond)); rep.status != stOK || len(ws) != 1 || ws[0].slot != r.nodes[7].slot {
		t.Fatalf("refresh: %+v %+v", rep, ws)
	}
	// Heartbeat renews and writes only the expiry word.
	hb := &message{kind: kindHeartbeat, node: NodeInfo{GID: 7, Incarnation: 100}}
	if rep, ws := r.heartbeat(hb, now.Add(900*time.Millisecond)); rep.status != stOK || len(ws) != 1 || !ws[0].expiryOnly {
		t.Fatalf("heartbeat: %+v %+v", rep, ws)
	}
	// Lease runs to 1.9s; nothing expires at 1.8s, a second node does.
	b := testNode(8, 200)
	r.register(regMsg(b, 100*time.Millisecond), now.Add(time.Second))
	ws, gone := r.expire(now.Add(1800 * time.Millisecond))
	if len(gone) != 1 || gone[0] != 8 || len(ws) != 1 || ws[0].e.live {
		t.Fatalf("expire: gone %v writes %+v", gone, ws)
	}
	if rep := r.lookup(&message{kind: kindLookup, node: NodeInfo{GID: 8}}, now); rep.status != stNotFound {
		t.Fatalf("lookup of expired node: %+v", rep)
	}
	// A heartbeat after expiry (sweep not run yet) is refused and clears.
	late := now.Add(3 * time.Second)
	if rep, ws := r.heartbeat(hb, late); rep.status != stNotRegistered || len(ws) != 1 || ws[0].e.live {
		t.Fatalf("late heartbeat: %+v %+v", rep, ws)
	}
	// Now another incarnation may take the gid.
	if rep, _ := r.register(regMsg(testNode(7, 102), 0), late); rep.status != stOK || rep.node.Incarnation != 102 {
		t.Fatalf("re-register: %+v", rep)
	}
	// Deregister needs the right incarnation.
	if rep, _ := r.deregister(&message{kind: kindDeregister, node: NodeInfo{GID: 7, Incarnation: 100}}); rep.status != stInUse {
		t.Fatalf("deregister with old incarnation: %+v", rep)
	}
	if rep, ws := r.deregister(&message{kind: kindDeregister, node: NodeInfo{GID: 7, Incarnation: 102}}); rep.status != stOK || len(ws) != 1 {
		t.Fatalf("deregister: %+v %+v", rep, ws)
	}
	if len(r.nodes) != 0 || r.idx.free != r.geom.physSlots() {
		t.Fatalf("registry not empty: %d nodes, %d free", len(r.nodes), r.idx.free)
	}
}

func TestRegistryAssigns(t *testing.T) {
	r, now := testRegistry(t)
	seen := make(map[uint32]bool)
	incs := make(map[uint64]bool)
	for range 10 {
		rep, _ := r.register(regMsg(NodeInfo{Addr: testNode(1, 1).Addr}, 0), now)
		if rep.status != stOK || rep.node.GID < DefaultFirstAssignedGID || seen[rep.node.GID] || rep.node.Incarnation == 0 || incs[rep.node.Incarnation] {
			t.Fatalf("assigned %+v", rep)
		}
		seen[rep.node.GID], incs[rep.node.Incarnation] = true, true
	}
	// A request for a gid sent again (its reply was lost) gets the gid
	// assigned the first time; the same incarnation from another address
	// does not.
	n := NodeInfo{Addr: testNode(1, 1).Addr, Incarnation: 0xfeed}
	first, _ := r.register(regMsg(n, 0), now)
	again, _ := r.register(regMsg(n, 0), now)
	if first.status != stOK || again.status != stOK || again.node.GID != first.node.GID {
		t.Fatalf("a registration sent twice got %+v, then %+v", first, again)
	}
	other := n
	other.Addr = testNode(2, 2).Addr
	if rep, _ := r.register(regMsg(other, 0), now); rep.status != stOK || rep.node.GID == first.node.GID {
		t.Fatalf("the same incarnation from another address got %+v", rep)
	}
	if len(r.nodes) != 12 {
		t.Fatalf("%d registrations, want 12", len(r.nodes))
	}
	r.drop(r.nodes[first.node.GID])
	if rep, _ := r.register(regMsg(n, 0), now); rep.status != stOK || len(r.nodes) != 12 {
		t.Fatalf("after its lease was dropped: %+v", rep)
	}
}

func TestRegistryFull(t *testing.T) {
	r, now := testRegistry(t) // 64 home slots, 71 physical
	full := 0
	for gid := uint32(1); gid <= 200; gid++ {
		if rep, _ := r.register(regMsg(testNode(gid, 1), 0), now); rep.status == stFull {
			full++
		}
	}
	if full == 0 || len(r.nodes) > r.geom.physSlots() {
		t.Fatalf("%d refused, %d placed in %d slots", full, len(r.nodes), r.geom.physSlots())
	}
}
