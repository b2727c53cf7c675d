package softnic

import (
	"net/netip"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

var _ verbs.SecurityReporter = (*Device)(nil)

// SecurityStats implements verbs.SecurityReporter: AuthStats and CMStats
// in the verbs types, for the layers above that see only verbs. (The
// conversions fail to compile if the two sides' fields ever differ.)
func (d *Device) SecurityStats() verbs.SecurityStats {
	return verbs.SecurityStats{Keyed: d.auth != nil, Auth: verbs.AuthStats(d.AuthStats()), CM: verbs.CMStats(d.CMStats())}
}

// refuseVersion handles a packet of another wire version (the receive
// path, rxMu held): it is counted, and without a cluster key a connection
// request of a version wire knows gets a refusal in its own format (see
// wire.AppendVersionRefusal), so that an old node's connect fails with a
// reason. With a key nothing unauthenticated gets an answer.
func (d *Device) refuseVersion(from netip.AddrPort, hdr, payload []byte) {
	d.stats.badVersion.Add(1)
	if d.auth != nil {
		return
	}
	pkt := hdr
	if len(payload) > 0 {
		pkt = append(append([]byte(nil), hdr...), payload...)
	}
	rej, ok := wire.AppendVersionRefusal(nil, pkt)
	if !ok {
		return
	}
	d.stats.txPackets.Add(1)
	d.stats.txBytes.Add(uint64(len(rej)))
	_ = d.link.Send([]link.Packet{{To: from, Hdr: rej}})
}
