package softnictest

import (
	"bytes"
	"errors"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

func TestPerfectNetworkDeliversInSendOrder(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, _ := startedLink(n)
	b, rb := startedLink(n)

	mustSend(t, a, packets(b.LocalAddr(), 0, 50))
	mustSend(t, a, packets(b.LocalAddr(), 50, 50))
	if got := n.Flush(); got != 100 {
		t.Fatalf("Flush delivered %d, want 100", got)
	}
	if got, want := rb.psns(), seq(0, 100); !slices.Equal(got, want) {
		t.Fatalf("delivered PSNs %v, want %v", got, want)
	}
	for _, e := range rb.deliveries() {
		if e.From != a.LocalAddr() || e.Payload != string(payloadFor(e.PSN)) || e.Steered {
			t.Fatalf("bad delivery %+v", e)
		}
	}
	rb.check(t)
	checkBalance(t, n)

	as, bs := a.Stats(), b.Stats()
	size := uint64(len(header(0)) + len(payloadFor(0)))
	if as.TxDatagrams != 100 || as.TxSyscalls != 2 || as.TxBytes < 100*size {
		t.Errorf("sender stats %+v", as)
	}
	if bs.RxDatagrams != 100 || bs.RxSyscalls != 100 || bs.RxBytes != as.TxBytes {
		t.Errorf("receiver stats %+v (sender %+v)", bs, as)
	}
	if ac, bc := a.Counters(), b.Counters(); ac.Sent != 100 || bc.Delivered != 100 || ac.Delivered != 0 {
		t.Errorf("link counters: sender %+v receiver %+v", ac, bc)
	}
}

func TestManualNetworkMovesOnlyOnFlushOrAdvance(t *testing.T) {
	n, clk := manualNet(t, Config{Delay: 10 * time.Millisecond})
	a, _ := startedLink(n)
	b, rb := startedLink(n)

	mustSend(t, a, packets(b.LocalAddr(), 0, 3))
	if got := n.Flush(); got != 0 {
		t.Fatalf("Flush delivered %d packets that are not due", got)
	}
	clk.Advance(9 * time.Millisecond)
	if got := len(rb.deliveries()); got != 0 {
		t.Fatalf("%d packets delivered before their delay passed", got)
	}
	clk.Advance(time.Millisecond)
	d := rb.deliveries()
	if len(d) != 3 {
		t.Fatalf("delivered %d packets at the delay, want 3", len(d))
	}
	for _, e := range d {
		if e.At != 10*time.Millisecond {
			t.Errorf("PSN %d delivered at %v, want 10ms", e.PSN, e.At)
		}
	}
}

func TestPacketsWaitForStart(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, _ := startedLink(n)
	b := n.NewLink()
	mustSend(t, a, packets(b.LocalAddr(), 0, 2))
	if got := n.Flush(); got != 0 {
		t.Fatalf("delivered %d packets to a link that was not started", got)
	}
	rb := newRecorder(n.Clock())
	b.Start(rb)
	n.Flush()
	if got := rb.psns(); !slices.Equal(got, seq(0, 2)) {
		t.Fatalf("after Start got PSNs %v", got)
	}
}

func TestDropRateMatchesConfig(t *testing.T) {
	const count, p = 4000, 0.2
	n, _ := manualNet(t, Config{Seed: 7, Drop: p})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	for i := 0; i < count; i += 100 {
		mustSend(t, a, packets(b.LocalAddr(), uint32(i), 100))
		n.Flush()
	}
	c := n.Counters()
	sigma := math.Sqrt(count * p * (1 - p))
	if diff := math.Abs(float64(c.Dropped) - count*p); diff > 4*sigma {
		t.Errorf("dropped %d of %d, want %v ± %.0f", c.Dropped, count, count*p, 4*sigma)
	}
	if got := uint64(len(rb.deliveries())); got != c.Delivered || got+c.Dropped != count {
		t.Errorf("receiver saw %d, counters %+v", got, c)
	}
	if psns := rb.psns(); !slices.IsSorted(psns) {
		t.Errorf("loss reordered packets")
	}
	checkBalance(t, n)
}

func TestDuplicationRateMatchesConfig(t *testing.T) {
	const count, p = 4000, 0.1
	n, _ := manualNet(t, Config{Seed: 8, Dup: p})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	for i := 0; i < count; i += 100 {
		mustSend(t, a, packets(b.LocalAddr(), uint32(i), 100))
		n.Flush()
	}
	c := n.Counters()
	sigma := math.Sqrt(count * p * (1 - p))
	if diff := math.Abs(float64(c.Duplicated) - count*p); diff > 4*sigma {
		t.Errorf("duplicated %d of %d, want %v ± %.0f", c.Duplicated, count, count*p, 4*sigma)
	}
	seen := make(map[uint32]int)
	for _, psn := range rb.psns() {
		seen[psn]++
	}
	extra := 0
	for psn := range uint32(count) {
		switch seen[psn] {
		case 1:
		case 2:
			extra++
		default:
			t.Fatalf("PSN %d delivered %d times", psn, seen[psn])
		}
	}
	if uint64(extra) != c.Duplicated {
		t.Errorf("receiver saw %d duplicates, counters say %d", extra, c.Duplicated)
	}
	checkBalance(t, n)
}

func TestReorderHoldsPacketsBack(t *testing.T) {
	const count = 1000
	n, clk := manualNet(t, Config{Seed: 9, Reorder: 0.1, ReorderDelay: 2 * time.Millisecond})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	for i := 0; i < count; i += 10 {
		mustSend(t, a, packets(b.LocalAddr(), uint32(i), 10))
		clk.Advance(100 * time.Microsecond)
	}
	clk.Advance(2 * time.Millisecond)

	c := n.Counters()
	if c.Reordered < 50 || c.Reordered > 150 {
		t.Errorf("reordered %d of %d at p=0.1", c.Reordered, count)
	}
	psns := rb.psns()
	sorted := slices.Sorted(slices.Values(psns))
	if !slices.Equal(sorted, seq(0, count)) {
		t.Fatalf("reordering lost or duplicated packets")
	}
	inversions := 0
	for i := 1; i < len(psns); i++ {
		if psns[i] < psns[i-1] {
			inversions++
		}
	}
	if inversions == 0 {
		t.Errorf("no packet arrived out of order")
	}
	checkBalance(t, n)
}

func TestJitterKeepsEachPairInOrder(t *testing.T) {
	n, clk := manualNet(t, Config{Seed: 10, Delay: time.Millisecond, Jitter: time.Millisecond})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	for i := range 200 {
		mustSend(t, a, packets(b.LocalAddr(), uint32(i), 1))
		clk.Advance(10 * time.Microsecond)
	}
	clk.Advance(3 * time.Millisecond)
	d := rb.deliveries()
	if got := rb.psns(); !slices.Equal(got, seq(0, 200)) {
		t.Fatalf("jitter reordered a pair: %v", got)
	}
	spread := make(map[time.Duration]bool)
	for i, e := range d {
		lat := e.At - time.Duration(i)*10*time.Microsecond
		if lat < time.Millisecond {
			t.Fatalf("PSN %d arrived %v after sending, below Delay", e.PSN, lat)
		}
		spread[e.At] = true
	}
	if len(spread) < 20 {
		t.Errorf("only %d distinct arrival times: no jitter?", len(spread))
	}
}

func TestCoalescedBatchSteersByIndexFromFirstHeader(t *testing.T) {
	n, _ := manualNet(t, Config{Coalesce: 1})
	a, _ := startedLink(n)
	b, rb := startedLink(n)

	// Steer even indexes into buffers keyed by the predicted PSN
	// (first PSN + index); leave odd ones to scratch.
	bufs := make(map[uint32][]byte)
	rb.steer = func(first uint32, index, size int) []byte {
		if index%2 == 1 {
			return nil
		}
		buf := make([]byte, size)
		bufs[first+uint32(index)] = buf
		return buf
	}
	mustSend(t, a, packets(b.LocalAddr(), 100, 5))
	n.Flush()
	rb.check(t)

	events := rb.allEvents()
	if len(events) != 10 {
		t.Fatalf("got %d events, want 5 Steer then 5 Deliver: %+v", len(events), events)
	}
	for i, e := range events[:5] {
		want := rxEvent{Steer: true, From: a.LocalAddr(), PSN: 100, Index: i, Len: len(payloadFor(100 + uint32(i))), Batch: 1}
		if e != want {
			t.Errorf("Steer %d: got %+v, want %+v", i, e, want)
		}
	}
	for i, e := range events[5:] {
		psn := 100 + uint32(i)
		if e.Steer || e.PSN != psn || e.Payload != string(payloadFor(psn)) || e.Batch != 1 || e.Steered != (i%2 == 0) {
			t.Errorf("Deliver %d: got %+v, want PSN %d in batch 1, steered %v", i, e, psn, i%2 == 0)
		}
	}
	for psn, buf := range bufs {
		if !bytes.Equal(buf, payloadFor(psn)) {
			t.Errorf("steered buffer for PSN %d holds %q", psn, buf)
		}
	}
	if st := b.Stats(); st.RxSyscalls != 1 || st.RxDatagrams != 5 {
		t.Errorf("receiver stats %+v, want one batch of 5", st)
	}
	if c := n.Counters(); c.Coalesced != 4 {
		t.Errorf("Coalesced = %d, want 4", c.Coalesced)
	}
}

// TestCoalescedBatchWithMispredictedHeaders sends a WRITE whose first
// packet carries a RETH and whose later packets do not, all the same size:
// GRO merges them, the receiver steers every index by the first header's
// layout, and the link must deliver the later packets from scratch with
// their real payloads, leaving misplaced bytes in the steered memory.
func TestCoalescedBatchWithMispredictedHeaders(t *testing.T) {
	n, _ := manualNet(t, Config{Coalesce: 1})
	a, _ := startedLink(n)
	b, rb := startedLink(n)

	const size = 132
	first := wire.Header{Op: wire.OpWrite, Flags: wire.FlagFirst, DestQP: 1, PSN: 10, RKey: 7, DMALen: 3 * 100}
	var pkts []link.Packet
	var payloads [][]byte
	for i := range 3 {
		h := first
		if i > 0 {
			h = wire.Header{Op: wire.OpWrite, DestQP: 1, PSN: 10 + uint32(i)}
		}
		hdr := h.Append(nil)
		payload := bytes.Repeat([]byte{byte('a' + i)}, size-len(hdr))
		payloads = append(payloads, payload)
		pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: hdr, Payload: payload})
	}
	var bufs [][]byte
	rb.steer = func(psn uint32, index, n int) []byte {
		if psn != 10 || n != size-wire.BaseLen-wire.RETHLen {
			t.Errorf("Steer(PSN %d, index %d, len %d): want the first header and its payload length", psn, index, n)
		}
		buf := make([]byte, n)
		bufs = append(bufs, buf)
		return buf
	}
	mustSend(t, a, pkts)
	n.Flush()

	d := rb.deliveries()
	if len(d) != 3 || len(bufs) != 3 {
		t.Fatalf("%d deliveries, %d steers; want 3 each", len(d), len(bufs))
	}
	for i, e := range d {
		if e.PSN != 10+uint32(i) || e.Payload != string(payloads[i]) || e.Steered != (i == 0) {
			t.Errorf("delivery %d: PSN %d steered %v payload %q", i, e.PSN, e.Steered, e.Payload)
		}
	}
	// The kernel placed bytes at the predicted offset: for packets 1 and 2
	// that is 16 bytes into their payload.
	if want := payloads[1][wire.RETHLen:]; !bytes.Equal(bufs[1], want) {
		t.Errorf("steered memory of a mispredicted packet holds %q, want %q", bufs[1], want)
	}
	if c := b.Counters(); c.Steered != 1 || c.Mispredicted != 2 || c.Coalesced != 2 {
		t.Errorf("counters %+v", c)
	}
}

