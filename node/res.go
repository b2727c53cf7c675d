package node

import (
	"context"
	"sort"

	"github.com/krfs/krfs/verbs"
)

// The node's resources in the shape of `rdma res show` (what `krfs res`
// prints): its NIC's QPs, the regions it exports and the live nodes of the
// cluster. Stats writes them into stats.json.

// ResQP is one QP of the node's NIC.
type ResQP struct {
	LQPN        uint32 `json:"lqpn"`
	RQPN        uint32 `json:"rqpn,omitempty"`
	Type        string `json:"type"`
	State       string `json:"state"`
	Remote      string `json:"remote,omitempty"`
	SQPSN       uint32 `json:"sq-psn"`
	RQPSN       uint32 `json:"rq-psn"`
	Outstanding int    `json:"outstanding"`
	Stats       verbs.QPStats
}

// ResMR is one region this node exports.
type ResMR struct {
	Name   string `json:"name"`
	RKey   uint32 `json:"rkey"`
	MRLen  uint64 `json:"mrlen"`
	Access string `json:"access"`
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
}

// ResPeer is one live node of the cluster as this node sees it.
type ResPeer struct {
	GID         uint32 `json:"gid"`
	Address     string `json:"address"`
	Incarnation uint64 `json:"incarnation"`
	Self        bool   `json:"self,omitempty"`
	Known       bool   `json:"known"`               // this node keeps state for it
	Transport   string `json:"transport,omitempty"` // dc or rc, when known
	RC          string `json:"rc,omitempty"`        // RC connection phase
	Regions     int    `json:"regions"`             // cached directory entries, -1: not cached
	Active      int    `json:"active"`              // operations in progress
}

// ResQPs lists the NIC's QPs by number.
func (b *Node) ResQPs() []ResQP {
	qs := b.dev.QPs()
	out := make([]ResQP, 0, len(qs))
	for _, q := range qs {
		r := ResQP{LQPN: q.QPN, Type: q.Type.String(), State: q.State.String(), SQPSN: q.SQPSN, RQPSN: q.RQPSN,
			Outstanding: q.Outstand, Stats: q.Stats}
		if q.Type == verbs.RC {
			r.RQPN = q.RemoteQPN
			if q.Remote.IsValid() {
				r.Remote = q.Remote.String()
			}
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LQPN < out[j].LQPN })
	return out
}

// ResMRs lists the exported regions by name.
func (b *Node) ResMRs() []ResMR {
	rs := b.core.Regions()
	out := make([]ResMR, 0, len(rs))
	for _, r := range rs {
		out = append(out, ResMR{Name: r.Name, RKey: r.RKey, MRLen: r.Len, Access: r.Access.String(),
			Mode: r.Mode & 0o7777, UID: r.UID, GID: r.GID})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ResPeers lists the live nodes of the meta service (nil if it cannot be
// read within Config.MetaTimeout) with what this node keeps for each.
func (b *Node) ResPeers() []ResPeer {
	ctx, cancel := context.WithTimeout(context.Background(), b.metaWait)
	defer cancel()
	nodes, err := b.meta.List(ctx)
	if err != nil {
		return nil
	}
	self := b.core.GID()
	out := make([]ResPeer, 0, len(nodes))
	for _, n := range nodes {
		p := ResPeer{GID: n.GID, Address: n.Addr.String(), Incarnation: n.Incarnation, Self: n.GID == self, Regions: -1}
		if st, ok := b.core.Peer(n.GID); ok {
			p.Known, p.RC, p.Regions, p.Active = true, st.RC, st.Regions, st.Active
			if st.Incarnation != 0 {
				p.Transport = st.Transport.String()
			}
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GID < out[j].GID })
	return out
}
