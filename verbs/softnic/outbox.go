package softnic

import (
	"net/netip"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// outbox collects packets to send in one link.Send (one doorbell: the link
// turns it into one sendmmsg with GSO runs). Headers are encoded into an
// arena owned by the outbox; payloads are slices of registered memory, so
// the only copy of payload bytes is the kernel's.
type outbox struct {
	pkts  []link.Packet
	high  int // the most packets it held at a flush (tests check the bound)
	arena []byte
	auth  *authState // signs every packet when the device has a cluster key
	enc   []byte     // ciphertexts of the packets being sent (Config.Encrypt)
}

func (o *outbox) add(to netip.AddrPort, h *wire.Header, payload []byte) {
	if o.auth != nil {
		h.Flags |= wire.FlagMAC
		h.MAC = [wire.MACLen]byte{}
	}
	start := len(o.arena)
	o.arena = h.Append(o.arena)
	o.pkts = append(o.pkts, link.Packet{To: to, Hdr: o.arena[start:len(o.arena):len(o.arena)], Payload: payload})
}

// addEncoded queues a packet whose header is already encoded (with an
// AuthETH to fill in); its slices must stay valid until the flush.
func (o *outbox) addEncoded(p link.Packet) { o.pkts = append(o.pkts, p) }

// flush sends everything collected and resets the outbox. With a cluster
// key, packets are signed here, each with the next counter of its session;
// packets to addresses without a session wait for the handshake.
func (o *outbox) flush(d *Device) {
	if len(o.pkts) == 0 {
		return
	}
	if d.portDown.Load() {
		o.drop() // no link: the protocols retransmit, as over a pulled cable
		return
	}
	if o.auth != nil {
		o.pkts = o.auth.seal(o, o.pkts)
	}
	o.high = max(o.high, len(o.pkts))
	var bytes uint64
	for i := range o.pkts {
		bytes += uint64(o.pkts[i].Len())
	}
	d.stats.txPackets.Add(uint64(len(o.pkts)))
	d.stats.txBytes.Add(bytes)
	if len(o.pkts) > 0 {
		_ = d.link.Send(o.pkts) // losses are the protocol's to repair
	}
	o.drop()
}

// drop forgets the packets collected.
func (o *outbox) drop() {
	clear(o.pkts)
	o.pkts = o.pkts[:0]
	o.arena = o.arena[:0]
}
