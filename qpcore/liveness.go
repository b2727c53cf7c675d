package qpcore

import (
	"fmt"
	"time"

	"github.com/krfs/krfs/clock"
)

// Operation deadlines and peer liveness.
//
// Deadline. Every operation gets a hard deadline, expires = its post time
// + PeerTimeout (the --timeout of krfs). No timer is armed per operation:
//
//   - a posted WR ends by itself within one attempt (n.attempt =
//     PeerTimeout/attemptsPerTimeout: the QP's ACK timeout is attempt/8
//     with 7 retries, and the retry count restarts on any progress);
//   - an operation is posted (first time or again) only if one more
//     attempt still ends by its deadline, otherwise it fails there;
//   - an operation that waits outside a QP (queued behind others or for a
//     DCI, held by a switching fence, stalled during a re-lookup) is failed
//     by the housekeeping tick once its deadline passed.
//
// So a synchronous READ, WRITE or atomic returns within PeerTimeout + one
// Tick (DefaultTick, 20 ms), whatever the loss, duplication or peer
// state. A message's SENDs are bounded the same way by their MsgTimeout
// deadline instead (a receiver with no buffer posted makes them wait).
//
// Liveness. A QP that exhausts its transport retries is not proof of
// death: at 30% loss each way a try succeeds 49% of the time and one in
// about 200 attempts of 8 tries fails. Its operations are posted again
// (within their deadline; an atomic, which the peer may have executed,
// fails with ErrAtomicLost instead, also when the silence proves the peer
// dead: its request may sit in the peer's socket and run when it wakes). The peer is declared down only on
// evidence: deathStrikes consecutive retry-exhausted attempts with no
// answer in between, spanning at least deathStrikes attempts (3/4 of
// PeerTimeout) of silence. Then its
// operations fail with ErrPeerUnreachable, queued ones at once, the peer
// is looked up again (if it moved, the new address is used and it is up
// again), and new operations fail at once except one probe at a time,
// at most one per attempt. Any answer (a successful completion) ends
// the down state at once.

const (
	// attemptsPerTimeout is how many full transport attempts (RetryCnt+1
	// tries each) fit in PeerTimeout.
	attemptsPerTimeout = 4
	// deathStrikes is how many consecutive retry-exhausted attempts, with
	// no answer in between, make a peer down; the silence must also span
	// that many whole attempts (two QP errors at once are one silence).
	deathStrikes = 3
)

// liveness is what a peer's answers and silences say of it, one type: its
// fields change only through its methods. Guarded by the peer's mu.
//
//	up --(deathStrikes silent attempts over deathStrikes attempts' time)--> down
//	down --(any answer)--> up
//	down: new operations refused, but one probe per attempt
type liveness struct {
	strikes    int       // consecutive retry-exhausted failures, no answer since
	silentFrom time.Time // no answer from the peer since then (valid if strikes > 0)
	down       bool      // declared down on evidence of death
	probeAt    time.Time // while down: when the next operation may go as a probe
}

// answered records an answer and reports whether it brought the peer
// back up.
func (l *liveness) answered() bool {
	l.strikes = 0
	if !l.down {
		return false
	}
	l.down = false
	return true
}

// struck records a retry-exhausted attempt (of length attempt) at now and
// reports whether the evidence now says the peer is dead: it is then down.
func (l *liveness) struck(now time.Time, attempt time.Duration) bool {
	if l.strikes == 0 {
		// The failed attempt went unanswered for a whole attempt.
		l.silentFrom = now.Add(-attempt)
	}
	l.strikes++
	if l.down || l.strikes < deathStrikes || now.Sub(l.silentFrom) < deathStrikes*attempt {
		return false
	}
	l.down = true
	l.probeAt = now.Add(attempt)
	return true
}

// firstSilence reports whether the last strike was the first since an
// answer.
func (l *liveness) firstSilence() bool { return l.strikes == 1 }

// refuses reports whether a new operation must fail: the peer is down
// and the operation cannot be its probe (busy: something else is in
// flight to it, or the last probe was less than an attempt ago). The
// clock is read only for a down peer.
func (l *liveness) refuses(c clock.Clock, busy bool) bool {
	return l.down && (busy || c.Now().Before(l.probeAt))
}

// admitted records an operation admitted: to a down peer it is the probe,
// and the next one waits an attempt. The clock is read only for a down
// peer.
func (l *liveness) admitted(c clock.Clock, attempt time.Duration) {
	if l.down {
		l.probeAt = c.Now().Add(attempt)
	}
}

