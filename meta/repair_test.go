package meta

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// Rule: the meta server heals by construction. Loss on the server's own
// address exhausts the retries of the loopback QP that writes the table
// (here: every loopback packet dropped while a node registers); the
// server re-creates the QP pair, rewrites the slots the failed writes
// touched, and then accepts registrations again. The entry registered
// before the fault survives, the one registered during it is published
// (its request was not lost, only its reply), and a new node joins within
// 10 s of the fault's end.
func TestLoopbackQPFailureHeals(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	var dropping atomic.Bool
	f.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, payload []byte) softnictest.Verdict {
		if from == to && dropping.Load() {
			return softnictest.Drop
		}
		return softnictest.Pass
	})
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, RPCTimeout: 300 * time.Millisecond, CacheEntries: -1}
	c := startClient(t, f.device(), ccfg)
	ctx := ctxT(t)
	const lease = time.Minute // no heartbeats: nothing may expire meanwhile
	before, during, after := testNode(1, 0x1001), testNode(2, 0x2002), testNode(3, 0x3003)
	if _, err := rawRegister(ctx, c, before, lease); err != nil {
		t.Fatal(err)
	}

	dropping.Store(true)
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := rawRegister(short, c, during, lease)
	cancel()
	if err == nil {
		t.Fatal("a registration succeeded while the table could not be written")
	}
	// The repair's own rewrite fails too while the loss lasts: the server
	// must survive repeated failures.
	waitFor(t, 30*time.Second, "two repairs of the loopback QP during the fault", func() bool {
		return srv.Stats().LoopRepairs >= 2
	})
	dropping.Store(false)
	end := time.Now()

	joined, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := rawRegister(joined, c, after, lease); err != nil {
		t.Fatalf("a node could not join %v after the fault ended: %v (stats %+v)", time.Since(end), err, srv.Stats())
	}
	t.Logf("a node joined %v after the fault ended; %d repairs", time.Since(end), srv.Stats().LoopRepairs)

	// The table (read with one-sided READs) holds all three, whole.
	reader := startClient(t, f.device(), ccfg)
	for _, want := range []NodeInfo{before, during, after} {
		var got NodeInfo
		var err error
		waitFor(t, 10*time.Second, "the table to show every registration", func() bool {
			got, err = reader.Lookup(ctx, want.GID)
			return err == nil && got == want
		})
		if !consistent(got) {
			t.Fatalf("gid %d: torn entry %+v", want.GID, got)
		}
	}
}
