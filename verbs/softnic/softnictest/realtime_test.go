package softnictest

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// waitDeliveries waits until r has count deliveries (a two-minute guard
// against a hang, not a speed limit).
func waitDeliveries(t *testing.T, r *recorder, count int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for len(r.deliveries()) < count {
		if time.Now().After(deadline) {
			t.Fatalf("got %d deliveries, want %d", len(r.deliveries()), count)
		}
		select {
		case <-r.notify:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestRealTimeDelivery(t *testing.T) {
	leaktest.Check(t)
	n := NewNetwork(Config{Delay: 2 * time.Millisecond, Coalesce: 0.5, Seed: 1})
	defer n.Close()
	if _, ok := n.Clock().(link.SystemClock); !ok {
		t.Fatalf("real-time network clock is %T", n.Clock())
	}
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	rb.notify = make(chan struct{}, 1)
	start := time.Now()
	mustSend(t, a, packets(b.LocalAddr(), 0, 20))
	waitDeliveries(t, rb, 20)
	if el := time.Since(start); el < 2*time.Millisecond {
		t.Errorf("delivered after %v, before the 2ms delay", el)
	}
	if got := rb.psns(); !slices.Equal(got, seq(0, 20)) {
		t.Errorf("PSNs %v", got)
	}
	rb.check(t)
}

// TestRealTimeUnderSynctest runs the real-time mode in a synctest bubble,
// where delays cost no wall time.
func TestRealTimeUnderSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork(Config{Seed: 2, Delay: 50 * time.Millisecond, Jitter: 20 * time.Millisecond})
		defer n.Close()
		a, _ := startedLink(n)
		b, rb := startedLink(n)
		mustSend(t, a, packets(b.LocalAddr(), 0, 10))
		time.Sleep(49 * time.Millisecond)
		synctest.Wait()
		if got := len(rb.deliveries()); got != 0 {
			t.Fatalf("%d packets delivered before the delay", got)
		}
		time.Sleep(25 * time.Millisecond)
		synctest.Wait()
		d := rb.deliveries()
		if len(d) != 10 {
			t.Fatalf("%d packets delivered after delay+jitter, want 10", len(d))
		}
		for _, e := range d {
			if e.At < 50*time.Millisecond || e.At > 70*time.Millisecond {
				t.Errorf("PSN %d arrived at %v, outside [50ms, 70ms]", e.PSN, e.At)
			}
		}
	})
}

// autoFlushPair returns a manual clock, an AutoFlush network on it (closed
// at the test's end) and two started links, the second's recorder.
func autoFlushPair(t *testing.T) (*ManualClock, *Network, *Link, *Link, *recorder) {
	clk := NewManualClock(time.Time{})
	n := NewNetwork(Config{Clock: clk, AutoFlush: true})
	t.Cleanup(func() { n.Close() })
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	return clk, n, a, b, rb
}

func TestAutoFlushDeliversWithoutFlush(t *testing.T) {
	leaktest.Check(t)
	clk, n, a, b, rb := autoFlushPair(t)
	rb.notify = make(chan struct{}, 1)
	mustSend(t, a, packets(b.LocalAddr(), 0, 5))
	waitDeliveries(t, rb, 5)

	n.SetFilter(func(netip.AddrPort, netip.AddrPort, wire.Header, []byte) Verdict { return Delay(time.Second) })
	mustSend(t, a, packets(b.LocalAddr(), 5, 1))
	time.Sleep(5 * time.Millisecond)
	if got := len(rb.deliveries()); got != 5 {
		t.Fatalf("a packet due in 1s of manual time arrived without Advance")
	}
	clk.Advance(time.Second)
	if got := rb.psns(); !slices.Equal(got, seq(0, 6)) {
		t.Errorf("PSNs %v", got)
	}
}

func TestCloseStopsEveryGoroutine(t *testing.T) {
	leaktest.Check(t)
	n := NewNetwork(Config{Delay: time.Hour}) // packets stay queued
	var links []*Link
	for range 8 {
		l, _ := startedLink(n)
		links = append(links, l)
	}
	mustSend(t, links[0], packets(links[1].LocalAddr(), 0, 3))
	links[2].Close()
	n.Close()
	if err := links[0].Send(packets(links[1].LocalAddr(), 0, 1)); err == nil {
		t.Errorf("Send after Network.Close succeeded")
	}
}

func TestConcurrentSendersInRealTime(t *testing.T) {
	leaktest.Check(t)
	n := NewNetwork(Config{Seed: 5, Dup: 0.1, Reorder: 0.1, ReorderDelay: 100 * time.Microsecond, Coalesce: 0.5})
	defer n.Close()
	const senders, each = 4, 200
	sink, rs := startedLink(n)
	rs.notify = make(chan struct{}, 1)
	var wg sync.WaitGroup
	for s := range senders {
		src, _ := startedLink(n)
		wg.Go(func() {
			for i := 0; i < each; i += 10 {
				mustSend(t, src, packets(sink.LocalAddr(), uint32(s*each+i), 10))
			}
		})
	}
	wg.Wait()
	c := n.Counters()
	waitDeliveries(t, rs, int(c.Sent+c.Duplicated))
	n.Flush()
	rs.check(t)
	checkBalance(t, n)
}

// TestAutoFlushClockWaitsForDelivery: with AutoFlush, a link's goroutine
// may take a packet off the queue just before the test calls Advance.
// Time must not move until that delivery is over, so that what the
// Receiver does in answer (here: read the clock, as a NIC does to arm its
// timers and stamp its replies) happens at the instant the packet was due.
func TestAutoFlushClockWaitsForDelivery(t *testing.T) {
	leaktest.Check(t)
	clk, _, a, b, rb := autoFlushPair(t)
	start := clk.Now()
	var late []string
	var mu sync.Mutex
	rb.onDeliver = func(_ netip.AddrPort, h wire.Header, _ []byte) {
		for range 3 {
			runtime.Gosched() // widen the window in which Advance could run
		}
		due := time.Duration(h.PSN) * time.Millisecond
		if at := clk.Now().Sub(start); at != due {
			mu.Lock()
			late = append(late, fmt.Sprintf("PSN %d handled at %v, due at %v", h.PSN, at, due))
			mu.Unlock()
		}
	}
	const rounds = 300
	for i := range rounds {
		mustSend(t, a, packets(b.LocalAddr(), uint32(i), 1))
		clk.Advance(time.Millisecond)
	}
	if got := len(rb.deliveries()); got != rounds {
		t.Fatalf("%d of %d packets delivered", got, rounds)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Fatalf("%d of %d packets handled after the clock moved on, first: %s", len(late), rounds, late[0])
	}
}