// answeredLocked records an answer from p: it is alive.
func (n *Node) answeredLocked(p *peer) {
	if p.live.answered() {
		n.stats.peersUp.Add(1)
	}
}

// struckLocked records a retry-exhausted attempt to p at now and reports
// whether the evidence now says p is dead (it is then marked down).
func (n *Node) struckLocked(p *peer, now time.Time) bool {
	if !p.live.struck(now, n.attempt) {
		return false
	}
	n.stats.peersDown.Add(1)
	n.stats.unreachable.Add(1)
	return true
}

// canRetryLocked reports whether o may be posted (again) at now: one
// more attempt ends by its deadline.
func (n *Node) canRetryLocked(o *op, now time.Time) bool {
	lim := o.limit()
	return lim.IsZero() || !now.Add(n.attempt).After(lim)
}

// limit is o's deadline: expires, or for a SEND its MsgTimeout deadline
// (a message may wait that long for a receiver to post a buffer).
func (o *op) limit() time.Time {
	if o.expires.IsZero() {
		return o.deadline
	}
	return o.expires
}

// expiredErr is the error of an operation that ran out of time.
func (n *Node) expiredErr(p *peer, o *op) error {
	if p.live.down {
		return n.downErr(p, nil)
	}
	return fmt.Errorf("%w: %v to gid %d not done within %v", ErrTimeout, o.code, p.gid, n.cfg.PeerTimeout)
}

// usableLocked refuses new work for a closed peer, and for a peer
// declared down unless the work can go as its probe (nothing else in
// flight to it, and one attempt since the last probe; prepareLocked
// starts the next probe interval when it admits the operation).
func (n *Node) usableLocked(p *peer) error {
	if p.closed {
		return ErrClosed
	}
	if p.live.refuses(n.clock, p.active > 0) {
		return n.downErr(p, nil)
	}
	return nil
}

// expireOps fails every operation that waits outside a QP past its
// deadline (housekeeping).
func (n *Node) expireOps(now time.Time) {
	n.mu.Lock()
	peers := make([]*peer, 0, len(n.peers))
	for _, p := range n.peers {
		peers = append(peers, p)
	}
	n.mu.Unlock()
	e := n.newEffects()
	for _, p := range peers {
		p.mu.Lock()
		if p.active > 0 {
			n.expireLocked(p, now, e)
		}
		p.mu.Unlock()
	}
	n.apply(e)
}

// expireLocked fails p's queued, held and stalled operations whose
// deadline passed.
func (n *Node) expireLocked(p *peer, now time.Time, e *effects) {
	late := func(o *op) bool { lim := o.limit(); return !lim.IsZero() && now.After(lim) }
	keep := func(o *op) bool { return !late(o) }
	var out []*op
	for _, q := range []*opQueue{&p.dcq, &p.rcq} {
		out = append(out, q.filter(keep)...)
	}
	out = append(out, p.pause.expire(late)...)
	for _, v := range append([]*VQP(nil), p.held...) {
		gone, empty := v.expire(late)
		if empty {
			p.held.drop(v)
		}
		out = append(out, gone...)
	}
	if len(out) == 0 {
		return
	}
	for _, o := range out {
		n.stats.opTimeouts.Add(1)
		n.finishLocked(p, o, n.expiredErr(p, o), e)
	}
	n.kickLocked(p, e)
}

// relookSilent looks a silent peer up again (goroutine), at its first
// retry-exhausted attempt and when it is declared down: if it moved (a new
// incarnation or address), the new metadata is adopted and the peer counts
// as alive; otherwise nothing changes (a down peer stays down until it
// answers).
func (n *Node) relookSilent(p *peer) {
	ctx, cancel := clock.WithTimeout(n.ctx, n.clock, n.cfg.PeerTimeout)
	defer cancel()
	n.res.Invalidate(p.gid)
	info, err := n.res.Lookup(ctx, p.gid)
	n.stats.relookups.Add(1)
	e := n.newEffects()
	p.mu.Lock()
	if err == nil && !p.closed && info.GID == p.gid && info.Addr.IsValid() && info != p.info {
		p.setInfoLocked(info)
		n.drainRCLocked(p, e)
		n.answeredLocked(p)
		n.kickLocked(p, e)
	}
	p.mu.Unlock()
	n.apply(e)
}