func TestCoalescingKeepsGROShape(t *testing.T) {
	n, _ := manualNet(t, Config{Coalesce: 1})
	a, _ := startedLink(n)
	b, _ := startedLink(n)
	sizes := []int{10, 10, 4, 10, 12, 12}
	var pkts []link.Packet
	for i, size := range sizes {
		pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: header(uint32(i)), Payload: make([]byte, size)})
	}
	mustSend(t, a, pkts)
	n.Flush()
	// {10 10 4} (a shorter last segment ends a batch), {10}, {12 12}.
	if st := b.Stats(); st.RxSyscalls != 3 || st.RxDatagrams != 6 {
		t.Errorf("stats %+v, want 3 batches", st)
	}
}

func TestCoalescedBatchesAreBounded(t *testing.T) {
	n, _ := manualNet(t, Config{Coalesce: 1})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	mustSend(t, a, packets(b.LocalAddr(), 0, MaxBatch+10))
	n.Flush()
	if st := b.Stats(); st.RxSyscalls != 2 {
		t.Errorf("%d batches, want 2", st.RxSyscalls)
	}
	if got := rb.psns(); !slices.Equal(got, seq(0, MaxBatch+10)) {
		t.Errorf("PSNs %v", got)
	}
}

func TestCoalescingNeverMixesSources(t *testing.T) {
	n, _ := manualNet(t, Config{Coalesce: 1})
	a, _ := startedLink(n)
	c, _ := startedLink(n)
	b, rb := startedLink(n)
	for i := range 6 {
		src := a
		if i >= 2 && i < 4 {
			src = c
		}
		mustSend(t, src, packets(b.LocalAddr(), uint32(i), 1))
	}
	n.Flush()
	batchFrom := make(map[int]netip.AddrPort)
	for _, e := range rb.allEvents() {
		if f, ok := batchFrom[e.Batch]; ok && f != e.From {
			t.Fatalf("batch %d mixes %v and %v", e.Batch, f, e.From)
		}
		batchFrom[e.Batch] = e.From
	}
	if len(batchFrom) != 3 {
		t.Errorf("%d batches, want 3 (a, c, a)", len(batchFrom))
	}
}

