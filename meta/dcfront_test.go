package meta

import (
	"net/netip"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// TestLookupLeavesRistrettoAlone: a process that looks up a few peers
// never hands ristretto work (each Set and Del wakes ristretto's
// goroutine on another CPU, in the middle of a cold connect); the entries
// serve later lookups from the DCCache's front and move into ristretto
// frontMax at a time.
func TestLookupLeavesRistrettoAlone(t *testing.T) {
	checkLeaks(t)
	f := newFabric(t, "fake", softnictest.Config{Seed: 1})
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 256})
	nodeCl := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	const nodes = frontMax + 1
	for g := uint32(1); g <= nodes; g++ {
		ag, err := nodeCl.Register(ctx, testNode(g, 0), AgentConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer ag.Close()
	}
	peer := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	dc := peer.waitDCCache()
	if _, err := peer.Lookup(ctx, 1); err != nil {
		t.Fatal(err)
	}
	dc.Wait()
	if _, ok := dc.Get(1); ok {
		t.Fatal("a lookup's entry went to ristretto at once")
	}
	if _, err := peer.Lookup(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if st := peer.Stats(); st.Reads != 1 || st.CacheMisses != 1 {
		t.Fatalf("the second lookup was not answered from the DCCache: %+v", st)
	}

	// Invalidate drops the front's entry: the next lookup reads again.
	peer.Invalidate(1)
	if _, err := peer.Lookup(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if st := peer.Stats(); st.Reads != 2 {
		t.Fatalf("a lookup after Invalidate was answered from the cache: %+v", st)
	}

	// The front full, its entries move to ristretto together.
	for g := uint32(2); g <= frontMax; g++ {
		if _, err := peer.Lookup(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	dc.Wait()
	for g := uint32(1); g <= frontMax; g++ {
		if _, ok := dc.Get(g); !ok {
			t.Fatalf("gid %d not in ristretto after the front filled", g)
		}
	}
	reads := peer.Stats().Reads
	for g := uint32(1); g <= frontMax; g++ {
		if _, err := peer.Lookup(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	if st := peer.Stats(); st.Reads != reads {
		t.Fatalf("lookups after the move read the table: %d READs, was %d", st.Reads, reads)
	}
	// ... and once entries have moved, Invalidate deletes there too.
	peer.Invalidate(2)
	dc.Wait()
	if _, ok := dc.Get(2); ok {
		t.Fatal("Invalidate left the entry in ristretto")
	}
}

// TestFrontEntriesExpire: an entry in the DCCache's front keeps the TTL
// it would have had in ristretto.
func TestFrontEntriesExpire(t *testing.T) {
	now := time.Unix(1000, 0)
	f := dcFront{max: 4, now: func() time.Time { return now }}
	n := testNode(7, 1)
	f.put(n, 0, time.Second)
	now = now.Add(999 * time.Millisecond)
	if _, ok := f.get(7); !ok {
		t.Fatal("an entry expired before its TTL")
	}
	now = now.Add(time.Millisecond)
	if _, ok := f.get(7); ok {
		t.Fatal("an expired entry was returned")
	}
	f.put(n, 0, 0)
	if got, ok := f.get(7); !ok || got != n {
		t.Fatalf("get = %+v, %v", got, ok)
	}
	for g := uint32(1); g <= 2; g++ {
		if out := f.put(testNode(g, 1), 0, 0); out != nil {
			t.Fatalf("front gave up entries before it was full: %d", len(out))
		}
	}
	if out := f.put(testNode(3, 1), 0, 0); len(out) != 4 || !f.flushed.Load() {
		t.Fatalf("full front gave up %d entries, flushed %v", len(out), f.flushed.Load())
	}
}
