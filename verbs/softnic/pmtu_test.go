package softnic_test

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/vethpair"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/udplink"
)

// transferAndCheck READs and WRITEs half a MiB each way between a and b
// over RC and checks every byte.
func transferAndCheck(t *testing.T, a, b *node) {
	t.Helper()
	qa, _ := connect(t, a, b, 50*time.Millisecond)
	rng := rand.New(rand.NewPCG(5, 6))
	const half = memSize / 2
	for i := range b.mem {
		b.mem[i] = byte(rng.Uint32())
	}
	b.dev.SyncMemory()
	post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, half), RemoteAddr: 0, RKey: b.mr.RKey()})
	for i := half; i < memSize; i++ {
		a.mem[i] = byte(rng.Uint32())
	}
	post(t, qa, verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: sge(a, half, half), RemoteAddr: half, RKey: b.mr.RKey()})
	for _, wc := range poll(t, a.cq, 2, 10*time.Second) {
		if wc.Status != verbs.StatusSuccess {
			t.Fatalf("WR %d: %v", wc.ID, wc.Status)
		}
	}
	b.dev.SyncMemory()
	if !bytes.Equal(a.mem[:half], b.mem[:half]) {
		t.Error("READ brought wrong bytes")
	}
	if !bytes.Equal(a.mem[half:], b.mem[half:]) {
		t.Error("WRITE left wrong bytes")
	}
}

// TestPathMTUVethTransfers moves bulk data across a 1500-byte veth: the
// packets are cut to the path MTU (about 1448 bytes of READ payload, not
// the QP's 4096), the bytes are right, and no IP fragment is created on
// either host.
func TestPathMTUVethTransfers(t *testing.T) {
	checkLeaks(t)
	p := vethpair.New(t, 1500)
	addrs := []netip.Addr{p.AddrA, p.AddrB}
	n := 0
	fb := &fabric{name: "veth", t: t}
	fb.open = func() link.Link {
		i := n % 2
		n++
		var l *udplink.Link
		if err := p.Do(i, func() (err error) {
			l, err = udplink.Open(udplink.DefaultConfig(netip.AddrPortFrom(addrs[i], 0).String()))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := fb.node(), fb.node()
	frags := func() [2]uint64 {
		var f [2]uint64
		for i := range f {
			v, err := p.FragCreates(i)
			if err != nil {
				t.Fatal(err)
			}
			f[i] = v
		}
		return f
	}
	before := frags()
	transferAndCheck(t, a, b)
	if after := frags(); after != before {
		t.Errorf("Ip FragCreates moved: %v -> %v", before, after)
	}
	// READ responses carry at most 1472-24 bytes: 512 KiB needs at least
	// 363 of them (it would be 128 at the QP's 4096).
	if got := a.dev.Stats().RxPackets; got < 363 {
		t.Errorf("the READ's responses arrived in %d packets: not cut to the path MTU", got)
	}
}

// TestPathMTULoopbackTransfers is the same over loopback, whose MTU lets
// the QP keep its 4096-byte packets.
func TestPathMTULoopbackTransfers(t *testing.T) {
	checkLeaks(t)
	fb := newFabric(t, "udp", faults{})
	a, b := fb.node(), fb.node()
	transferAndCheck(t, a, b)
	// The READ's 4096-byte responses and the WRITE's ACKs (at most one per
	// packet) average over 2 KiB a packet; packets cut to an Ethernet path
	// MTU would average under 1500 bytes. (A count of packets is no test:
	// under load a 50 ms ACK timeout resends the READ's responses.)
	s := a.dev.Stats()
	if avg := s.RxBytes / max(s.RxPackets, 1); avg < 1800 {
		t.Errorf("%d packets, %d bytes for a 512 KiB READ on loopback (%d bytes each): the path MTU was cut", s.RxPackets, s.RxBytes, avg)
	}
}
