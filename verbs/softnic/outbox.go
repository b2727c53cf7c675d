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
	arena []byte
	mac   *macer // signs every packet when the device has a cluster key
}

func (o *outbox) add(to netip.AddrPort, h *wire.Header, payload []byte) {
	if o.mac != nil {
		h.Flags |= wire.FlagMAC
		h.MAC = [wire.MACLen]byte{}
	}
	start := len(o.arena)
	o.arena = h.Append(o.arena)
	o.pkts = append(o.pkts, link.Packet{To: to, Hdr: o.arena[start:len(o.arena):len(o.arena)], Payload: payload})
}

// flush sends everything collected and resets the outbox.
func (o *outbox) flush(d *Device) {
	if len(o.pkts) == 0 {
		return
	}
	var bytes uint64
	for i := range o.pkts {
		p := &o.pkts[i]
		if o.mac != nil {
			o.mac.sign(p.Hdr, p.Payload)
		}
		bytes += uint64(p.Len())
	}
	d.stats.txPackets.Add(uint64(len(o.pkts)))
	d.stats.txBytes.Add(bytes)
	_ = d.link.Send(o.pkts) // losses are the protocol's to repair
	clear(o.pkts)
	o.pkts = o.pkts[:0]
	o.arena = o.arena[:0]
}
