//go:build linux

package udplink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// All tests use real UDP on 127.0.0.1 only.
const loopback = "127.0.0.1:0"

// checkGoroutines fails the test if it leaves goroutines behind; call it
// first so that its cleanup runs after the links' Close.
func checkGoroutines(tb testing.TB) {
	before := runtime.NumGoroutine()
	tb.Cleanup(func() {
		deadline := time.Now().Add(time.Minute) // a hang guard: exits take long on a loaded machine
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<16)
				tb.Errorf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

func openLink(tb testing.TB, cfg Config) *Link {
	tb.Helper()
	l, err := Open(cfg)
	if err != nil {
		tb.Fatalf("Open(%+v): %v", cfg, err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// hdr encodes a header; extensions get fixed test values.
func hdr(op wire.Opcode, flags wire.Flags, psn uint32) []byte {
	h := wire.Header{Op: op, Flags: flags, DestQP: 7, SrcQP: 9, PSN: psn & wire.PSNMask, VA: 0x1000, RKey: 42, DMALen: 1 << 20, Imm: 0xABCD}
	return h.Append(nil)
}

// record is one Deliver as the collector saw it.
type record struct {
	from     netip.AddrPort
	hdr      []byte // copy
	payload  []byte // copy; nil if Deliver got nil
	psn      uint32
	inPlace  bool // payload was region's slot for psn
	nilPayld bool
}

// collector is a test Receiver. It steers packet psn+index into
// region[slot*(psn+index):] when steering is on and records every Deliver.
type collector struct {
	rxMu   sync.Mutex // the RxLock; also guards the fields below
	region []byte
	slot   int
	steer  bool

	steerCalls, maxIndex int
	recs                 []record
	n                    atomic.Int64 // deliveries, readable without rxMu
}

func newCollector(slots, slot int, steer bool) *collector {
	return &collector{region: make([]byte, slots*slot), slot: slot, steer: steer}
}

func (c *collector) RxLock()   { c.rxMu.Lock() }
func (c *collector) RxUnlock() { c.rxMu.Unlock() }

func (c *collector) Steer(from netip.AddrPort, h []byte, index, plen int) []byte {
	c.steerCalls++
	c.maxIndex = max(c.maxIndex, index)
	if n, err := wire.HeaderLen(h); err != nil || n != len(h) {
		panic("Steer got something other than exactly one base-valid header")
	}
	hd, _, err := wire.Parse(h)
	if err != nil {
		return nil // valid length, invalid fields: the receiver's problem
	}
	off := c.slot * (int(hd.PSN) + index)
	if !c.steer || plen > c.slot || off+plen > len(c.region) {
		return nil
	}
	return c.region[off : off+plen]
}

func (c *collector) Deliver(from netip.AddrPort, h, payload []byte) {
	r := record{from: from, hdr: bytes.Clone(h), nilPayld: payload == nil}
	if payload != nil {
		r.payload = append([]byte{}, payload...)
	}
	if hd, n, err := wire.Parse(h); err == nil && n == len(h) {
		r.psn = hd.PSN
		off := c.slot * int(hd.PSN)
		r.inPlace = len(payload) > 0 && off < len(c.region) && &payload[0] == &c.region[off]
	}
	c.recs = append(c.recs, r)
	c.n.Add(1)
}

// wait waits for n deliveries in total and returns all records.
func (c *collector) wait(tb testing.TB, n int) []record {
	tb.Helper()
	deadline := time.Now().Add(2 * time.Minute) // a hang guard, not a speed limit
	for c.n.Load() < int64(n) {
		if time.Now().After(deadline) {
			tb.Fatalf("got %d deliveries, want %d", c.n.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	return append([]record(nil), c.recs...)
}

// waitCounters returns l's counters once ready says they are.
func waitCounters(tb testing.TB, l *Link, ready func(Counters) bool) Counters {
	tb.Helper()
	deadline := time.Now().Add(2 * time.Minute) // a hang guard, not a speed limit
	for {
		s := l.Counters()
		if ready(s) {
			return s
		}
		if time.Now().After(deadline) {
			tb.Fatalf("counters never ready: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// checkRecords verifies that recs are pkts, in order, whole, and placed in
// the region when wantInPlace.
func checkRecords(t *testing.T, recs []record, pkts []link.Packet, from netip.AddrPort, wantInPlace bool) {
	t.Helper()
	if len(recs) != len(pkts) {
		t.Fatalf("got %d packets, want %d", len(recs), len(pkts))
	}
	for i, r := range recs {
		p := pkts[i]
		if r.from != from {
			t.Errorf("packet %d from %v, want %v", i, r.from, from)
		}
		if !bytes.Equal(r.hdr, p.Hdr) || !bytes.Equal(r.payload, p.Payload) {
			t.Errorf("packet %d: got hdr %d bytes payload %d bytes, want %d and %d (or contents differ)",
				i, len(r.hdr), len(r.payload), len(p.Hdr), len(p.Payload))
		}
		if r.inPlace != wantInPlace {
			t.Errorf("packet %d (psn %d): in place %v, want %v", i, r.psn, r.inPlace, wantInPlace)
		}
	}
}

func TestRoundTripSteersInPlace(t *testing.T) {
	checkGoroutines(t)
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := openLink(t, DefaultConfig(loopback)), openLink(t, DefaultConfig(loopback))
	ca, cb := newCollector(64, 2048, true), newCollector(64, 2048, true)
	a.Start(ca)
	b.Start(cb)

	for _, dir := range []struct {
		from, to *Link
		c        *collector
	}{{a, b, cb}, {b, a, ca}} {
		var pkts []link.Packet
		for i := range 8 {
			// Different lengths, so that GSO cannot group them.
			pkts = append(pkts, link.Packet{To: dir.to.LocalAddr(), Hdr: hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, uint32(i)), Payload: randBytes(rng, 1000+i)})
		}
		if err := dir.from.Send(pkts); err != nil {
			t.Fatal(err)
		}
		recs := dir.c.wait(t, len(pkts))
		checkRecords(t, recs, pkts, dir.from.LocalAddr(), true)
		for i, p := range pkts {
			if got := dir.c.region[i*2048 : i*2048+len(p.Payload)]; !bytes.Equal(got, p.Payload) {
				t.Errorf("payload %d not in the steered memory", i)
			}
		}
	}
	if s := b.Counters(); s.RxSteered != 8 || s.RxDatagrams != 8 || s.RxMalformed != 0 {
		t.Errorf("counters: %+v", s)
	}
}

func TestGSOBatchSteeredByIndex(t *testing.T) {
	for _, gro := range []bool{true, false} {
		name := map[bool]string{true: "GRO", false: "noGRO"}[gro]
		t.Run(name, func(t *testing.T) {
			checkGoroutines(t)
			rng := rand.New(rand.NewPCG(3, 4))
			a := openLink(t, DefaultConfig(loopback))
			cfg := DefaultConfig(loopback)
			cfg.GRO = gro
			b := openLink(t, cfg)
			cb := newCollector(64, 1024, true)
			b.Start(cb)

			var pkts []link.Packet
			for i := range 17 {
				n := 1000
				if i == 16 {
					n = 500
				}
				pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: hdr(wire.OpWrite, 0, uint32(i)), Payload: randBytes(rng, n)})
			}
			if err := a.Send(pkts); err != nil {
				t.Fatal(err)
			}
			recs := cb.wait(t, len(pkts))
			checkRecords(t, recs, pkts, a.LocalAddr(), true)

			ta, tb := a.Counters(), b.Counters()
			if ta.TxSyscalls != 1 || ta.TxGSOMessages != 1 || ta.TxDatagrams != 17 {
				t.Errorf("sender counters: %+v", ta)
			}
			if tb.RxSteered != 17 || tb.RxReassembled != 0 {
				t.Errorf("receiver counters: %+v", tb)
			}
			cb.rxMu.Lock()
			defer cb.rxMu.Unlock()
			if gro {
				if !tb.GRO || tb.RxBatches != 1 || cb.maxIndex != 16 || tb.RxSyscalls > 4 {
					t.Errorf("GRO: batches %d, max Steer index %d, rx syscalls %d, GRO %v", tb.RxBatches, cb.maxIndex, tb.RxSyscalls, tb.GRO)
				}
			} else if tb.RxBatches != 0 || cb.maxIndex != 0 {
				t.Errorf("no GRO: batches %d, max Steer index %d", tb.RxBatches, cb.maxIndex)
			}
		})
	}
}

// sendPair opens two loopback links, a and b, with b delivering to a
// steering collector of the given slots of 2 KiB, and a random source.
func sendPair(t *testing.T, seed uint64, slots int) (rng *rand.Rand, a, b *Link, cb *collector) {
	checkGoroutines(t)
	rng = rand.New(rand.NewPCG(seed, seed+1))
	a, b = openLink(t, DefaultConfig(loopback)), openLink(t, DefaultConfig(loopback))
	cb = newCollector(slots, 2048, true)
	b.Start(cb)
	return rng, a, b, cb
}

func TestGROMixedHeaderLengths(t *testing.T) {
	rng, a, b, cb := sendPair(t, 5, 64)

	const dgram = 1032 // every packet of both batches has this length
	mk := func(op wire.Opcode, f wire.Flags, psn int) link.Packet {
		h := hdr(op, f, uint32(psn))
		return link.Packet{To: b.LocalAddr(), Hdr: h, Payload: randBytes(rng, dgram-len(h))}
	}
	// Batch 1: a 32-byte header (RETH) first, so the prediction is too long
	// for the 16- and 20-byte headers after it.
	pkts := []link.Packet{mk(wire.OpWrite, wire.FlagFirst, 0)}
	for i := 1; i < 6; i++ {
		pkts = append(pkts, mk(wire.OpWrite, 0, i))
	}
	pkts = append(pkts, mk(wire.OpWrite, wire.FlagLast|wire.FlagImm, 6))
	// Batch 2: a 16-byte header first, a longer one last.
	pkts2 := []link.Packet{mk(wire.OpSend, wire.FlagFirst, 10), mk(wire.OpSend, 0, 11), mk(wire.OpSend, wire.FlagLast|wire.FlagImm, 12)}
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	if err := a.Send(pkts2); err != nil {
		t.Fatal(err)
	}
	recs := cb.wait(t, len(pkts)+len(pkts2))
	all := append(pkts, pkts2...)
	if len(recs) != len(all) {
		t.Fatalf("got %d packets, want %d", len(recs), len(all))
	}
	for i, r := range recs {
		if !bytes.Equal(r.hdr, all[i].Hdr) || !bytes.Equal(r.payload, all[i].Payload) {
			t.Errorf("packet %d: hdr %d bytes payload %d bytes, want %d and %d (or contents differ)", i, len(r.hdr), len(r.payload), len(all[i].Hdr), len(all[i].Payload))
		}
		wantInPlace := len(r.hdr) == len(all[0].Hdr) && i < len(pkts) || len(r.hdr) == 16 && i >= len(pkts)
		if r.inPlace != wantInPlace {
			t.Errorf("packet %d (hdr %d bytes): in place %v, want %v", i, len(r.hdr), r.inPlace, wantInPlace)
		}
	}
	s := b.Counters()
	if a.Counters().TxGSOMessages != 2 || s.RxBatches != 2 {
		t.Fatalf("expected two GSO/GRO batches: tx %+v rx %+v", a.Counters(), s)
	}
	if want := uint64(len(pkts) - 1 + 1); s.RxReassembled != want {
		t.Errorf("RxReassembled = %d, want %d", s.RxReassembled, want)
	}
}

func TestMalformedDeliveredRaw(t *testing.T) {
	checkGoroutines(t)
	b := openLink(t, DefaultConfig(loopback))
	cb := newCollector(16, 2048, true)
	b.Start(cb)
	pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(loopback)))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	from := pc.LocalAddr().(*net.UDPAddr).AddrPort()

	rng := rand.New(rand.NewPCG(7, 8))
	base := hdr(wire.OpSend, 0, 1)
	badMagic := bytes.Clone(base)
	badMagic[0] = 0
	badVersion := bytes.Clone(base)
	badVersion[1] = wire.Version + 1
	badOp := bytes.Clone(base)
	badOp[2] = 0xEE
	short := hdr(wire.OpWrite, wire.FlagFirst, 1)[:20] // claims 32 header bytes
	garbage := randBytes(rng, 100)
	garbage[0] = 0x00
	bad := [][]byte{{}, {1, 2, 3}, badMagic, badVersion, badOp, short, garbage}
	for _, d := range bad {
		if _, err := pc.WriteToUDPAddrPort(d, b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	recs := cb.wait(t, len(bad))
	for i, r := range recs {
		if r.from != from || !bytes.Equal(r.hdr, bad[i]) || !r.nilPayld {
			t.Errorf("datagram %d: from %v hdr %x nil payload %v; want raw %x", i, r.from, r.hdr, r.nilPayld, bad[i])
		}
	}
	// The counters are added after the batch's deliveries.
	if s := waitCounters(t, b, func(s Counters) bool { return s.RxMalformed >= uint64(len(bad)) }); s.RxMalformed != uint64(len(bad)) {
		t.Errorf("RxMalformed = %d, want %d", s.RxMalformed, len(bad))
	}
	// A receive-path probe is delivered raw too, but counted as a probe.
	probe := append([]byte(link.ProbeTag), make([]byte, 16)...)
	if _, err := pc.WriteToUDPAddrPort(probe, b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if r := cb.wait(t, len(bad)+1)[len(bad)]; !bytes.Equal(r.hdr, probe) || !r.nilPayld {
		t.Errorf("probe delivered as hdr %x nil payload %v; want raw %x", r.hdr, r.nilPayld, probe)
	}
	if s := waitCounters(t, b, func(s Counters) bool { return s.RxProbes+s.RxMalformed > uint64(len(bad)) }); s.RxMalformed != uint64(len(bad)) || s.RxProbes != 1 {
		t.Errorf("after a probe: RxMalformed = %d, RxProbes = %d; want %d, 1", s.RxMalformed, s.RxProbes, len(bad))
	}

	// A GRO batch of garbage segments: no Steer call, each segment raw.
	a := openLink(t, DefaultConfig(loopback))
	var pkts []link.Packet
	for range 5 {
		h := bytes.Repeat([]byte{0xFF}, 16)
		pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: h, Payload: randBytes(rng, 100)})
	}
	cb.rxMu.Lock()
	calls := cb.steerCalls
	cb.rxMu.Unlock()
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	recs = cb.wait(t, len(bad)+1+len(pkts))[len(bad)+1:] // after the probe
	for i, r := range recs {
		if want := append(bytes.Clone(pkts[i].Hdr), pkts[i].Payload...); !bytes.Equal(r.hdr, want) || !r.nilPayld {
			t.Errorf("garbage segment %d not delivered raw", i)
		}
	}
	cb.rxMu.Lock()
	if cb.steerCalls != calls {
		t.Errorf("Steer called %d times for garbage", cb.steerCalls-calls)
	}
	cb.rxMu.Unlock()

	// Random datagrams, some with a plausible first two bytes: no crash,
	// every one delivered.
	n := len(bad) + 1 + len(pkts)
	for i := range 300 {
		d := randBytes(rng, rng.IntN(1500))
		if len(d) > 2 && i%2 == 0 {
			d[0], d[1] = wire.Magic, wire.Version
		}
		if _, err := pc.WriteToUDPAddrPort(d, b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		n++
		if i%50 == 0 {
			cb.wait(t, n) // stay far from the socket buffer
		}
	}
	cb.wait(t, n)

	// Still healthy.
	ok := []link.Packet{{To: b.LocalAddr(), Hdr: hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, 3), Payload: []byte("still alive")}}
	if err := a.Send(ok); err != nil {
		t.Fatal(err)
	}
	recs = cb.wait(t, n+1)
	if r := recs[n]; !bytes.Equal(r.payload, ok[0].Payload) || !r.inPlace {
		t.Errorf("valid packet after garbage: %+v", r)
	}
}

func TestCloseUnblocksAndLeavesNoGoroutine(t *testing.T) {
	checkGoroutines(t)
	a := openLink(t, DefaultConfig(loopback))
	b := openLink(t, DefaultConfig(loopback))
	cb := newCollector(4, 64, false)
	b.Start(cb)
	a.Start(newCollector(4, 64, false))
	if err := a.Send([]link.Packet{{To: b.LocalAddr(), Hdr: hdr(wire.OpAck, 0, 1)}}); err != nil {
		t.Fatal(err)
	}
	cb.wait(t, 1)
	time.Sleep(10 * time.Millisecond) // let the receiver block again

	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Close wakes the blocked receiver itself (there is no receive
	// timeout to wait out): only a hang takes this long.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := b.Send([]link.Packet{{To: a.LocalAddr(), Hdr: hdr(wire.OpAck, 0, 1)}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Send after Close: %v, want ErrClosed", err)
	}
	// Sending to the closed link's port is harmless.
	if err := a.Send([]link.Packet{{To: b.LocalAddr(), Hdr: hdr(wire.OpAck, 0, 1)}}); err != nil {
		t.Errorf("send to closed port: %v", err)
	}

	// Close without Start, and Start after Close.
	c := openLink(t, DefaultConfig(loopback))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c.Start(newCollector(1, 1, false))

	// Close while other goroutines send as fast as they can.
	d := openLink(t, DefaultConfig(loopback))
	d.Start(&signaller{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := []link.Packet{{To: d.LocalAddr(), Hdr: hdr(wire.OpAck, 0, 1)}}
			for d.Send(p) == nil {
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func TestOpenErrors(t *testing.T) {
	a := openLink(t, DefaultConfig(loopback))
	addr := a.LocalAddr().String()
	_, err := Open(DefaultConfig(addr))
	if !errors.Is(err, unix.EADDRINUSE) || !strings.Contains(err.Error(), addr) {
		t.Errorf("Open of a used address: %v; want EADDRINUSE naming %s", err, addr)
	}
	for _, bad := range []string{"", "localhost:0", "127.0.0.1", "300.0.0.1:1", "[fe80::1%lo]:0"} {
		if _, err := Open(DefaultConfig(bad)); !errors.Is(err, ErrBadAddress) {
			t.Errorf("Open(%q): %v, want ErrBadAddress", bad, err)
		}
	}
}

func TestMaxDatagram(t *testing.T) {
	for _, c := range []struct {
		addr string
		want int
	}{{"127.0.0.1", 65507}, {"0.0.0.0", 65507}, {"::", 65507}, {"::1", 65527}, {"2001:db8::1", 65527}} {
		if got := maxDatagramFor(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("maxDatagramFor(%s) = %d, want %d", c.addr, got, c.want)
		}
	}

	checkGoroutines(t)
	a, b := openLink(t, DefaultConfig(loopback)), openLink(t, DefaultConfig(loopback))
	if a.MaxDatagram() != MaxDatagramIPv4 {
		t.Errorf("MaxDatagram = %d", a.MaxDatagram())
	}
	cb := newCollector(1, 1<<16, true)
	b.Start(cb)
	h := hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, 0)
	big := []link.Packet{{To: b.LocalAddr(), Hdr: h, Payload: randBytes(rand.New(rand.NewPCG(1, 1)), a.MaxDatagram()-len(h))}}
	if err := a.Send(big); err != nil {
		t.Fatal(err)
	}
	checkRecords(t, cb.wait(t, 1), big, a.LocalAddr(), true)
	tooBig := []link.Packet{{To: b.LocalAddr(), Hdr: h, Payload: make([]byte, a.MaxDatagram()-len(h)+1)}}
	if err := a.Send(tooBig); !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("oversized Send: %v, want EMSGSIZE", err)
	}
	if s := a.Stats(); s.TxErrors != 1 {
		t.Errorf("TxErrors = %d, want 1", s.TxErrors)
	}
}

// TestGSORejected makes the kernel refuse GSO: with SO_NO_CHECK set, a
// UDP_SEGMENT send fails with EINVAL while plain sends work.
func TestGSORejected(t *testing.T) {
	checkGoroutines(t)
	rng := rand.New(rand.NewPCG(9, 9))
	a, b := openLink(t, DefaultConfig(loopback)), openLink(t, DefaultConfig(loopback))
	if err := unix.SetsockoptInt(a.fd, unix.SOL_SOCKET, unix.SO_NO_CHECK, 1); err != nil {
		t.Skipf("SO_NO_CHECK: %v", err)
	}
	cb := newCollector(16, 1024, true)
	b.Start(cb)
	var pkts []link.Packet
	for i := range 4 {
		pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: hdr(wire.OpWrite, 0, uint32(i)), Payload: randBytes(rng, 600)})
	}
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	checkRecords(t, cb.wait(t, 4), pkts, a.LocalAddr(), true)
	s := a.Counters()
	if s.GSOFallbacks != 1 || s.GSOMaxSegment != pkts[0].Len()-1 || s.TxGSOMessages != 0 || s.TxDatagrams != 4 {
		t.Fatalf("after rejection: %+v", s)
	}
	// Same size again: no GSO attempt.
	for i := range pkts {
		pkts[i].Hdr = hdr(wire.OpWrite, 0, uint32(4+i))
	}
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	checkRecords(t, cb.wait(t, 8)[4:], pkts, a.LocalAddr(), true)
	if s := a.Counters(); s.GSOFallbacks != 1 || s.TxSyscalls != 1+4+1 {
		t.Errorf("second send: %+v", s)
	}

	a.restrictGSO(unix.EIO, 100)
	if s := a.Counters(); s.GSO || s.GSOMaxSegment != 0 {
		t.Errorf("after EIO GSO still on: %+v", s)
	}
}

// signaller is an allocation-free receiver that steers into one buffer and
// signals every want deliveries.
type signaller struct {
	dst  []byte
	want atomic.Int64 // set by the test between rounds
	got  int64
	done chan struct{}
}

func (s *signaller) RxLock()   {}
func (s *signaller) RxUnlock() {}
func (s *signaller) Steer(_ netip.AddrPort, _ []byte, i, n int) []byte {
	if (i+1)*n > len(s.dst) {
		return nil
	}
	return s.dst[i*n : (i+1)*n]
}
func (s *signaller) Deliver(netip.AddrPort, []byte, []byte) {
	if s.got++; s.got == s.want.Load() {
		s.got = 0
		s.done <- struct{}{}
	}
}

func TestSteadyStateDoesNotAllocate(t *testing.T) {
	checkGoroutines(t)
	a, b := openLink(t, DefaultConfig(loopback)), openLink(t, DefaultConfig(loopback))
	var pkts []link.Packet
	for i := range 17 {
		pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: hdr(wire.OpWrite, 0, uint32(i)), Payload: make([]byte, 1000)})
	}
	single := pkts[:1]
	s := &signaller{dst: make([]byte, 17*1000), done: make(chan struct{}, 1)}
	b.Start(s)
	for _, c := range []struct {
		name string
		pkts []link.Packet
	}{{"single", single}, {"GSO batch", pkts}} {
		s.want.Store(int64(len(c.pkts)))
		allocs := testing.AllocsPerRun(200, func() {
			if err := a.Send(c.pkts); err != nil {
				t.Fatal(err)
			}
			<-s.done
		})
		if allocs > 0.1 {
			t.Errorf("%s: %.2f allocations per send+receive", c.name, allocs)
		}
	}
}

// BenchmarkPingPong8B bounces one 8-byte-payload packet between two links;
// one op is one round trip. The ping-pong runs inside the links' receive
// goroutines, as a protocol engine's would.
func BenchmarkPingPong8B(b *testing.B) {
	x, y := openLink(b, DefaultConfig(loopback)), openLink(b, DefaultConfig(loopback))
	h := hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, 0)
	toY := []link.Packet{{To: y.LocalAddr(), Hdr: h, Payload: make([]byte, 8)}}
	toX := []link.Packet{{To: x.LocalAddr(), Hdr: h, Payload: make([]byte, 8)}}
	done := make(chan struct{}, 1)
	var left atomic.Int64 // round trips to go
	x.Start(&echo{dst: make([]byte, 8), fn: func() {
		if left.Add(-1) > 0 {
			x.Send(toY)
		} else {
			done <- struct{}{}
		}
	}})
	y.Start(&echo{dst: make([]byte, 8), fn: func() { y.Send(toX) }})
	left.Store(1)
	x.Send(toY) // warm up
	<-done
	b.ReportAllocs()
	b.ResetTimer()
	left.Store(int64(b.N))
	x.Send(toY)
	select {
	case <-done:
	case <-time.After(time.Duration(b.N)*time.Millisecond + 5*time.Second):
		b.Fatal("ping-pong stalled (packet lost?)")
	}
	b.StopTimer()
	s := x.Stats()
	b.ReportMetric(float64(s.RxSyscalls)/float64(s.RxDatagrams), "rxsyscalls/pkt")
}

// echo is a receiver that steers into dst and calls fn per delivery.
type echo struct {
	dst []byte
	fn  func()
}

func (e *echo) RxLock()   {}
func (e *echo) RxUnlock() {}
func (e *echo) Steer(_ netip.AddrPort, _ []byte, i, n int) []byte {
	if i == 0 && n == len(e.dst) {
		return e.dst
	}
	return nil
}
func (e *echo) Deliver(netip.AddrPort, []byte, []byte) { e.fn() }

// bulkSink receives 1 MiB transfers of 8 KiB packets, each steered into
// its place in dst by PSN, and signals when a transfer is complete.
type bulkSink struct {
	dst  []byte
	seen [bulkPkts / 64]uint64
	got  int
	done chan struct{}
}

const (
	bulkPayload = 8192
	bulkPkts    = 1 << 20 / bulkPayload
)

func (s *bulkSink) RxLock()   {}
func (s *bulkSink) RxUnlock() {}
func (s *bulkSink) Steer(_ netip.AddrPort, h []byte, i, n int) []byte {
	psn := (int(binary.BigEndian.Uint32(h[12:])) + i) % bulkPkts
	if n != bulkPayload {
		return nil
	}
	return s.dst[psn*bulkPayload : (psn+1)*bulkPayload]
}
func (s *bulkSink) Deliver(_ netip.AddrPort, h, p []byte) {
	psn := int(binary.BigEndian.Uint32(h[12:])) % bulkPkts
	if len(p) != bulkPayload || s.seen[psn/64]&(1<<(psn%64)) != 0 {
		return
	}
	s.seen[psn/64] |= 1 << (psn % 64)
	if s.got++; s.got == bulkPkts {
		s.got, s.seen = 0, [bulkPkts / 64]uint64{}
		s.done <- struct{}{}
	}
}

// BenchmarkBulk1MiB sends 1 MiB per op as 128 packets of 8 KiB payload,
// which GSO groups 7 to a message, into steered memory; the receiver
// signals once per MiB. A transfer that loses a packet is resent whole.
func BenchmarkBulk1MiB(b *testing.B) {
	for _, m := range []struct {
		name     string
		gso, gro bool
	}{{"GSO+GRO", true, true}, {"GSO", true, false}, {"plain", false, false}} {
		b.Run(m.name, func(b *testing.B) {
			cx, cy := DefaultConfig(loopback), DefaultConfig(loopback)
			cx.GSO, cy.GRO = m.gso, m.gro
			x, y := openLink(b, cx), openLink(b, cy)
			sink := &bulkSink{dst: make([]byte, 1<<20), done: make(chan struct{}, 1)}
			y.Start(sink)
			src := make([]byte, 1<<20)
			pkts := make([]link.Packet, bulkPkts)
			for i := range pkts {
				pkts[i] = link.Packet{To: y.LocalAddr(), Hdr: hdr(wire.OpWrite, 0, uint32(i)), Payload: src[i*bulkPayload : (i+1)*bulkPayload]}
			}
			resends := 0
			timeout := time.NewTimer(time.Hour)
			b.SetBytes(1 << 20)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for {
					x.Send(pkts)
					timeout.Reset(200 * time.Millisecond)
					select {
					case <-sink.done:
					case <-timeout.C:
						resends++
						continue
					}
					break
				}
			}
			timeout.Stop()
			b.StopTimer()
			xs, ys := x.Stats(), y.Stats()
			b.ReportMetric(float64(resends), "resends")
			b.ReportMetric(float64(xs.TxSyscalls)/float64(b.N), "txsyscalls/op")
			b.ReportMetric(float64(ys.RxSyscalls)/float64(b.N), "rxsyscalls/op")
		})
	}
}

// rawSocket is a blocking UDP socket on 127.0.0.1 for the baselines.
func rawSocket(tb testing.TB) (int, *unix.SockaddrInet4) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	tb.Cleanup(func() { unix.Close(fd) })
	return fd, sa.(*unix.SockaddrInet4)
}

// rawRecv is recvfrom(2) without the netpoller, retrying EINTR.
func rawRecv(fd int, b []byte) (int, error) {
	for {
		n, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// BenchmarkBaselineRawPingPong8B is the raw-socket baseline (docs/machine-notes.md) for
// BenchmarkPingPong8B: blocking sockets, one recvfrom and one sendto per
// hop, no framing.
func BenchmarkBaselineRawPingPong8B(b *testing.B) {
	x, xa := rawSocket(b)
	y, ya := rawSocket(b)
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := rawRecv(y, buf)
			if err != nil || n == 0 {
				return
			}
			unix.Sendto(y, buf[:n], 0, xa)
		}
	}()
	b.Cleanup(func() { unix.Shutdown(y, unix.SHUT_RDWR) })
	msg := make([]byte, 24)
	buf := make([]byte, 64)
	b.ResetTimer()
	for range b.N {
		unix.Sendto(x, msg, 0, ya)
		rawRecv(x, buf)
	}
}

// BenchmarkBaselineRawBulk1MiB is the raw-socket baseline (docs/machine-notes.md) for
// BenchmarkBulk1MiB: 1 MiB as 16 datagrams of 64 KiB minus headers, sent
// with sendto and received with recvfrom straight into place.
func BenchmarkBaselineRawBulk1MiB(b *testing.B) {
	x, _ := rawSocket(b)
	y, ya := rawSocket(b)
	const seg = 65536 - 64
	nseg := (1<<20 + seg - 1) / seg
	done := make(chan struct{}, 1)
	go func() {
		dst := make([]byte, 1<<20+64)
		got := 0
		for {
			n, err := rawRecv(y, dst[got%(1<<20):])
			if err != nil || n == 0 {
				return
			}
			if got += n; got >= 1<<20 {
				got = 0
				done <- struct{}{}
			}
		}
	}()
	b.Cleanup(func() { unix.Shutdown(y, unix.SHUT_RDWR) })
	src := make([]byte, 1<<20)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for range b.N {
		for i := range nseg {
			unix.Sendto(x, src[i*seg:min((i+1)*seg, len(src))], 0, ya)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			b.Fatal("raw bulk lost a datagram")
		}
	}
}

// TestSendShapes sends a lone header (sendto), a lone header with payload
// (sendmsg) and a batch of three (sendmmsg): one system call each, every
// byte delivered and counted; and a lone header too large for a datagram
// fails loudly on the sendto path. Over IPv4 and, where the host has it,
// IPv6 loopback (the socket address differs in size).
func TestSendShapes(t *testing.T) {
	checkGoroutines(t)
	for _, addr := range []string{loopback, "[::1]:0"} {
		t.Run(addr, func(t *testing.T) {
			a, err := Open(DefaultConfig(addr))
			if err != nil && addr != loopback && errors.Is(err, unix.EADDRNOTAVAIL) {
				t.Skipf("no IPv6 loopback here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { a.Close() })
			b := openLink(t, DefaultConfig(addr))
			checkSendShapes(t, a, b)
		})
	}
}

func checkSendShapes(t *testing.T, a, b *Link) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 8))
	cb := newCollector(8, 2048, false) // nothing in place: the records hold every byte
	b.Start(cb)
	to := b.LocalAddr()
	pkt := func(psn uint32, payload int) link.Packet {
		p := link.Packet{To: to, Hdr: hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, psn)}
		if payload > 0 {
			p.Payload = randBytes(rng, payload)
		}
		return p
	}
	sends := [][]link.Packet{
		{pkt(0, 0)},
		{pkt(1, 100)},
		{pkt(2, 10), pkt(3, 20), pkt(4, 30)}, // different lengths: no GSO run
	}
	var all []link.Packet
	var bytes uint64
	for i, pkts := range sends {
		before := a.Stats()
		if err := a.Send(pkts); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		var n uint64
		for _, p := range pkts {
			n += uint64(p.Len())
		}
		after := a.Stats()
		if d := after.TxSyscalls - before.TxSyscalls; d != 1 {
			t.Errorf("send %d (%d packets): %d system calls, want 1", i, len(pkts), d)
		}
		if d := after.TxDatagrams - before.TxDatagrams; d != uint64(len(pkts)) {
			t.Errorf("send %d: %d datagrams counted, want %d", i, d, len(pkts))
		}
		if d := after.TxBytes - before.TxBytes; d != n {
			t.Errorf("send %d: %d bytes counted, want %d", i, d, n)
		}
		all = append(all, pkts...)
		bytes += n
	}
	checkRecords(t, cb.wait(t, len(all)), all, a.LocalAddr(), false)
	if s := b.Stats(); s.RxBytes != bytes {
		t.Errorf("received %d bytes, want %d", s.RxBytes, bytes)
	}

	huge := []link.Packet{{To: to, Hdr: make([]byte, a.MaxDatagram()+1)}}
	if err := a.Send(huge); !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("a lone header over the datagram limit: %v, want EMSGSIZE", err)
	}
	if s := a.Counters(); s.TxErrors != 1 || s.TooBig != 1 {
		t.Errorf("after EMSGSIZE: TxErrors %d, TooBig %d, want 1 and 1", s.TxErrors, s.TooBig)
	}
}