func TestPartialCoalescing(t *testing.T) {
	n, _ := manualNet(t, Config{Seed: 11, Coalesce: 0.5})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	mustSend(t, a, packets(b.LocalAddr(), 0, 1000))
	n.Flush()
	st := b.Stats()
	// Each packet but the first joins its predecessor with p = 0.5.
	if st.RxSyscalls < 400 || st.RxSyscalls > 600 {
		t.Errorf("%d batches for 1000 packets at Coalesce 0.5", st.RxSyscalls)
	}
	if got := rb.psns(); !slices.Equal(got, seq(0, 1000)) {
		t.Errorf("coalescing changed the order")
	}
}

// traceRun runs a fixed scenario under every fault and returns a log of
// what both ends received, with times.
func traceRun(t *testing.T, seed uint64) []rxEvent {
	n, clk := manualNet(t, Config{
		Seed: seed, Drop: 0.1, Dup: 0.05, Reorder: 0.05,
		Delay: 50 * time.Microsecond, Jitter: 30 * time.Microsecond, Coalesce: 0.5,
	})
	a, ra := startedLink(n)
	b, rb := startedLink(n)
	// b acknowledges every packet from inside Deliver.
	rb.onDeliver = func(from netip.AddrPort, h wire.Header, _ []byte) {
		if err := b.Send([]link.Packet{{To: from, Hdr: header(h.PSN + 1<<20)}}); err != nil {
			t.Error(err)
		}
	}
	for i := 0; i < 500; i += 5 {
		mustSend(t, a, packets(b.LocalAddr(), uint32(i), 5))
		clk.Advance(20 * time.Microsecond)
	}
	clk.Advance(10 * time.Millisecond)
	checkBalance(t, n)
	return append(ra.allEvents(), rb.allEvents()...)
}

