package qpcore

import (
	"context"
	"fmt"
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
// no-QP NAK and falls back to DC transparently (an RC-only peer
// reconnects).
//
// An RC-only peer (Config.NoDC, or a peer with DCT number 0) has no DC to
// fall back to: its one queue waits for an RC QP, connected on its first
// operation. Its connection takes a pool slot at once if there is one;
// otherwise it reclaims the least recently used QP with nothing queued or
// in flight, or waits for a slot (a Tick at a time) until PeerTimeout,
// then fails the queued operations with ErrRCPoolFull (reserveRCWait).

// connectRC builds an RC QP to p (goroutine).
func (n *Node) connectRC(p *peer) {
	p.mu.Lock()
	rcOnly := p.rcOnly
	p.mu.Unlock()
	fail := func(q verbs.QP, reserved bool, why error) {
		e := n.newEffects()
		p.mu.Lock()
		p.rc.abort(n.clock.Now().Add(n.cfg.RCWindow))
		if rcOnly && p.rcOnly && p.rc.conn == nil {
			// Nothing else can carry the peer's operations: they fail.
			for _, o := range p.dcq.take() {
				n.finishLocked(p, o, why, e)
			}
		}
		p.mu.Unlock()
		n.apply(e)
		if q != nil {
			q.Destroy()
		}
		if reserved {
			n.rcs.free()
		}
	}
	// The connection, slot wait included, takes at most PeerTimeout.
	ctx, cancel := clock.WithTimeout(n.ctx, n.clock, n.cfg.PeerTimeout)
	defer cancel()
	if rcOnly {
		if err := n.reserveRCWait(ctx); err != nil {
			fail(nil, false, err)
			return
		}
	} else if !n.reserveRC() {
		fail(nil, false, nil)
		return
	}
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: n.scq, RecvCQ: n.rcq,
		Caps: verbs.QPCaps{MaxSendWR: n.cfg.RCDepth, MaxRecvWR: 1}})
	if err != nil {
		n.stats.rcConnectFailures.Add(1)
		fail(nil, true, fmt.Errorf("qpcore: creating an RC QP for gid %d: %w", p.gid, err))
		return
	}
	p.mu.Lock()
	info := p.info
	p.mu.Unlock()
	_, err = n.dev.ConnectRC(ctx, q, info.Addr, rcService, verbs.ConnParams{
		Timeout: n.ackTimeout, RetryCnt: 7, RNRRetry: 6,
		Private: encodeRCPrivate(n.gid.Load(), info.Incarnation)})
	if err != nil {
		n.stats.rcConnectFailures.Add(1)
		fail(q, true, fmt.Errorf("%w: gid %d: RC connection: %w", ErrPeerUnreachable, p.gid, err))
		return
	}
	c := &rcConn{p: p, qp: q}
	c.lastUsed.Store(n.clock.Now().UnixNano())
	e := n.newEffects()
	p.mu.Lock()
	if p.closed || !p.rc.connecting() || p.info.Incarnation != info.Incarnation {
		p.mu.Unlock()
		n.stats.rcConnectFailures.Add(1)
		fail(q, true, fmt.Errorf("%w: gid %d changed while its RC QP connected", ErrStale, p.gid))
		return
	}
	p.rc.up(c)
	n.rcs.add(c)
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
	if n.rcs.reserve(n.cfg.RCCap) {
		return true
	}
	victim := n.rcs.victim(n.clock.Now().Add(-n.cfg.RCWindow).UnixNano())
	if victim != nil && n.drainRC(victim) {
		n.stats.rcEvictions.Add(1)
	}
	return false
}

