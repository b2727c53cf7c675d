package softnictest

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// header returns an encoded SEND header carrying psn.
func header(psn uint32) []byte {
	h := wire.Header{Op: wire.OpSend, Flags: wire.FlagFirst | wire.FlagLast, DestQP: 1, SrcQP: 2, PSN: psn}
	return h.Append(nil)
}

// payloadFor is the payload the tests send with psn; all have the same
// length, so that GRO-shaped coalescing can merge them.
func payloadFor(psn uint32) []byte { return fmt.Appendf(nil, "payload-%06d", psn) }

// packets returns packets to to with PSNs first, first+1, ... .
func packets(to netip.AddrPort, first uint32, count int) []link.Packet {
	var pkts []link.Packet
	for i := range count {
		psn := first + uint32(i)
		pkts = append(pkts, link.Packet{To: to, Hdr: header(psn), Payload: payloadFor(psn)})
	}
	return pkts
}

func mustSend(t testing.TB, l *Link, pkts []link.Packet) {
	t.Helper()
	if err := l.Send(pkts); err != nil {
		t.Fatalf("Send: %v", err)
	}
}

// rxEvent is one call a recorder received.
type rxEvent struct {
	Steer   bool           // Steer (else Deliver)
	From    netip.AddrPort //
	PSN     uint32         // PSN of the header passed (for Steer: the batch's first)
	Index   int            // Steer: index in the batch
	Len     int            // Steer: payload length; Deliver: len(payload)
	Payload string         // Deliver: payload bytes
	Steered bool           // Deliver: payload is memory Steer returned
	Nil     bool           // Deliver: payload is nil
	Batch   int            // which RxLock section the call was in
	At      time.Duration  // clock time since the recorder was made
}

// recorder is a link.Receiver that logs every call and checks that each
// happens inside RxLock.
type recorder struct {
	clock link.Clock
	start time.Time
	// steer, if set, answers Steer (receiving the first header's PSN).
	steer func(firstPSN uint32, index, n int) []byte
	// onDeliver, if set, runs at the end of Deliver (the receiver's lock
	// held), with the parsed header.
	onDeliver func(from netip.AddrPort, h wire.Header, payload []byte)
	// notify, if set, gets a value per Deliver (non-blocking).
	notify chan struct{}

	rx sync.Mutex // the lock RxLock takes

	mu         sync.Mutex // guards the fields below
	inRx       bool
	batches    int
	steered    [][]byte // memory returned by Steer in the current batch
	events     []rxEvent
	violations []string
}

func newRecorder(clock link.Clock) *recorder {
	return &recorder{clock: clock, start: clock.Now()}
}

func (r *recorder) RxLock() {
	r.rx.Lock()
	r.mu.Lock()
	r.inRx = true
	r.batches++
	r.steered = r.steered[:0]
	r.mu.Unlock()
}

func (r *recorder) RxUnlock() {
	r.mu.Lock()
	r.inRx = false
	r.mu.Unlock()
	r.rx.Unlock()
}

func psnOf(hdr []byte) uint32 {
	h, _, err := wire.Parse(hdr)
	if err != nil {
		return 1 << 31
	}
	return h.PSN
}

func (r *recorder) Steer(from netip.AddrPort, hdr []byte, index int, n int) []byte {
	var dst []byte
	if r.steer != nil {
		dst = r.steer(psnOf(hdr), index, n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.inRx {
		r.violations = append(r.violations, "Steer outside RxLock")
	}
	if dst != nil {
		r.steered = append(r.steered, dst)
	}
	r.events = append(r.events, rxEvent{Steer: true, From: from, PSN: psnOf(hdr), Index: index, Len: n, Batch: r.batches, At: r.clock.Now().Sub(r.start)})
	return dst
}

func (r *recorder) Deliver(from netip.AddrPort, hdr []byte, payload []byte) {
	r.mu.Lock()
	if !r.inRx {
		r.violations = append(r.violations, "Deliver outside RxLock")
	}
	steered := len(payload) > 0 && slices.ContainsFunc(r.steered, func(b []byte) bool {
		return len(b) > 0 && &b[0] == &payload[0]
	})
	r.events = append(r.events, rxEvent{From: from, PSN: psnOf(hdr), Len: len(payload), Payload: string(payload), Steered: steered, Nil: payload == nil, Batch: r.batches, At: r.clock.Now().Sub(r.start)})
	r.mu.Unlock()
	if r.onDeliver != nil {
		h, _, _ := wire.Parse(hdr)
		r.onDeliver(from, h, payload)
	}
	if r.notify != nil {
		select {
		case r.notify <- struct{}{}:
		default:
		}
	}
}

// deliveries returns the Deliver events.
func (r *recorder) deliveries() []rxEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []rxEvent
	for _, e := range r.events {
		if !e.Steer {
			out = append(out, e)
		}
	}
	return out
}

// psns returns the PSNs of the Deliver events, in order.
func (r *recorder) psns() []uint32 {
	var out []uint32
	for _, e := range r.deliveries() {
		out = append(out, e.PSN)
	}
	return out
}

func (r *recorder) allEvents() []rxEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// check fails t if the receive contract was broken.
func (r *recorder) check(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.violations {
		t.Error(v)
	}
}

// manualNet returns a network on a fresh manual clock, closed at cleanup.
func manualNet(t testing.TB, cfg Config) (*Network, *ManualClock) {
	t.Helper()
	clk := NewManualClock(time.Time{})
	cfg.Clock = clk
	n := NewNetwork(cfg)
	t.Cleanup(func() { n.Close() })
	return n, clk
}

// startedLink returns a new link of n started with a new recorder.
func startedLink(n *Network) (*Link, *recorder) {
	l := n.NewLink()
	r := newRecorder(n.Clock())
	l.Start(r)
	return l, r
}

// seq returns first, first+1, ..., first+count-1.
func seq(first uint32, count int) []uint32 {
	out := make([]uint32, count)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// checkBalance checks the counter identity that holds once nothing is
// queued.
func checkBalance(t testing.TB, n *Network) {
	t.Helper()
	if q := n.Queued(); q != 0 {
		t.Fatalf("%d packets still queued", q)
	}
	c := n.Counters()
	if in, out := c.Sent+c.Injected+c.Duplicated, c.Delivered+c.Dropped; in != out {
		t.Errorf("counters do not balance: sent+injected+duplicated = %d, delivered+dropped = %d (%+v)", in, out, c)
	}
}
