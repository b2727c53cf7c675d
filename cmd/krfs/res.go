package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/krfs/krfs/verbs"
)

// `krfs res MOUNTPOINT qp|mr|peer [-j]` lists a running node's resources in
// the shape of `rdma res show`, from the QPs, regions and peers the daemon
// writes into MOUNTPOINT/stats.json.

// resLink names the device in listings, as rdma(8) names DEV/PORT.
const resLink = "softnic/1"

// resQP is one QP of the node's NIC.
type resQP struct {
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

// resMR is one region this node exports.
type resMR struct {
	Name   string `json:"name"`
	RKey   uint32 `json:"rkey"`
	MRLen  uint64 `json:"mrlen"`
	Access string `json:"access"`
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
}

// resPeer is one live node of the cluster as this node sees it.
type resPeer struct {
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

// resQPs lists the NIC's QPs by number.
func (b *nodeBackend) resQPs() []resQP {
	qs := b.dev.QPs()
	out := make([]resQP, 0, len(qs))
	for _, q := range qs {
		r := resQP{LQPN: q.QPN, Type: q.Type.String(), State: q.State.String(), SQPSN: q.SQPSN, RQPSN: q.RQPSN,
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

// resMRs lists the exported regions by name.
func (b *nodeBackend) resMRs() []resMR {
	rs := b.node.Regions()
	out := make([]resMR, 0, len(rs))
	for _, r := range rs {
		out = append(out, resMR{Name: r.Name, RKey: r.RKey, MRLen: r.Len, Access: r.Access.String(),
			Mode: r.Mode & 0o7777, UID: r.UID, GID: r.GID})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// resPeers lists the live nodes of the meta service (nil if it cannot be
// read within a second) with what this node keeps for each.
func (b *nodeBackend) resPeers() []resPeer {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	nodes, err := b.meta.List(ctx)
	if err != nil {
		return nil
	}
	self := b.node.GID()
	out := make([]resPeer, 0, len(nodes))
	for _, n := range nodes {
		p := resPeer{GID: n.GID, Address: n.Addr.String(), Incarnation: n.Incarnation, Self: n.GID == self, Regions: -1}
		if st, ok := b.node.Peer(n.GID); ok {
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

// resStats is the part of stats.json that `krfs res` reads.
type resStats struct {
	GID     uint32
	Address string
	QPs     []resQP
	Regions []resMR
	Peers   []resPeer
}

func runRes(args []string, stdout, stderr io.Writer) error {
	set := flag.NewFlagSet("krfs res", flag.ContinueOnError)
	set.SetOutput(stderr)
	asJSON := set.Bool("j", false, "print JSON")
	set.Usage = func() {
		fmt.Fprintln(stderr, "usage: krfs res MOUNTPOINT qp|mr|peer [-j]")
		set.PrintDefaults()
	}
	pos, err := parseInterleaved(set, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		set.Usage()
		return fmt.Errorf("%w: want MOUNTPOINT and one of qp, mr, peer", errUsage)
	}
	mnt, what := pos[0], pos[1]
	switch what {
	case "qp", "mr", "peer":
	default:
		return fmt.Errorf("%w: unknown resource %q: want qp, mr or peer", errUsage, what)
	}
	raw, err := os.ReadFile(filepath.Join(mnt, "stats.json"))
	if err != nil {
		return fmt.Errorf("%s is not a running krfs mount: %w", mnt, err)
	}
	var st resStats
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("%s/stats.json: %w", mnt, err)
	}
	if *asJSON {
		var v any
		switch what {
		case "qp":
			v = nonNil(st.QPs)
		case "mr":
			v = nonNil(st.Regions)
		case "peer":
			v = nonNil(st.Peers)
		}
		e := json.NewEncoder(stdout)
		return e.Encode(v)
	}
	switch what {
	case "qp":
		for _, q := range st.QPs {
			fmt.Fprintln(stdout, formatQP(q))
		}
	case "mr":
		for _, r := range st.Regions {
			fmt.Fprintf(stdout, "link %s rkey %#x mrlen %d access %s name %s mode %04o uid %d gid %d\n",
				resLink, r.RKey, r.MRLen, r.Access, r.Name, r.Mode, r.UID, r.GID)
		}
	case "peer":
		for _, p := range st.Peers {
			fmt.Fprintln(stdout, formatPeer(p))
		}
	}
	return nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func formatQP(q resQP) string {
	var b strings.Builder
	fmt.Fprintf(&b, "link %s lqpn %d", resLink, q.LQPN)
	if q.Type == verbs.RC.String() {
		fmt.Fprintf(&b, " rqpn %d", q.RQPN)
	}
	fmt.Fprintf(&b, " type %s state %s sq-psn %d rq-psn %d", q.Type, q.State, q.SQPSN, q.RQPSN)
	if q.Remote != "" {
		fmt.Fprintf(&b, " remote %s", q.Remote)
	}
	s := q.Stats
	fmt.Fprintf(&b, " outstanding %d tx %d rx %d retransmits %d naks-rx %d errors %d",
		q.Outstanding, s.TxPackets, s.RxPackets, s.Retransmits, s.NAKSeqRx+s.RNRNAKRx+s.ErrNAKRx, s.Errors)
	return b.String()
}

func formatPeer(p resPeer) string {
	var b strings.Builder
	fmt.Fprintf(&b, "link %s gid %d address %s incarnation %#x", resLink, p.GID, p.Address, p.Incarnation)
	tr := p.Transport
	if tr == "" {
		tr = "-"
	}
	fmt.Fprintf(&b, " transport %s", tr)
	if p.Known {
		fmt.Fprintf(&b, " rc %s active %d", p.RC, p.Active)
		if p.Regions >= 0 {
			fmt.Fprintf(&b, " regions %d", p.Regions)
		}
	}
	if p.Self {
		b.WriteString(" self")
	}
	return b.String()
}
