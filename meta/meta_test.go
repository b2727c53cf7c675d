package meta

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// TestRegisterLookup is the basic flow over both fabrics: a node
// registers, another resolves it by one READ, by RPC, from the cache and
// in a listing; an unknown gid is not found.
func TestRegisterLookup(t *testing.T) {
	for _, kind := range fabricKinds {
		t.Run(kind, func(t *testing.T) {
			checkLeaks(t)
			f := newFabric(t, kind, softnictest.Config{Seed: 1})
			ctx := ctxT(t)
			srv := startServer(t, f.device(), ServerConfig{Slots: 1024})
			nodeDev := f.device()
			nodeCl := startClient(t, nodeDev, ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
			info := testNode(5, 0)
			info.Incarnation = 0
			ag, err := nodeCl.Register(ctx, info, AgentConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer ag.Close()
			got := ag.Info()
			if got.GID != 5 || got.Incarnation == 0 {
				t.Fatalf("registered as %+v", got)
			}
			peer := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
			n, err := peer.Lookup(ctx, 5)
			if err != nil || n != got {
				t.Fatalf("Lookup: %+v, %v; want %+v", n, err, got)
			}
			if st := peer.Stats(); st.Reads != 1 || st.CacheMisses != 1 {
				t.Fatalf("after a miss: %+v", st)
			}
			peer.waitDCCache().Wait()
			for range 3 {
				if n, err := peer.Lookup(ctx, 5); err != nil || n != got {
					t.Fatalf("cached Lookup: %+v, %v", n, err)
				}
			}
			if st := peer.Stats(); st.Reads != 1 || st.Lookups != 4 {
				t.Fatalf("cache hits went to the server: %+v", st)
			}
			if n, err := peer.LookupRPC(ctx, 5); err != nil || n != got {
				t.Fatalf("LookupRPC: %+v, %v", n, err)
			}
			if _, err := peer.Lookup(ctx, 6); !isNotFound(err) {
				t.Fatalf("unknown gid: %v", err)
			}
			if _, err := peer.LookupRPC(ctx, 6); !isNotFound(err) {
				t.Fatalf("unknown gid by RPC: %v", err)
			}
			all, err := peer.List(ctx)
			if err != nil || len(all) != 1 || all[0] != got {
				t.Fatalf("List: %+v, %v", all, err)
			}
			many, err := peer.LookupMany(ctx, []uint32{5, 6})
			if err != nil || len(many) != 1 || many[5] != got {
				t.Fatalf("LookupMany: %+v, %v", many, err)
			}
			// Clean shutdown deregisters: the entry is gone from the table.
			ag.Close()
			peer.Invalidate(5)
			if _, err := peer.Lookup(ctx, 5); !isNotFound(err) {
				t.Fatalf("after deregistration: %v", err)
			}
			if st := srv.Stats(); st.Registered != 1 || st.Deregistered != 1 || st.Nodes != 0 {
				t.Fatalf("server stats %+v", st)
			}
		})
	}
}

// TestDuplicateGIDRefused: a gid held by a live lease is refused.
func TestDuplicateGIDRefused(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	c1 := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	c2 := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	a1, err := c1.Register(ctx, testNode(9, 1), AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a1.Close()
	if _, err := c2.Register(ctx, testNode(9, 2), AgentConfig{}); !errors.Is(err, ErrGIDInUse) {
		t.Fatalf("second registration of gid 9: %v", err)
	}
	if st := srv.Stats(); st.Refused != 1 {
		t.Fatalf("refusals counted: %d", st.Refused)
	}
	if n, err := c2.Lookup(ctx, 9); err != nil || n.Incarnation != 1 {
		t.Fatalf("the first holder lost gid 9: %+v %v", n, err)
	}
}

// TestStaleHook: a node restarts with a new incarnation; a peer holding
// the old entry learns the new one through Stale, and Stale says
// ErrStale while the table still has the old one.
func TestStaleHook(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	node := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	peer := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	a1, err := node.Register(ctx, testNode(3, 0), AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	old, err := peer.Lookup(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Stale(ctx, old); !errors.Is(err, ErrStale) {
		t.Fatalf("Stale with the table unchanged: %v", err)
	}
	a1.Close()                                                   // the daemon stops ...
	a2, err := node.Register(ctx, testNode(3, 0), AgentConfig{}) // ... and starts again
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if a2.Info().Incarnation == old.Incarnation {
		t.Fatal("re-registration kept the incarnation")
	}
	if !StaleReason(verbs.ReasonDCKey) || !StaleReason(verbs.ReasonNoQP) || StaleReason(verbs.ReasonRKey) {
		t.Fatal("StaleReason")
	}
	n, err := peer.Stale(ctx, old)
	if err != nil || n != a2.Info() {
		t.Fatalf("Stale: %+v, %v; want %+v", n, err, a2.Info())
	}
	peer.waitDCCache().Wait()
	if n, err := peer.Lookup(ctx, 3); err != nil || n != a2.Info() {
		t.Fatalf("after Stale the cache holds %+v, %v", n, err)
	}
}

// TestDCCacheBuiltInBackground: NewClient does not wait for the DCCache
// (ristretto's sketch costs a fresh process milliseconds). Until it is
// built, lookups read the table and what they read is counted Uncached;
// afterwards lookups are cached as usual.
func TestDCCacheBuiltInBackground(t *testing.T) {
	checkLeaks(t)
	f := newFabric(t, "fake", softnictest.Config{Seed: 1})
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	nodeCl := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	ag, err := nodeCl.Register(ctx, testNode(5, 0), AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()

	release := make(chan struct{})
	build := newDCCache
	newDCCache = func(cfg *ristretto.Config[uint32, NodeInfo]) (*ristretto.Cache[uint32, NodeInfo], error) {
		<-release
		return build(cfg)
	}
	defer func() { newDCCache = build }()
	peer, err := NewClient(ctx, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	for range 2 {
		if n, err := peer.Lookup(ctx, 5); err != nil || n != ag.Info() {
			t.Fatalf("Lookup before the DCCache is built: %+v, %v", n, err)
		}
	}
	if st := peer.Stats(); st.Reads != 2 || st.CacheMisses != 2 || st.Uncached != 2 {
		t.Fatalf("before the DCCache is built: %+v", st)
	}
	close(release)
	peer.waitDCCache()
	if _, err := peer.Lookup(ctx, 5); err != nil {
		t.Fatal(err)
	}
	peer.waitDCCache().Wait()
	for range 3 {
		if _, err := peer.Lookup(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	if st := peer.Stats(); st.Reads != 3 || st.Lookups != 6 || st.Uncached != 2 {
		t.Fatalf("once built, lookups were not cached: %+v", st)
	}
}
