package softnic_test

import (
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/udplink"
	"github.com/krfs/krfs/verbs/verbstest"
)

// TestConformanceFake runs the verbs conformance suite over the in-memory
// network on a manual clock: packets flow as soon as they are sent
// (AutoFlush), timers fire only when the suite advances the clock, so a
// busy machine can never make a retransmission timer expire.
func TestConformanceFake(t *testing.T) {
	checkLeaks(t)
	verbstest.Run(t, fakeFabric())
}

func fakeFabric() verbstest.Fabric {
	var (
		mu  sync.Mutex
		clk *softnictest.ManualClock
	)
	// Each case gets its own network and clock.
	open := func(t testing.TB, noAtomics bool) verbs.Device {
		mu.Lock()
		defer mu.Unlock()
		net := netOf(t)
		clk = net.clk
		dev, err := softnic.Open(softnic.Config{Link: net.n.NewLink(), Clock: net.clk, NoAtomics: noAtomics})
		if err != nil {
			t.Fatalf("softnic.Open: %v", err)
		}
		t.Cleanup(func() { dev.Close() })
		return dev
	}
	return verbstest.Fabric{
		NewDevice:               func(t testing.TB) verbs.Device { return open(t, false) },
		NewDeviceWithoutAtomics: func(t testing.TB) verbs.Device { return open(t, true) },
		Advance: func(d time.Duration) {
			mu.Lock()
			c := clk
			mu.Unlock()
			c.Advance(d)
		},
	}
}

type manualNet struct {
	n   *softnictest.Network
	clk *softnictest.ManualClock
}

var (
	netsMu sync.Mutex
	nets   = map[testing.TB]*manualNet{}
)

// netOf returns the network of test t, made on first use.
func netOf(t testing.TB) *manualNet {
	netsMu.Lock()
	defer netsMu.Unlock()
	if m := nets[t]; m != nil {
		return m
	}
	clk := softnictest.NewManualClock(time.Time{})
	m := &manualNet{n: softnictest.NewNetwork(softnictest.Config{Seed: 14, Clock: clk, AutoFlush: true}), clk: clk}
	nets[t] = m
	t.Cleanup(func() {
		netsMu.Lock()
		delete(nets, t)
		netsMu.Unlock()
		m.n.Close()
	})
	return m
}

// TestConformanceUDP runs the suite over real UDP sockets on loopback.
func TestConformanceUDP(t *testing.T) {
	checkLeaks(t)
	open := func(t testing.TB, noAtomics bool) verbs.Device {
		l, err := udplink.Open(udplink.DefaultConfig("127.0.0.1:0"))
		if err != nil {
			t.Fatalf("udplink.Open: %v", err)
		}
		dev, err := softnic.Open(softnic.Config{Link: l, NoAtomics: noAtomics})
		if err != nil {
			l.Close()
			t.Fatalf("softnic.Open: %v", err)
		}
		t.Cleanup(func() { dev.Close() })
		return dev
	}
	verbstest.Run(t, verbstest.Fabric{
		NewDevice:               func(t testing.TB) verbs.Device { return open(t, false) },
		NewDeviceWithoutAtomics: func(t testing.TB) verbs.Device { return open(t, true) },
	})
}
