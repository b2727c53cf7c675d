//go:build linux

package udplink

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/internal/vethpair"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

func TestPathMTULoopback(t *testing.T) {
	l := openLink(t, DefaultConfig(loopback))
	to := netip.MustParseAddrPort("127.0.0.1:9")
	if got := l.MaxDatagramTo(to); got != MaxDatagramIPv4 {
		t.Errorf("MaxDatagramTo(loopback) = %d, want %d (loopback MTU 65536)", got, MaxDatagramIPv4)
	}
	l.MaxDatagramTo(to)
	if c := l.Counters(); c.PMTUProbes != 1 {
		t.Errorf("PMTUProbes = %d after two look-ups of one destination, want 1 (cached)", c.PMTUProbes)
	}
}

// TestPathMTUVeth runs two links in two namespaces joined by a veth of MTU
// 1500: each learns 1472 bytes for the other, a datagram that fits (also
// in a GSO run) arrives whole, one byte more fails loudly with EMSGSIZE and
// is counted, and no IP fragment is ever created.
func TestPathMTUVeth(t *testing.T) {
	checkGoroutines(t)
	p := vethpair.New(t, 1500)
	var a, b *Link
	if err := p.Do(0, func() (err error) {
		a, err = Open(DefaultConfig(netip.AddrPortFrom(p.AddrA, 0).String()))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := p.Do(1, func() (err error) {
		b, err = Open(DefaultConfig(netip.AddrPortFrom(p.AddrB, 0).String()))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	cb := newCollector(64, 2048, true)
	b.Start(cb)
	a.Start(newCollector(1, 1, false))

	const want = 1500 - 20 - 8
	if got := a.MaxDatagramTo(b.LocalAddr()); got != want {
		t.Fatalf("MaxDatagramTo across the veth = %d, want %d", got, want)
	}
	frag0, err := p.FragCreates(0)
	if err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(3, 4))
	h := hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, 0)
	plen := want - len(h)
	var pkts []link.Packet
	for i := range 16 { // equal lengths: one GSO message of 16 segments
		pkts = append(pkts, link.Packet{To: b.LocalAddr(), Hdr: hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, uint32(i)), Payload: randBytes(rng, plen)})
	}
	if err := a.Send(pkts); err != nil {
		t.Fatalf("sending datagrams that fit: %v", err)
	}
	recs := cb.wait(t, len(pkts))
	for i, r := range recs {
		if !bytes.Equal(r.payload, pkts[i].Payload) {
			t.Fatalf("packet %d damaged", i)
		}
	}

	big := []link.Packet{{To: b.LocalAddr(), Hdr: h, Payload: randBytes(rng, plen+1)}}
	err = a.Send(big)
	if !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("sending one byte over the path MTU: err = %v, want EMSGSIZE", err)
	}
	if c := a.Counters(); c.TooBig != 1 {
		t.Errorf("TooBig = %d, want 1", c.TooBig)
	}
	// The cache was dropped: the next look-up probes again.
	probes := a.Counters().PMTUProbes
	if got := a.MaxDatagramTo(b.LocalAddr()); got != want || a.Counters().PMTUProbes != probes+1 {
		t.Errorf("after EMSGSIZE: MaxDatagramTo = %d with %d probes (had %d), want %d after a new probe", got, a.Counters().PMTUProbes, probes, want)
	}
	frag1, err := p.FragCreates(0)
	if err != nil {
		t.Fatal(err)
	}
	if frag1 != frag0 {
		t.Errorf("Ip FragCreates moved from %d to %d: a datagram was fragmented", frag0, frag1)
	}
}

// The path MTU cache stays bounded however many destinations a link
// meets (a node answers senders it did not choose), and a destination
// evicted is probed again, not lost.
func TestPathMTUCacheBounded(t *testing.T) {
	l := openLink(t, DefaultConfig(loopback))
	first := netip.MustParseAddrPort("127.0.0.1:9")
	l.MaxDatagramTo(first)
	for i := range maxPMTUEntries + 100 {
		a := netip.AddrFrom4([4]byte{127, byte(1 + i>>16), byte(i >> 8), byte(i)})
		if got := l.MaxDatagramTo(netip.AddrPortFrom(a, 9)); got != MaxDatagramIPv4 {
			t.Fatalf("MaxDatagramTo(%v) = %d, want %d", a, got, MaxDatagramIPv4)
		}
	}
	l.pmtu.mu.RLock()
	n := len(l.pmtu.m)
	l.pmtu.mu.RUnlock()
	if n > maxPMTUEntries {
		t.Fatalf("path MTU cache holds %d destinations, bound %d", n, maxPMTUEntries)
	}
	if got := l.MaxDatagramTo(first); got != MaxDatagramIPv4 {
		t.Fatalf("MaxDatagramTo of a destination met long ago = %d", got)
	}
}
