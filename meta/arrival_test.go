package meta

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestManyArriveAtASlowServer is the mesh of real daemons in one process:
// many nodes start at once and each makes a fresh client of one meta
// server that is slow to answer, as a server starved of CPU by the nodes
// starting around it is: every packet it sends arrives serverStall late,
// longer than ConnectTimeout. Every client connects within its caller's
// budget, with one handshake each (one connection accepted per client:
// none abandoned half-open), whose request is resent with backoff rather
// than every 20 ms; then, the server no longer slow, each registers and
// looks nodes up on that one connection.
//
// Before, each attempt ended at ConnectTimeout and NewClient failed: with
// the server's answers later than that, no client ever connected, however
// long its caller would have waited, and every attempt left the server
// more duplicates to answer.
func TestManyArriveAtASlowServer(t *testing.T) {
	checkLeaks(t)
	const (
		nodes       = 48
		serverStall = 1500 * time.Millisecond // > DefaultConnectTimeout
		budget      = 60 * time.Second        // a hang guard: needs about 2 stalls
	)
	f := newFabric(t, "fake", softnictest.Config{Seed: 1})
	sdev := f.device()
	srv := startServer(t, sdev, ServerConfig{Slots: 256})
	from := sdev.Addr()
	var stall atomic.Int64
	stall.Store(int64(serverStall))
	var reqs atomic.Int64
	conns := make(map[uint64]netip.AddrPort) // CM connection ID -> requester
	var mu sync.Mutex
	f.net.SetFilter(func(src, dst netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if h.Op == wire.OpCMReq {
			reqs.Add(1)
			mu.Lock()
			conns[h.ConnID] = src
			mu.Unlock()
		}
		if src == from && dst != from { // not the server's loopback table writes
			return softnictest.Delay(time.Duration(stall.Load()))
		}
		return softnictest.Pass
	})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}}
	cs := make([]*Client, nodes)
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for i := range cs {
		dev := f.device()
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs[i], errs[i] = NewClient(ctx, dev, ccfg)
		}()
	}
	wg.Wait()
	connected := 0
	for i, c := range cs {
		if errs[i] != nil {
			t.Errorf("client %d: %v", i, errs[i])
			continue
		}
		connected++
		t.Cleanup(func() { c.Close() })
	}
	if connected < nodes {
		t.Fatalf("%d of %d clients connected to a server that answers %v late", connected, nodes, serverStall)
	}
	st := srv.Stats()
	if st.Accepted != nodes || len(conns) != nodes {
		t.Errorf("%d connections accepted, %d handshakes started for %d clients; want one each", st.Accepted, len(conns), nodes)
	}
	// Each handshake is two exchanges with the server (the cookie, then
	// the connection), each answered a stall late: resent with backoff,
	// about 7 requests each (20, 40, 80, ... ms); every 20 ms would be 75.
	if n := reqs.Load(); n > nodes*20 {
		t.Errorf("%d connection requests for %d handshakes: resent without backoff", n, nodes)
	}
	t.Logf("%d connection requests for %d handshakes", reqs.Load(), nodes)

	for i, c := range cs {
		if n := c.Stats().Connects; n != 1 {
			t.Errorf("client %d: %d connections made, want 1", i, n)
		}
	}

	// Then, with the server no longer slow, everyone registers and finds
	// the first, the last and itself on the connection it made. (How long
	// an established connection waits for a slow server is the RC retry
	// budget, about RPCTimeout of real time: on a loaded machine a
	// thousand lookups through a slow server can exceed it, which is not
	// what this test is about.)
	stall.Store(0)
	var wg2 sync.WaitGroup
	for i, c := range cs {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			n := testNode(uint32(i+1), uint64(i+1))
			if _, errs[i] = rawRegister(ctx, c, n, time.Minute); errs[i] != nil {
				return
			}
		}()
	}
	wg2.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("client %d: register: %v", i, err)
		}
	}
	for i, c := range cs {
		for _, g := range []uint32{1, nodes, uint32(i + 1)} {
			n, err := c.Lookup(ctx, g)
			if err != nil || !consistent(n) || n.GID != g {
				t.Fatalf("client %d: lookup %d: %+v, %v", i, g, n, err)
			}
		}
	}
}