func TestSameSeedSameDeliveries(t *testing.T) {
	first := traceRun(t, 42)
	if len(first) < 500 {
		t.Fatalf("only %d events", len(first))
	}
	if again := traceRun(t, 42); !slices.Equal(first, again) {
		t.Errorf("two runs with seed 42 differ")
	}
	if other := traceRun(t, 43); slices.Equal(first, other) {
		t.Errorf("seeds 42 and 43 gave identical runs")
	}
}

func TestFilterVerdicts(t *testing.T) {
	n, clk := manualNet(t, Config{Seed: 1, Drop: 1}) // Pass must meet the random loss
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	n.SetFilter(func(from, to netip.AddrPort, h wire.Header, payload []byte) Verdict {
		if from != a.LocalAddr() || to != b.LocalAddr() || string(payload) != string(payloadFor(h.PSN)) {
			t.Errorf("filter saw from %v to %v PSN %d payload %q", from, to, h.PSN, payload)
		}
		return []Verdict{Drop, Dup, Delay(5 * time.Millisecond), Pass}[h.PSN%4]
	})
	mustSend(t, a, packets(b.LocalAddr(), 0, 8))
	n.Flush()
	if got, want := rb.psns(), []uint32{1, 1, 5, 5}; !slices.Equal(got, want) {
		t.Fatalf("before the delay: PSNs %v, want %v", got, want)
	}
	clk.Advance(5 * time.Millisecond)
	if got, want := rb.psns(), []uint32{1, 1, 5, 5, 2, 6}; !slices.Equal(got, want) {
		t.Fatalf("after the delay: PSNs %v, want %v", got, want)
	}
	c := n.Counters()
	if c.Dropped != 4 || c.Duplicated != 2 || c.Delayed != 2 || c.Delivered != 6 {
		t.Errorf("counters %+v", c)
	}
	checkBalance(t, n)

	n.SetFilter(nil)
	mustSend(t, a, packets(b.LocalAddr(), 100, 1))
	n.Flush()
	if got := len(rb.psns()); got != 6 {
		t.Errorf("without the filter Drop=1 should lose everything; %d delivered", got)
	}
}

