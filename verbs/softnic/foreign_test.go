package softnic_test

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/udplink"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// These tests check the rule that a software NIC, like a real one, never
// places bytes of one packet where another packet's payload belongs: a
// datagram the receive path mis-predicts must not leave its bytes in
// memory that anyone can see (a region peers read, or the memory of a
// region a local program maps). Each test crafts the packets itself over
// real UDP, so that the mis-predicted datagram arrives exactly while the
// receiver predicts another packet.

// rawPeer is a UDP socket that speaks the wire format by hand.
type rawPeer struct {
	t    *testing.T
	conn *net.UDPConn
}

func newRawPeer(t *testing.T) *rawPeer {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetReadBuffer(16 << 20); err != nil {
		t.Fatal(err)
	}
	return &rawPeer{t: t, conn: c}
}

func (p *rawPeer) addr() netip.AddrPort { return p.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// send sends one datagram: h encoded, then payload.
func (p *rawPeer) send(to netip.AddrPort, h *wire.Header, payload []byte) {
	p.t.Helper()
	b := h.Append(nil)
	b = append(b, payload...)
	if _, err := p.conn.WriteToUDPAddrPort(b, to); err != nil {
		p.t.Fatal(err)
	}
}

// sendRaw sends b as one datagram.
func (p *rawPeer) sendRaw(to netip.AddrPort, b []byte) {
	p.t.Helper()
	if _, err := p.conn.WriteToUDPAddrPort(b, to); err != nil {
		p.t.Fatal(err)
	}
}

// recv returns the next datagram's header and payload.
func (p *rawPeer) recv() (wire.Header, []byte) {
	p.t.Helper()
	buf := make([]byte, 65536)
	for {
		_ = p.conn.SetReadDeadline(time.Now().Add(pollGuard))
		n, err := p.conn.Read(buf)
		if err != nil {
			p.t.Fatalf("raw peer: %v", err)
		}
		h, hl, err := wire.Parse(buf[:n])
		if err != nil {
			continue // a probe or a kick, not for us
		}
		return h, buf[hl:n]
	}
}

// waitStats waits until the device's counters satisfy cond (an event the
// test caused), then for the receive batch that counted it to end, so
// that the memory the batch wrote may be read. It waits at most pollGuard
// (a hang guard on a loaded machine, not a timing assumption). Polling the
// counters rather than the memory keeps the test's reads ordered after
// the NIC's writes (SyncMemory).
func waitStats(t *testing.T, d *softnic.Device, what string, cond func(verbs.DeviceStats) bool) {
	t.Helper()
	deadline := time.Now().Add(pollGuard)
	for !cond(d.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
	d.SyncMemory()
}

// foreignDatagrams are what can arrive while a receiver predicts the next
// packet of a message: another QP's packet (a READ request naming a
// secret region's address and rkey, a READ response full of another
// region's bytes), and bytes that are no packet at all.
func foreignDatagrams(secretRKey uint32, secret []byte) [][]byte {
	req := wire.Header{Op: wire.OpReadReq, Flags: wire.FlagDC, DestQP: 0x123456, SrcQP: 77, PSN: 5,
		DCKey: 0xdead, VA: 0x1000, RKey: secretRKey, DMALen: 4096, RespMTU: 1024}
	rsp := wire.Header{Op: wire.OpReadResp, DestQP: 0x654321, SrcQP: 78, PSN: 9, Syndrome: wire.SynAck}
	return [][]byte{
		req.Append(nil),
		append(rsp.Append(nil), secret...),
		append(bytes.Repeat([]byte{0xEE}, 64), secret...),
	}
}

// TestWriteTargetGetsNoForeignBytes: a WRITE message is half received
// (the receiver now expects its next packet), then datagrams of other
// QPs and junk arrive. The target region must hold only its old bytes and
// the WRITE's own, before and after the WRITE ends.
func TestWriteTargetGetsNoForeignBytes(t *testing.T) {
	checkLeaks(t)
	fb := newFabric(t, "udp", faults{})
	b := fb.node()
	const key = 0x5eed
	dct, _ := b.dct(key)
	secret := bytes.Repeat([]byte("SECRET!!"), 128) // 1 KiB
	w := newRawPeer(t)
	x := newRawPeer(t)

	const seg, off = 1024, 8192
	first := bytes.Repeat([]byte{'A'}, seg)
	last := bytes.Repeat([]byte{'B'}, seg)
	h := wire.Header{Op: wire.OpWrite, Flags: wire.FlagFirst | wire.FlagDC, DestQP: dct.QPN(), SrcQP: 9, PSN: 100,
		DCKey: key, SessionPSN: 100, VA: off, RKey: b.mr.RKey(), DMALen: 2 * seg}
	start := b.dev.Stats()
	w.send(b.dev.Addr(), &h, first)
	waitStats(t, b.dev, "the WRITE's first packet", func(s verbs.DeviceStats) bool { return s.RxPackets > start.RxPackets })
	if !bytes.Equal(b.mem[off:off+seg], first) {
		t.Fatal("the WRITE's first packet did not land")
	}
	b.dev.SyncMemory()

	before := b.dev.Stats()
	datagrams := foreignDatagrams(b.mr.RKey(), secret)
	for _, d := range datagrams {
		x.sendRaw(b.dev.Addr(), d)
	}
	waitStats(t, b.dev, "the foreign datagrams to be dropped", func(s verbs.DeviceStats) bool {
		return s.NoQP+s.Malformed >= before.NoQP+before.Malformed+uint64(len(datagrams))
	})
	if !allZero(b.mem[off+seg : off+2*seg]) {
		t.Fatalf("the WRITE's unreceived range holds foreign bytes: %q", firstNonZero(b.mem[off+seg:off+2*seg]))
	}

	b.dev.SyncMemory() // orders the reads above before the NIC's next writes
	h = wire.Header{Op: wire.OpWrite, Flags: wire.FlagLast | wire.FlagDC | wire.FlagAckReq, DestQP: dct.QPN(), SrcQP: 9, PSN: 101, DCKey: key, SessionPSN: 100}
	w.send(b.dev.Addr(), &h, last)
	if ack, _ := w.recv(); ack.Op != wire.OpAck || ack.Syndrome != wire.SynAck || ack.PSN != 101 {
		t.Fatalf("WRITE answered with %v %v PSN %d, want an ACK of PSN 101", ack.Op, ack.Syndrome, ack.PSN)
	}
	b.dev.SyncMemory()
	if !bytes.Equal(b.mem[off:off+seg], first) || !bytes.Equal(b.mem[off+seg:off+2*seg], last) {
		t.Fatal("the WRITE's bytes are not where it wrote them")
	}
	if !allZero(b.mem[:off]) || !allZero(b.mem[off+2*seg:]) {
		t.Fatal("bytes outside the WRITE changed")
	}
	if got := b.dev.Stats().WriteCopied; got < 2*seg {
		t.Errorf("WriteCopied = %d after a %d-byte WRITE, want at least %d: the copy is counted", got, 2*seg, 2*seg)
	}
}

// readLanding posts a 3-packet READ from a crafted responder into local
// memory registered with access, sends the foreign datagrams while the
// requester predicts the READ's responses, and returns what the landing
// memory held then and the requester once the real responses came.
func readLanding(t *testing.T, access verbs.Access) (during []byte, steered uint64) {
	t.Helper()
	fb := newFabric(t, "udp", faults{})
	l, err := udplink.Open(udplink.DefaultConfig("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	fb.open = func() link.Link { return l }
	a := fb.node()
	resp := newRawPeer(t)
	x := newRawPeer(t)
	local := make([]byte, 3*4096) // at least 3 responses on any path MTU
	lmr, err := a.pd.RegMR(local, access)
	if err != nil {
		t.Fatal(err)
	}
	dci := a.dci(patientTimeout)
	tgt := &verbs.DCTarget{Addr: resp.addr(), DCTN: 42, DCKey: 7}
	if err := dci.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Target: tgt,
		Local: verbs.SGE{MR: lmr, Length: uint32(len(local))}, RemoteAddr: 0, RKey: 99}}); err != nil {
		t.Fatal(err)
	}
	req, _ := resp.recv()
	if req.Op != wire.OpReadReq || req.RespMTU > 4096 {
		t.Fatalf("READ request %v with RespMTU %d, want a READ of responses of at most 4096 bytes", req.Op, req.RespMTU)
	}
	n := (len(local) + int(req.RespMTU) - 1) / int(req.RespMTU)
	// The first response: the requester now predicts the next ones.
	part := func(i int) []byte {
		lo := i * int(req.RespMTU)
		return bytes.Repeat([]byte{byte('a' + i)}, min(int(req.RespMTU), len(local)-lo))
	}
	rh := func(i int) *wire.Header {
		h := &wire.Header{Op: wire.OpReadResp, DestQP: req.SrcQP, SrcQP: req.DestQP, PSN: uint32(wire.PSN(req.PSN).Add(uint32(i))), Syndrome: wire.SynAck}
		if i == 0 {
			h.Flags |= wire.FlagFirst
		}
		if i == n-1 {
			h.Flags |= wire.FlagLast
		}
		return h
	}
	start := a.dev.Stats()
	resp.send(a.dev.Addr(), rh(0), part(0))
	waitStats(t, a.dev, "the first READ response", func(s verbs.DeviceStats) bool { return s.RxPackets > start.RxPackets })
	if local[0] != 'a' {
		t.Fatal("the first READ response did not land")
	}
	a.dev.SyncMemory()
	before := a.dev.Stats()
	secret := bytes.Repeat([]byte("SECRET!!"), 128)
	datagrams := foreignDatagrams(0x1234, secret)
	for _, d := range datagrams {
		x.sendRaw(a.dev.Addr(), d)
	}
	waitStats(t, a.dev, "the foreign datagrams to be dropped", func(s verbs.DeviceStats) bool {
		return s.NoQP+s.Malformed >= before.NoQP+before.Malformed+uint64(len(datagrams))
	})
	during = append([]byte(nil), local...)
	a.dev.SyncMemory() // orders that read before the NIC's next writes
	for i := 1; i < n; i++ {
		resp.send(a.dev.Addr(), rh(i), part(i))
	}
	wcs := poll(t, a.cq, 1, pollGuard)
	if wcs[0].Status != verbs.StatusSuccess {
		t.Fatalf("READ: %v", wcs[0].Status)
	}
	a.dev.SyncMemory()
	for i := range n {
		lo := i * int(req.RespMTU)
		if !bytes.Equal(local[lo:lo+len(part(i))], part(i)) {
			t.Fatalf("READ response %d is not where it belongs", i)
		}
	}
	return during, l.Counters().RxSteered
}

// TestReadIntoExportedMemoryGetsNoForeignBytes: a READ whose local buffer
// is remotely accessible (peers can read it while the READ runs) never
// gets a mis-predicted datagram's bytes.
func TestReadIntoExportedMemoryGetsNoForeignBytes(t *testing.T) {
	checkLeaks(t)
	during, _ := readLanding(t, verbs.AccessAll)
	if bytes.Contains(during, []byte("SECRET")) || bytes.IndexByte(during, 0xEE) >= 0 {
		t.Fatalf("remotely accessible READ buffer held foreign bytes while the READ ran: %q", firstNonZero(during[4096:]))
	}
	for i, c := range during[4096:] {
		if c != 0 {
			t.Fatalf("byte %d of the unreceived range is %#x, want the old 0", 4096+i, c)
		}
	}
}

// TestReadIntoPrivateMemoryStaysZeroCopy: a READ into memory only this
// node can reach still lands in place (the kernel's copy is the only
// one); a foreign datagram may land there while the READ runs, and the
// READ's own responses replace it before it completes.
func TestReadIntoPrivateMemoryStaysZeroCopy(t *testing.T) {
	checkLeaks(t)
	if _, steered := readLanding(t, verbs.AccessLocalWrite); steered == 0 {
		t.Fatal("no READ response landed in place in a private buffer (RxSteered 0)")
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// firstNonZero returns up to 32 bytes from the first non-zero byte of b.
func firstNonZero(b []byte) []byte {
	for i, c := range b {
		if c != 0 {
			return b[i:min(i+32, len(b))]
		}
	}
	return nil
}