// reserveRCWait takes a slot of the RC pool for an RC-only peer, which
// has no other way to its peer: with the pool full it reclaims the least
// recently used RC QP that has nothing queued or in flight, or waits (for
// a slot freed, or a Tick later to look again) until ctx ends
// (ErrRCPoolFull).
func (n *Node) reserveRCWait(ctx context.Context) error {
	for {
		ok, freed, lru := n.rcs.reserveOrWatch(n.cfg.RCCap)
		if ok {
			return nil
		}
		reclaimed := false
		for _, c := range lru {
			if n.drainIdleRC(c) {
				n.stats.rcEvictions.Add(1)
				reclaimed = true
				break
			}
		}
		if reclaimed {
			continue // the drained QP was destroyed: its slot is free
		}
		// Wait for a slot to be freed, or a Tick for a busy QP to turn idle.
		n.stats.rcSlotWaits.Add(1)
		tick, stop := clock.After(n.clock, n.cfg.Tick)
		select {
		case <-freed:
		case <-tick:
		case <-ctx.Done():
			stop()
			return fmt.Errorf("%w: %d RC QPs busy for %v", ErrRCPoolFull, n.cfg.RCCap, n.cfg.PeerTimeout)
		}
		stop()
	}
}

// drainIdleRC tears c down at once if nothing is queued for it or in
// flight on it. It reports whether it did.
func (n *Node) drainIdleRC(c *rcConn) bool {
	p := c.p
	e := n.newEffects()
	p.mu.Lock()
	ok := p.rc.conn == c && c.out == 0 && !c.errored &&
		p.rcq.len() == 0 && (!p.rcOnly || p.dcq.len() == 0) && p.rc.drain()
	if ok {
		n.rcMaybeCloseLocked(p, e)
		n.settleAllLocked(p)
	}
	p.mu.Unlock()
	n.apply(e)
	return ok
}

// drainRC starts tearing c down. It reports whether it did.
func (n *Node) drainRC(c *rcConn) bool {
	p := c.p
	e := n.newEffects()
	p.mu.Lock()
	ok := p.rc.conn == c && p.rc.drain()
	if ok {
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
	c := p.rc.closeDrained(p.rcq.len())
	if c == nil {
		return
	}
	e.destroy = append(e.destroy, c)
	n.stats.rcFallbacks.Add(1)
	n.settleAllLocked(p)
}

// drainRCLocked drains p's RC QP if it is ready: the peer changed (a new
// incarnation or address), so the QP reaches the old one.
func (n *Node) drainRCLocked(p *peer, e *effects) {
	if p.rc.drain() {
		n.rcMaybeCloseLocked(p, e)
	}
}

// destroyRC destroys c's QP and frees its pool slot.
func (n *Node) destroyRC(c *rcConn) {
	c.qp.Destroy()
	if n.rcs.remove(c) {
		n.rcs.free()
	}
}

// dropErroredRCLocked drops p's RC QP c, in ERR with nothing in flight: it
// needs a new handshake, so the peer falls back to DC.
func (n *Node) dropErroredRCLocked(p *peer, c *rcConn, e *effects) {
	failed := c.failed
	c.failed = nil
	p.rc.drop(c, n.clock.Now().Add(n.cfg.RCIdle))
	e.destroy = append(e.destroy, c)
	n.stats.rcErrors.Add(1)
	n.stats.rcFallbacks.Add(1)
	// Operations queued for RC go to DC after the failed ones.
	rest := p.rcq.take()
	for _, x := range rest {
		n.rerouteLocked(x)
	}
	p.dcq.pushFront(rest)
	for _, f := range failed {
		n.rerouteLocked(f.o)
	}
	n.handleFailuresLocked(p, failed, true, e)
	n.settleAllLocked(p)
}

// noteTrafficLocked accounts k new ops of v and starts building an RC QP
// when the peer turned hot.
func (n *Node) noteTrafficLocked(p *peer, v *VQP, now time.Time, k int, e *effects) {
	if v.sys || p.rcOnly || n.cfg.DisableRC || k == 0 {
		return
	}
	if p.rc.hot(now, n.cfg.RCWindow, n.cfg.RCThreshold, k) {
		e.connect = append(e.connect, p)
	}
}