func TestFilterGetsZeroHeaderForUnparsablePackets(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	var saw []string
	n.SetFilter(func(_, _ netip.AddrPort, h wire.Header, payload []byte) Verdict {
		if h != (wire.Header{}) {
			t.Errorf("header %+v for garbage", h)
		}
		saw = append(saw, string(payload))
		return Pass
	})
	mustSend(t, a, []link.Packet{{To: b.LocalAddr(), Hdr: []byte("junk"), Payload: []byte("!")}})
	n.Flush()
	if !slices.Equal(saw, []string{"junk!"}) || len(rb.deliveries()) != 1 {
		t.Errorf("filter saw %q, receiver %+v", saw, rb.deliveries())
	}
}

func TestPartitionIsolateHeal(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, ra := startedLink(n)
	b, rb := startedLink(n)
	c, rc := startedLink(n)
	exchange := func(psn uint32) {
		for _, src := range []*Link{a, b, c} {
			for _, dst := range []*Link{a, b, c} {
				if src != dst {
					mustSend(t, src, packets(dst.LocalAddr(), psn, 1))
				}
			}
		}
		n.Flush()
	}
	from := func(r *recorder, psn uint32) []netip.AddrPort {
		var out []netip.AddrPort
		for _, e := range r.deliveries() {
			if e.PSN == psn {
				out = append(out, e.From)
			}
		}
		slices.SortFunc(out, netip.AddrPort.Compare)
		return out
	}

	n.Partition(a.LocalAddr(), b.LocalAddr())
	exchange(1)
	if got := from(ra, 1); !slices.Equal(got, []netip.AddrPort{c.LocalAddr()}) {
		t.Errorf("partitioned a heard from %v", got)
	}
	if got := from(rb, 1); !slices.Equal(got, []netip.AddrPort{c.LocalAddr()}) {
		t.Errorf("partitioned b heard from %v", got)
	}

	n.Heal()
	n.Isolate(c.LocalAddr())
	exchange(2)
	if got := from(rc, 2); len(got) != 0 {
		t.Errorf("isolated c heard from %v", got)
	}
	if got := from(ra, 2); !slices.Equal(got, []netip.AddrPort{b.LocalAddr()}) {
		t.Errorf("a heard from %v with c isolated", got)
	}

	n.Heal()
	exchange(3)
	if got := from(rc, 3); len(got) != 2 {
		t.Errorf("healed c heard from %v", got)
	}
	if got := n.Counters().Dropped; got != 2+4 {
		t.Errorf("Dropped = %d, want 6", got)
	}
	checkBalance(t, n)
}

