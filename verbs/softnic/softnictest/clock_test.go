package softnictest

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/wire"
)

func TestManualClockInterleavesPacketsAndTimers(t *testing.T) {
	n, clk := manualNet(t, Config{Delay: 2 * time.Millisecond})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	var log []string
	rb.onDeliver = func(_ netip.AddrPort, h wire.Header, _ []byte) {
		log = append(log, fmt.Sprintf("pkt%d@%v", h.PSN, clk.Now().Sub(Epoch)))
	}
	for _, d := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond} {
		clk.AfterFunc(d, func() {
			log = append(log, fmt.Sprintf("timer@%v", clk.Now().Sub(Epoch)))
			if d == time.Millisecond { // a packet sent from a timer callback
				mustSend(t, a, packets(b.LocalAddr(), 1, 1))
			}
		})
	}
	mustSend(t, a, packets(b.LocalAddr(), 0, 1))
	clk.Advance(5 * time.Millisecond)
	want := []string{"timer@1ms", "pkt0@2ms", "timer@2ms", "pkt1@3ms", "timer@3ms"}
	if !slices.Equal(log, want) {
		t.Errorf("events %v, want %v", log, want)
	}

	log = nil
	mustSend(t, a, packets(b.LocalAddr(), 2, 1))
	if !clk.RunNext() || !slices.Equal(log, []string{"pkt2@7ms"}) {
		t.Errorf("RunNext: events %v, want pkt2@7ms", log)
	}
}

func TestNetworksCanShareAManualClock(t *testing.T) {
	clk := NewManualClock(time.Time{})
	n1 := NewNetwork(Config{Clock: clk, Delay: time.Millisecond})
	n2 := NewNetwork(Config{Clock: clk, Delay: 2 * time.Millisecond})
	a1, _ := startedLink(n1)
	b1, r1 := startedLink(n1)
	a2, _ := startedLink(n2)
	b2, r2 := startedLink(n2)
	mustSend(t, a1, packets(b1.LocalAddr(), 0, 1))
	mustSend(t, a2, packets(b2.LocalAddr(), 0, 1))
	clk.Advance(5 * time.Millisecond)
	if d1, d2 := r1.deliveries(), r2.deliveries(); len(d1) != 1 || len(d2) != 1 ||
		d1[0].At != time.Millisecond || d2[0].At != 2*time.Millisecond {
		t.Errorf("deliveries %+v and %+v", d1, d2)
	}

	// A closed network is no longer driven by the clock.
	mustSend(t, a2, packets(b2.LocalAddr(), 1, 1))
	n2.Close()
	if _, ok := n2.nextDue(); ok {
		t.Errorf("closed network still has deliveries due")
	}
	clk.Advance(5 * time.Millisecond)
	n1.Close()
	if clk.RunNext() {
		t.Errorf("events pending after both networks closed")
	}
}
