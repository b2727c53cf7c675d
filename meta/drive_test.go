package meta

import (
	"net/netip"
	"testing"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// TestLookupDrives: a lookup's READ waits by driving the device's receive
// on the caller's goroutine (run to completion), not on the CQ's
// notification, which cost a cold connect a thread wake-up more than the
// round trip; and it finds the entry. Counted in Stats().DrivenReads.
func TestLookupDrives(t *testing.T) {
	f := newFabric(t, "udp", softnictest.Config{Seed: 1})
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 1024})
	owner := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	ag, err := owner.Register(ctx, testNode(5, 0), AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1})
	before := c.Stats()
	for range 5 {
		n, err := c.Lookup(ctx, 5)
		if err != nil || n.GID != 5 {
			t.Fatalf("Lookup: %+v, %v", n, err)
		}
	}
	after := c.Stats()
	if reads, driven := after.Reads-before.Reads, after.DrivenReads-before.DrivenReads; reads < 5 || driven != reads {
		t.Fatalf("5 lookups: %d table READs, %d of them driven by the caller; want every one", reads, driven)
	}
}