func TestInjectDeliversArbitraryBytes(t *testing.T) {
	n, _ := manualNet(t, Config{Drop: 1})
	b, rb := startedLink(n)
	stranger := netip.MustParseAddrPort("192.0.2.1:4791")
	n.Partition(stranger, b.LocalAddr()) // Inject ignores partitions and loss

	garbage := []byte{0xde, 0xad, 0xbe, 0xef}
	valid := append(header(77), "body"...)
	truncated := append(header(78), "x"...) // header claims more than the base
	truncated = truncated[:wire.BaseLen-1]
	n.Inject(stranger, b.LocalAddr(), garbage)
	n.Inject(stranger, b.LocalAddr(), valid)
	n.Inject(stranger, b.LocalAddr(), truncated)
	n.Inject(stranger, netip.MustParseAddrPort("127.0.0.1:9"), garbage)
	n.Inject(stranger, b.LocalAddr(), make([]byte, DefaultMaxDatagram+1))
	n.Flush()

	// Like udplink: no Steer for a datagram whose header does not parse;
	// it is delivered whole as hdr with a nil payload.
	var got []string
	for _, e := range rb.allEvents() {
		if e.From != stranger {
			t.Errorf("event from %v", e.From)
		}
		switch {
		case e.Steer:
			got = append(got, "steer:"+strconv.Itoa(e.Len))
		case e.Nil:
			got = append(got, "deliver:nil")
		default:
			got = append(got, "deliver:"+e.Payload)
		}
	}
	want := []string{"deliver:nil", "steer:4", "deliver:body", "deliver:nil"}
	if !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	c := n.Counters()
	if c.Injected != 5 || c.Delivered != 3 || c.Malformed != 2 || c.Unroutable != 1 || c.Dropped != 2 {
		t.Errorf("counters %+v", c)
	}
	if st := b.Stats(); st.Truncated != 1 {
		t.Errorf("Truncated = %d, want 1", st.Truncated)
	}
	checkBalance(t, n)
}

func TestUnknownDestinationIsDroppedAndCounted(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, _ := startedLink(n)
	mustSend(t, a, packets(netip.MustParseAddrPort("127.0.0.1:1"), 0, 3))
	if c := a.Counters(); c.Sent != 3 || c.Unroutable != 3 || c.Dropped != 3 {
		t.Errorf("counters %+v", c)
	}
	checkBalance(t, n)
}

