package qpcore

import (
	"encoding/binary"
	"errors"
	"slices"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// The RC pool. A peer that turns hot (RCThreshold ops within RCWindow)
// gets an RC QP built in the background by the connection manager while
// its VQPs keep going on DC. Once the QP is ready, each VQP moves to it
// at its next operation, after its operations on DC completed (the
// fence), so its operations stay in order.
//
// The pool holds at most RCCap QPs. When it is full, a new hot peer evicts
// the least recently used QP that was idle for at least RCWindow (so two
// busy peers do not evict each other in turn); otherwise it stays on DC and
// tries again after RCWindow. A QP unused for RCIdle is torn down. Either
// way the QP first drains: it takes no new operations, finishes what was
// queued for it, and is destroyed once nothing is in flight; its VQPs go
// back to DC through the same fence.
//
// The passive side accepts connections into QPs that share the node's
// SRQ; it keeps at most 4*RCCap of them and reclaims those idle for
// 2*RCIdle or in ERR. An initiator whose passive QP was reclaimed sees a
// no-QP NAK and falls back to DC transparently.

// connectRC builds an RC QP to p (goroutine).
func (n *Node) connectRC(p *peer) {
	fail := func(q verbs.QP, reserved bool) {
		p.mu.Lock()
		if p.rcPhase == rcConnecting {
			p.setRCLocked(rcNone)
		}
		p.rcRetryAt = n.clock.Now().Add(n.cfg.RCWindow)
		p.mu.Unlock()
		if q != nil {
			q.Destroy()
		}
		if reserved {
			n.rcMu.Lock()
			n.rcCount--
			n.rcMu.Unlock()
		}
	}
	if !n.reserveRC() {
		fail(nil, false)
		return
	}
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: n.scq, RecvCQ: n.rcq,
		Caps: verbs.QPCaps{MaxSendWR: n.cfg.RCDepth, MaxRecvWR: 1}})
	if err != nil {
		n.stats.rcConnectFailures.Add(1)
		fail(nil, true)
		return
	}
	p.mu.Lock()
	info := p.info
	p.mu.Unlock()
	ctx, cancel := clock.WithTimeout(n.ctx, n.clock, n.cfg.PeerTimeout)
	_, err = n.dev.ConnectRC(ctx, q, info.Addr, rcService, verbs.ConnParams{
		Timeout: n.ackTimeout, RetryCnt: 7, RNRRetry: 6,
		Private: encodeRCPrivate(n.gid.Load(), info.Incarnation)})
	cancel()
	if err != nil {
		n.stats.rcConnectFailures.Add(1)
		fail(q, true)
		return
	}
	c := &rcConn{p: p, qp: q}
	c.lastUsed.Store(n.clock.Now().UnixNano())
	e := newEffects()
	p.mu.Lock()
	if p.closed || p.rcPhase != rcConnecting || p.info.Incarnation != info.Incarnation {
		p.mu.Unlock()
		n.stats.rcConnectFailures.Add(1)
		fail(q, true)
		return
	}
	p.rc = c
	p.setRCLocked(rcReady)
	n.rcMu.Lock()
	n.rcConns = append(n.rcConns, c)
	n.rcMu.Unlock()
	n.stats.rcConnects.Add(1)
	n.settleAllLocked(p)
	n.kickLocked(p, e)
	p.mu.Unlock()
	n.apply(e)
}

// reserveRC takes a slot of the RC pool. With the pool full it starts
// evicting the least recently used QP idle for at least RCWindow and
// returns false.
func (n *Node) reserveRC() bool {
	n.rcMu.Lock()
	if n.rcCount < n.cfg.RCCap {
		n.rcCount++
		n.rcMu.Unlock()
		return true
	}
	cutoff := n.clock.Now().Add(-n.cfg.RCWindow).UnixNano()
	var victim *rcConn
	for _, c := range n.rcConns {
		if t := c.lastUsed.Load(); t < cutoff && (victim == nil || t < victim.lastUsed.Load()) {
			victim = c
		}
	}
	n.rcMu.Unlock()
	if victim != nil && n.drainRC(victim) {
		n.stats.rcEvictions.Add(1)
	}
	return false
}

// drainRC starts tearing c down. It reports whether it did.
func (n *Node) drainRC(c *rcConn) bool {
	p := c.p
	e := newEffects()
	p.mu.Lock()
	ok := p.rc == c && p.rcPhase == rcReady
	if ok {
		p.setRCLocked(rcDraining)
		n.rcMaybeCloseLocked(p, e)
		n.settleAllLocked(p)
		n.kickLocked(p, e)
	}
	p.mu.Unlock()
	n.apply(e)
	return ok
}

// rcMaybeCloseLocked destroys a draining RC QP once nothing is queued or
// in flight on it.
func (n *Node) rcMaybeCloseLocked(p *peer, e *effects) {
	c := p.rc
	if c == nil || p.rcPhase != rcDraining || c.out > 0 || c.errored || p.rcq.len() > 0 {
		return
	}
	p.rc = nil
	p.setRCLocked(rcNone)
	e.destroy = append(e.destroy, c)
	n.stats.rcFallbacks.Add(1)
	n.settleAllLocked(p)
}

// destroyRC destroys c's QP and frees its pool slot.
func (n *Node) destroyRC(c *rcConn) {
	c.qp.Destroy()
	n.rcMu.Lock()
	if i := slices.Index(n.rcConns, c); i >= 0 {
		n.rcConns = slices.Delete(n.rcConns, i, i+1)
		n.rcCount--
	}
	n.rcMu.Unlock()
}

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
