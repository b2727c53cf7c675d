package softnic_test

import (
	"testing"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestReadShapesBounded: a crafted READ request cannot make the responder
// queue more than a bounded number of packets. Responses smaller than any
// requester asks for are refused with an invalid-request NAK, as a NIC
// refuses a malformed request; a READ of many small responses leaves in
// sends of at most ServeBatch packets.
func TestReadShapesBounded(t *testing.T) {
	checkLeaks(t)
	fb := newFabric(t, "udp", faults{})
	b := fb.node()
	const key = 0xbeef
	dct, _ := b.dct(key)
	p := newRawPeer(t)
	psn := uint32(10)
	read := func(respMTU, length uint32) wire.Header {
		h := wire.Header{Op: wire.OpReadReq, Flags: wire.FlagDC, DestQP: dct.QPN(), SrcQP: 3, PSN: psn,
			DCKey: key, SessionPSN: 10, VA: 0, RKey: b.mr.RKey(), DMALen: length, RespMTU: respMTU}
		p.send(b.dev.Addr(), &h, nil)
		return h
	}
	for _, mtu := range []uint32{1, 255} {
		read(mtu, 4096)
		h, _ := p.recv()
		if h.Op != wire.OpAck || h.Syndrome != wire.SynNAKInv || h.Reason != uint8(verbs.ReasonInvalidOp) {
			t.Fatalf("READ of 4 KiB in %d-byte responses answered with %v %v %v, want an invalid-request NAK", mtu, h.Op, h.Syndrome, verbs.Reason(h.Reason))
		}
	}
	// A DCT stays up after a NAK: 1 MiB in 256-byte responses is 4,096
	// packets, served in bounded sends.
	before := b.dev.Stats()
	read(256, memSize)
	waitStats(t, b.dev, "4,096 READ responses sent", func(s verbs.DeviceStats) bool {
		return s.TxPackets >= before.TxPackets+memSize/256
	})
	if high := b.dev.RxOutboxHigh(); high > softnic.ServeBatch+8 || high >= memSize/256 {
		t.Fatalf("the receive path queued %d packets in one send, want at most about %d (and fewer than the READ's %d)",
			high, softnic.ServeBatch, memSize/256)
	}
}