func TestSendRejectsOversizeDatagrams(t *testing.T) {
	n, _ := manualNet(t, Config{MaxDatagram: 100})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	if a.MaxDatagram() != 100 {
		t.Fatalf("MaxDatagram = %d", a.MaxDatagram())
	}
	pkts := packets(b.LocalAddr(), 0, 3)
	pkts[1].Payload = make([]byte, 100)
	err := a.Send(pkts)
	if !errors.Is(err, syscall.EMSGSIZE) {
		t.Fatalf("Send error %v, want EMSGSIZE", err)
	}
	n.Flush()
	if got := rb.psns(); !slices.Equal(got, []uint32{0, 2}) {
		t.Errorf("delivered %v, want the two that fit", got)
	}
	if st := a.Stats(); st.TxErrors != 1 || st.TxDatagrams != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestSendCopiesTheCallersBuffers(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	pkts := packets(b.LocalAddr(), 5, 1)
	mustSend(t, a, pkts)
	clear(pkts[0].Hdr)
	clear(pkts[0].Payload)
	n.Flush()
	if d := rb.deliveries(); len(d) != 1 || d[0].PSN != 5 || d[0].Payload != string(payloadFor(5)) {
		t.Errorf("delivered %+v", d)
	}
}

func TestScratchIsPoisonedAfterDeliver(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	var kept []byte
	rb.onDeliver = func(_ netip.AddrPort, _ wire.Header, payload []byte) { kept = payload }
	mustSend(t, a, packets(b.LocalAddr(), 0, 1))
	n.Flush()
	if len(kept) == 0 || kept[0] != poison {
		t.Errorf("retained payload reads %q after Deliver, want poison", kept)
	}
}

func TestSteerOfWrongLengthIsIgnored(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	rb.steer = func(uint32, int, int) []byte { return make([]byte, 1) }
	mustSend(t, a, packets(b.LocalAddr(), 0, 1))
	n.Flush()
	if d := rb.deliveries(); len(d) != 1 || d[0].Steered || d[0].Payload != string(payloadFor(0)) {
		t.Errorf("deliveries %+v, want one from scratch", d)
	}
	if c := b.Counters(); c.Steered != 0 {
		t.Errorf("Steered = %d", c.Steered)
	}
}

func TestQueueLimitDropsOverflow(t *testing.T) {
	n, _ := manualNet(t, Config{QueueLimit: 10})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	mustSend(t, a, packets(b.LocalAddr(), 0, 15))
	n.Flush()
	if got := rb.psns(); !slices.Equal(got, seq(0, 10)) {
		t.Errorf("delivered %v", got)
	}
	if c := n.Counters(); c.Overflow != 5 || c.Dropped != 5 {
		t.Errorf("counters %+v", c)
	}
}

func TestClosedLink(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	mustSend(t, a, packets(b.LocalAddr(), 0, 3))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := b.Send(packets(a.LocalAddr(), 0, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send on closed link: %v", err)
	}
	mustSend(t, a, packets(b.LocalAddr(), 3, 1))
	n.Flush()
	if len(rb.deliveries()) != 0 {
		t.Errorf("closed link received %v", rb.psns())
	}
	if c := a.Counters(); c.Dropped != 4 || c.Unroutable != 1 {
		t.Errorf("sender counters %+v", c)
	}
	checkBalance(t, n)

	// The address is free again: a device can come back there.
	b2, err := n.NewLinkAt(b.LocalAddr())
	if err != nil {
		t.Fatalf("NewLinkAt a closed link's address: %v", err)
	}
	rb2 := newRecorder(n.Clock())
	b2.Start(rb2)
	mustSend(t, a, packets(b.LocalAddr(), 9, 1))
	n.Flush()
	if got := rb2.psns(); !slices.Equal(got, []uint32{9}) {
		t.Errorf("restarted link got %v", got)
	}
}

func TestNewLinkAddresses(t *testing.T) {
	n, _ := manualNet(t, Config{})
	a, b := n.NewLink(), n.NewLink()
	if !a.LocalAddr().Addr().IsLoopback() || a.LocalAddr() == b.LocalAddr() {
		t.Errorf("addresses %v, %v", a.LocalAddr(), b.LocalAddr())
	}
	if _, err := n.NewLinkAt(a.LocalAddr()); err == nil {
		t.Errorf("NewLinkAt an address in use succeeded")
	}
	if _, err := n.NewLinkAt(netip.AddrPort{}); err == nil {
		t.Errorf("NewLinkAt an invalid address succeeded")
	}
	chosen := netip.MustParseAddrPort("127.0.0.1:20002")
	if _, err := n.NewLinkAt(chosen); err != nil {
		t.Fatal(err)
	}
	if c := n.NewLink(); c.LocalAddr() == chosen {
		t.Errorf("NewLink reused the chosen address %v", chosen)
	}
}

func TestCountersBalanceUnderAllFaults(t *testing.T) {
	n, clk := manualNet(t, Config{
		Seed: 3, Drop: 0.2, Dup: 0.2, Reorder: 0.2, Coalesce: 0.5,
		Delay: 10 * time.Microsecond, Jitter: 50 * time.Microsecond, QueueLimit: 50,
	})
	a, _ := startedLink(n)
	b, rb := startedLink(n)
	n.SetFilter(func(_, _ netip.AddrPort, h wire.Header, _ []byte) Verdict {
		return []Verdict{Pass, Pass, Pass, Dup, Delay(time.Millisecond)}[h.PSN%5]
	})
	for i := 0; i < 2000; i += 100 {
		mustSend(t, a, packets(b.LocalAddr(), uint32(i), 100))
		clk.Advance(30 * time.Microsecond)
	}
	clk.Advance(10 * time.Millisecond)
	rb.check(t)
	checkBalance(t, n)
	if c := n.Counters(); c.Overflow == 0 || c.Coalesced == 0 || c.Reordered == 0 {
		t.Errorf("scenario did not exercise every fault: %+v", c)
	}
}

func TestVerdictString(t *testing.T) {
	for v, want := range map[Verdict]string{
		Pass: "Pass", Drop: "Drop", Dup: "Dup", Delay(time.Second): "Delay(1s)", {kind: 99}: "Verdict(99)",
	} {
		if got := v.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

func TestMisusePanics(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		f()
	}
	n, _ := manualNet(t, Config{})
	l, _ := startedLink(n)
	mustPanic("second Start", func() { l.Start(newRecorder(n.Clock())) })
	n.Close()
	mustPanic("NewLink on a closed network", func() { n.NewLink() })
}
