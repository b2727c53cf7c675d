package meta

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// runOnClock runs f in a goroutine and moves clk forward in steps of
// step (letting goroutines run between them) until f returns; it fails
// the test if f has not returned after limit of clock time.
func runOnClock(t *testing.T, clk *softnictest.ManualClock, step, limit time.Duration, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	for moved := time.Duration(0); ; moved += step {
		select {
		case <-done:
			return moved
		default:
		}
		if moved > limit {
			t.Fatalf("still running after %v of clock time", moved)
		}
		clk.Advance(step)
		time.Sleep(200 * time.Microsecond)
	}
}

// TestStarvedServerLoopbackRetransmits: a meta server whose host is
// starved of CPU reads its own loopback ACKs late (here: every packet
// from the server to itself arrives stall late). Its table WRITEs are
// then retransmitted at the connection ACK timeout, not every 8 ms (the
// NIC's default, with which 1% of a CPU left a real service reading
// 7,114 of its own WRITEs among 8,880 datagrams), and the registration
// completes with no repair of the loopback QP.
func TestStarvedServerLoopbackRetransmits(t *testing.T) {
	checkLeaks(t)
	const stall = 400 * time.Millisecond // a few connection ACK timeouts
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	sdev := f.device()
	srv := startServer(t, sdev, ServerConfig{Slots: 256, Clock: clk, Lease: time.Hour})
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, Clock: clk})
	ctx := ctxT(t)
	self := sdev.Addr()
	var writes atomic.Int64
	var delay atomic.Int64
	f.net.SetFilter(func(from, to netip.AddrPort, h wire.Header, _ []byte) softnictest.Verdict {
		if from != self || to != self {
			return softnictest.Pass
		}
		if h.Op == wire.OpWrite {
			writes.Add(1)
		}
		return softnictest.Delay(time.Duration(delay.Load()))
	})
	register := func(gid uint32) {
		runOnClock(t, clk, 5*time.Millisecond, time.Minute, func() {
			if _, err := rawRegister(ctx, c, testNode(gid, uint64(gid)), time.Hour); err != nil {
				t.Errorf("register %d: %v", gid, err)
			}
		})
	}
	register(1)
	base := writes.Load() // the WRITE packets of one registration
	writes.Store(0)
	delay.Store(int64(stall))
	register(2)
	got := writes.Load()
	t.Logf("a registration: %d loopback WRITE packets; with its ACKs %v late: %d", base, stall, got)
	// The round trip is 2*stall (WRITE and ACK both late): at
	// connQPTimeout (125 ms) a group is sent about 2*stall/125ms + 1
	// times; at 8 ms it was sent 1,806 times and the QP failed 10 times.
	if limit := base * int64(2*stall/connQPTimeout+2); got > limit {
		t.Errorf("%d loopback WRITE packets for a registration whose ACKs are %v late; want at most %d", got, stall, limit)
	}
	if n := srv.Stats().LoopRepairs; n != 0 {
		t.Errorf("%d loopback QP repairs: a slow loopback was taken for a broken one", n)
	}
}
