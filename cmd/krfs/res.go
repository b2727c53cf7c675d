package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/node"
	"github.com/krfs/krfs/verbs"
)

// `krfs res MOUNTPOINT qp|mr|peer [-j]` lists a running node's resources in
// the shape of `rdma res show`, from the QPs, regions and peers the daemon
// writes into MOUNTPOINT/stats.json.

// resLink names the device in listings, as rdma(8) names DEV/PORT.
const resLink = "softnic/1"

// resStats is the part of stats.json that `krfs res` reads.
type resStats struct {
	GID     uint32
	Address string
	QPs     []node.ResQP
	Regions []node.ResMR
	Peers   []node.ResPeer
	Fuse    *fs.FuseStats `json:"fuse"`
}

func resCmd(stdout io.Writer) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:       "res MOUNTPOINT qp|mr|peer|fuse [-j]",
		Short:     "List a running node's QPs, regions or peers, like rdma res show, or its FUSE transport",
		Args:      exactArgs(2, "MOUNTPOINT and one of qp, mr, peer, fuse"),
		ValidArgs: []string{"qp", "mr", "peer", "fuse"},
		RunE: func(_ *cobra.Command, args []string) error {
			return runRes(args[0], args[1], asJSON, stdout)
		},
	}
	cmd.Flags().BoolVarP(&asJSON, "json", "j", false, "print JSON")
	return cmd
}

func runRes(mnt, what string, asJSON bool, stdout io.Writer) error {
	switch what {
	case "qp", "mr", "peer", "fuse":
	default:
		return fmt.Errorf("%w: unknown resource %q: want qp, mr, peer or fuse", errUsage, what)
	}
	raw, err := os.ReadFile(filepath.Join(mnt, "stats.json"))
	if err != nil {
		return fmt.Errorf("%s is not a running krfs mount: %w", mnt, err)
	}
	var st resStats
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("%s/stats.json: %w", mnt, err)
	}
	if asJSON {
		var v any
		switch what {
		case "qp":
			v = nonNil(st.QPs)
		case "mr":
			v = nonNil(st.Regions)
		case "peer":
			v = nonNil(st.Peers)
		case "fuse":
			v = st.Fuse
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
	case "fuse":
		if f := st.Fuse; f != nil {
			fmt.Fprintf(stdout, "transport %s queues %d entries-per-queue %d dev-requests %d ring-requests %d ring-async %d ring-pending %d fallback-copies %d\n",
				f.Transport, f.Queues, f.EntriesPerQueue, f.DevRequests, f.RingRequests, f.RingAsync, f.RingPending, f.FallbackCopies)
			if f.Why != "" {
				fmt.Fprintf(stdout, "why-not-io_uring %s\n", f.Why)
			}
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

func formatQP(q node.ResQP) string {
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

func formatPeer(p node.ResPeer) string {
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
