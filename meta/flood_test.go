package meta

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestForgedJoinFloodFillsNothing is issue 11's join flood: 5,000 forged
// connection requests to the meta service (from forged addresses that
// cannot receive) create no connection, and a node joins at once.
func TestForgedJoinFloodFillsNothing(t *testing.T) {
	f := fakeFabric(t)
	s := startServer(t, f.device(), ServerConfig{})
	for i := range 5000 {
		h := wire.Header{Op: wire.OpCMReq, Service: DefaultService, CMQPN: uint32(i + 1), CMPSN: 1, CMMTU: 4096, ConnID: uint64(i)}
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 77, byte(i >> 8), byte(i)}), 4791)
		f.net.Inject(from, s.Addr(), append(h.Append(nil), bootRequest()...))
		if i%256 == 255 {
			f.net.Flush()
		}
	}
	f.net.Flush()
	if st := s.Stats(); st.Conns != 0 || st.Accepted != 0 {
		t.Fatalf("forged requests made connections: %+v", st)
	}
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{s.Addr()}})
	if _, err := rawRegister(ctxT(t), c, testNode(0, 0), time.Second); err != nil {
		t.Fatalf("join after the flood: %v", err)
	}
}

// TestConnLimitsPerSourceAndHalfOpen: one source IP gets at most
// MaxConnsPerSource connections; connections that never send a message
// are reclaimed after HalfOpenTimeout, while a client that talks stays.
func TestConnLimitsPerSourceAndHalfOpen(t *testing.T) {
	clk := softnictest.NewManualClock(time.Unix(1e9, 0))
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	s := startServer(t, f.device(), ServerConfig{MaxConnsPerSource: 8, HalfOpenTimeout: time.Second, IdleTimeout: time.Minute})
	l, err := f.net.NewLinkAt(netip.MustParseAddrPort("10.5.5.5:4791"))
	if err != nil {
		t.Fatal(err)
	}
	flooder, err := softnic.Open(softnic.Config{Link: l, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer flooder.Close()
	pd, _ := flooder.AllocPD()
	cq, _ := flooder.CreateCQ(64)
	refused := 0
	for range 10 {
		q, err := pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = flooder.ConnectRC(ctx, q, s.Addr(), DefaultService, verbs.ConnParams{Private: bootRequest()})
		cancel()
		if err != nil {
			refused++
		}
	}
	if refused != 2 || s.Stats().Conns != 8 {
		t.Fatalf("%d refused, %d connections; want 2 refused and 8", refused, s.Stats().Conns)
	}
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{s.Addr()}, Clock: clk})
	if _, err := rawRegister(ctxT(t), c, testNode(0, 0), time.Minute); err != nil {
		t.Fatalf("another source refused: %v", err)
	}
	advance(clk, 2*time.Second, 50*time.Millisecond, func() { time.Sleep(time.Millisecond) })
	waitFor(t, 30*time.Second, "half-open connections reclaimed", func() bool { return s.Stats().Conns == 1 })
}
