package qpcore

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/krfs/krfs/verbs"
)

// The passive side of RC: connections accepted from peers into QPs that
// share the node's SRQ, at most 4*RCCap, reclaimed when idle for 2*RCIdle
// or in ERR.

// passiveRC is an RC QP accepted from a peer.
type passiveRC struct {
	since  time.Time
	lastRx uint64
	lastAt time.Time
}

var errPassiveFull = errors.New("qpcore: passive RC pool full")

// accept is the connection manager's accept function. It runs on the
// device's receive path: it takes only passiveMu.
func (n *Node) accept(req verbs.ConnRequest) (verbs.QP, []byte, error) {
	if len(req.Private) >= 12 {
		if inc := binary.LittleEndian.Uint64(req.Private[4:]); inc != n.incarnation {
			return nil, nil, errors.New("qpcore: connection for another incarnation")
		}
	}
	n.passiveMu.Lock()
	defer n.passiveMu.Unlock()
	if n.passive == nil || len(n.passive) >= 4*n.cfg.RCCap {
		return nil, nil, errPassiveFull
	}
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: n.scq, RecvCQ: n.rcq, SRQ: n.target.SRQ(),
		Caps: verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		return nil, nil, err
	}
	now := n.clock.Now()
	n.passive[q] = &passiveRC{since: now, lastAt: now}
	n.stats.rcAccepted.Add(1)
	return q, nil, nil
}

// reclaimPassive destroys passive QPs in ERR or idle for 2*RCIdle.
func (n *Node) reclaimPassive(now time.Time) {
	n.passiveMu.Lock()
	var victims []verbs.QP
	for q, s := range n.passive {
		info := q.Info()
		if info.Stats.RxPackets != s.lastRx {
			s.lastRx, s.lastAt = info.Stats.RxPackets, now
		}
		if info.State == verbs.StateErr || now.Sub(s.lastAt) > 2*n.cfg.RCIdle {
			delete(n.passive, q)
			victims = append(victims, q)
		}
	}
	n.passiveMu.Unlock()
	for _, q := range victims {
		q.Destroy()
		n.stats.rcReclaimed.Add(1)
	}
}
