package softnic_test

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestCMForgedFloodLeavesNoState is issue 11's connection flood: 5,000
// CM_REQs from forged source addresses. Without a key each gets a cookie
// and nothing else (no accept call, no record); with a key each is dropped
// unauthenticated. A member connects at once afterwards.
func TestCMForgedFloodLeavesNoState(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "nokey", true: "key"}[keyed], func(t *testing.T) {
			fb := newFabric(t, "fake", faults{})
			var cfg softnic.Config
			if keyed {
				cfg.ClusterKey = []byte("cluster secret 16+")
			}
			a, b := keyedNodeCfg(fb, cfg), keyedNodeCfg(fb, cfg)
			var accepts atomic.Int64
			const svc = 9
			if err := b.dev.ListenRC(svc, func(req verbs.ConnRequest) (verbs.QP, []byte, error) {
				accepts.Add(1)
				return b.rcQP(), nil, nil
			}); err != nil {
				t.Fatal(err)
			}
			const n = 5000
			for i := range n {
				h := wire.Header{Op: wire.OpCMReq, Service: svc, CMQPN: uint32(i + 1), CMPSN: 1, CMMTU: 4096, ConnID: uint64(i)}
				if i%2 == 1 {
					h.Cookie = uint64(i) | 1 // a guessed cookie
				}
				from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 66, byte(i >> 8), byte(i)}), 4791)
				fb.net.Inject(from, b.dev.Addr(), h.Append(nil))
				if i%256 == 255 {
					fb.net.Flush() // within the receive queue's bound
				}
			}
			fb.net.Flush()
			b.dev.SyncMemory()
			if accepts.Load() != 0 || b.dev.CMStats().Records != 0 {
				t.Fatalf("forged requests reached accept: %d accepts, %+v", accepts.Load(), b.dev.CMStats())
			}
			if st := b.dev.CMStats(); !keyed && (st.CookiesSent != n || st.BadCookies != n/2) {
				t.Fatalf("cookies: %+v, want %d sent, %d bad", st, n, n/2)
			}
			if keyed && b.dev.Stats().BadMAC < n {
				t.Fatalf("forged requests not dropped as unauthenticated: BadMAC %d", b.dev.Stats().BadMAC)
			}
			qa := a.rcQP()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := a.dev.ConnectRC(ctx, qa, b.dev.Addr(), svc, verbs.ConnParams{}); err != nil {
				t.Fatalf("member connect after the flood: %v", err)
			}
			if accepts.Load() != 1 {
				t.Fatalf("%d accepts for one connection", accepts.Load())
			}
		})
	}
}

// TestCMPerSourceLimit: a source that proves its address but never
// confirms (its CM_RTUs are lost) holds at most 64 records; other
// sources still connect. On a clock only the test moves (it never does),
// so no CM_REQ is retransmitted and no record expires: in real time, a
// busy machine let a retransmitted CM_REQ count a seventh reject.
func TestCMPerSourceLimit(t *testing.T) {
	fb, _ := newStepFabric(t, 8)
	a, b := fb.node(), fb.node()
	cl, err := fb.net.NewLinkAt(netip.MustParseAddrPort("10.9.9.9:4791")) // another host
	if err != nil {
		t.Fatal(err)
	}
	fb.open = func() link.Link { return cl }
	c := fb.node()
	fb.open = nil
	fb.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if from == c.dev.Addr() && h.Op == wire.OpCMRTU {
			return softnictest.Drop
		}
		return softnictest.Pass
	})
	const svc = 3
	if err := b.dev.ListenRC(svc, func(req verbs.ConnRequest) (verbs.QP, []byte, error) {
		return b.rcQP(), nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for range 70 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.dev.ConnectRC(ctx, c.rcQP(), b.dev.Addr(), svc, verbs.ConnParams{})
		cancel()
		if err != nil {
			refused++
		}
	}
	if refused != 6 || b.dev.CMStats().LimitRejects != 6 || b.dev.CMStats().Records != 64 {
		t.Fatalf("%d refused, %+v; want 6 refused and 64 records", refused, b.dev.CMStats())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := a.dev.ConnectRC(ctx, a.rcQP(), b.dev.Addr(), svc, verbs.ConnParams{}); err != nil {
		t.Fatalf("another source refused: %v", err)
	}
}
