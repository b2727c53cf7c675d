package meta

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// Rule: an operation whose connection fails under it with a transport
// error is sent again on a rebuilt connection while the caller's context
// lasts. Here every answer to the client's first QP (its SEND's ACKs and
// the server's reply) is lost until that QP runs out of retries, as when a
// host is starved of CPU: the registration still succeeds, exactly once
// (the server executed the first request, and the request sent again
// gets the gid it assigned then), and so does an RPC lookup. Time is a
// manual clock moved by the test one QP timeout at a time, so the QP
// fails after exactly its retry budget whatever the machine's load.
func TestTransportErrorRebuildsConnection(t *testing.T) {
	for _, op := range []string{"register", "lookupRPC"} {
		t.Run(op, func(t *testing.T) {
			checkLeaks(t)
			const qpTimeout = 10 * time.Millisecond
			clk := softnictest.NewManualClock(time.Time{})
			f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
			ctx := ctxT(t)
			srv := startServer(t, f.device(), ServerConfig{Slots: 64, Clock: clk})
			ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, Clock: clk, CacheEntries: -1,
				RPCTimeout: time.Hour, QPTimeout: qpTimeout, ConnectTimeout: 5 * time.Minute,
				MaxQPTimeout: qpTimeout} // no backoff: the QP fails after its retry budget
			known := testNode(9, 9)
			if _, err := rawRegister(ctx, startClient(t, f.device(), ccfg), known, time.Hour); err != nil {
				t.Fatal(err)
			}
			cdev := f.device()
			c := startClient(t, cdev, ccfg)

			var victim atomic.Uint32 // the QP that carries the first SEND
			seen := make(chan struct{})
			var once sync.Once
			f.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
				if from == cdev.Addr() && to == srv.Addr() && h.Op == wire.OpSend && victim.CompareAndSwap(0, h.SrcQP) {
					once.Do(func() { close(seen) })
				}
				if to == cdev.Addr() && h.DestQP != 0 && h.DestQP == victim.Load() {
					return softnictest.Drop
				}
				return softnictest.Pass
			})

			type result struct {
				n   NodeInfo
				a   *Agent
				err error
			}
			res := make(chan result, 1)
			go func() {
				var r result
				if op == "register" {
					info := known
					info.GID, info.Incarnation = 0, 0x5151
					if r.a, r.err = c.Register(ctx, info, AgentConfig{Lease: time.Hour}); r.err == nil {
						r.n = r.a.Info()
					}
				} else {
					r.n, r.err = c.LookupRPC(ctx, known.GID)
				}
				res <- r
			}()
			select {
			case <-seen:
			case <-ctx.Done():
				t.Fatal("the operation never sent its request")
			}
			// Move time one QP timeout at a time, every packet due
			// delivered in between, until the victim QP is in ERR.
			failed := false
			for i := 0; i < 4*(DefaultQPRetryCnt+1) && !failed; i++ {
				clk.Advance(qpTimeout)
				for f.net.Flush() > 0 {
				}
				cdev.SyncMemory()
				failed = true
				for _, q := range cdev.QPs() {
					if q.QPN == victim.Load() && q.State != verbs.StateErr {
						failed = false
					}
				}
			}
			if !failed {
				t.Fatal("the client's QP never ran out of retries")
			}
			var r result
			select {
			case r = <-res:
			case <-ctx.Done():
				t.Fatal("the operation did not return after its QP failed")
			}
			if r.a != nil {
				defer r.a.Close()
			}
			if r.err != nil {
				t.Fatalf("%s after a transport error: %v (stats %+v)", op, r.err, c.Stats())
			}
			if got := c.Stats().Rebuilds; got != 1 {
				t.Fatalf("%d rebuilds, want 1", got)
			}
			if op == "lookupRPC" {
				if r.n != known {
					t.Fatalf("lookup returned %+v, want %+v", r.n, known)
				}
				return
			}
			f.net.SetFilter(nil)
			all, err := startClient(t, f.device(), ccfg).List(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			mine := 0
			for _, n := range all {
				if n.Incarnation == 0x5151 {
					mine++
					if n.GID != r.n.GID {
						t.Fatalf("registered as gid %d, the agent holds %d", n.GID, r.n.GID)
					}
				}
			}
			if mine != 1 || len(all) != 2 {
				t.Fatalf("the table holds %d registrations of the node (want 1) among %d: %+v", mine, len(all), all)
			}
		})
	}
}
