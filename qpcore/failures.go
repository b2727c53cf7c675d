package qpcore

import (
	"fmt"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/verbs"
)

// The error paths of send completions, which KRCORE's artifact lacks:
//
// Isolation. An error completion on a shared QP (a DCI, or a peer's RC QP
// shared by its VQPs) moves the QP to ERR and flushes every WR on it. qpcore
// waits until every WR it posted on the QP came back, then:
//   - a DCI is reset to RTS (RESET, INIT, RTR, RTS) and keeps its owner;
//     an RC QP, which cannot come back without a new handshake, is
//     destroyed and its operations move to DC;
//   - the erroring WR's failure goes to its owner only, with the NAK's
//     reason (a stale rkey also invalidates the directory cache);
//   - every flushed WR is an innocent: it is queued again in front of
//     everything, in its original order, and posted again after the
//     directory was re-read if needed. The one exception is an atomic that
//     was sent (the responder may have executed it before the error, its
//     response lost): running it twice would be wrong, so its owner gets
//     ErrAtomicLost (loseAtomicsLocked). Only the responder's refusal of
//     that very WR proves an atomic did not run.
//
// Staleness. A DC key or unknown-DCT NAK means the peer restarted: every
// operation of the QP is stalled, the resolver entry invalidated and the
// peer looked up again (repeatedly, for up to half of PeerTimeout, while
// the resolver still serves the old metadata), then each operation is
// retried once with the new metadata (and the new directory), within its
// deadline.
//
// Silence. A retry-exceeded error means one transport attempt went
// unanswered; it is not proof of death (see liveness.go): the operations
// are posted again within their deadlines, the peer is looked up again in
// the background at its first silence (it may have moved), and only
// consecutive silent attempts (3/4 of PeerTimeout of silence) declare it
// down.
//
// RNR. A SEND whose receiver had no buffer posted for all the RNR retries
// is retried after rnrBackoff until its deadline (MsgTimeout).

const rnrBackoff = 2 * time.Millisecond

// failure classes
const (
	failNone  = iota // only flushes
	failOp           // the erroring WR itself is wrong
	failStale        // the target's key or DCT number is wrong: the peer restarted
	failDown         // no response: peer dead or moved
	failRNR          // no receive buffer
	failLost         // an RC QP's peer no longer knows it (not staleness of the peer)
)

func classify(st verbs.Status, why verbs.Reason, fromRC bool) int {
	switch st {
	case verbs.StatusWRFlushErr:
		return failNone
	case verbs.StatusRetryExcErr:
		return failDown
	case verbs.StatusRNRRetryExcErr:
		return failRNR
	case verbs.StatusRemInvReqErr:
		if why == verbs.ReasonDCKey || why == verbs.ReasonNoQP {
			if fromRC {
				return failLost
			}
			return failStale
		}
	}
	return failOp
}

// handleFailuresLocked sorts out the ops of an errored QP, in completion
// order (which is post order).
func (n *Node) handleFailuresLocked(p *peer, failed []failure, fromRC bool, e *effects) {
	ci := -1
	for i, f := range failed {
		if f.st != verbs.StatusWRFlushErr {
			ci = i
			break
		}
	}
	class := failNone
	if ci >= 0 {
		class = classify(failed[ci].st, failed[ci].why, fromRC)
		if class == failOp || class == failStale || class == failRNR {
			failed[ci].o.mayRun = false // the responder refused it
		}
	}
	failed, ci = n.loseAtomicsLocked(p, failed, ci, e)
	ops := make([]*op, 0, len(failed))
	switch class {
	case failNone, failLost:
		for _, f := range failed {
			ops = append(ops, f.o)
		}
		n.requeueLocked(p, ops)
	case failOp:
		c := failed[ci]
		switch c.why {
		case verbs.ReasonRKey, verbs.ReasonBounds, verbs.ReasonPerm:
			p.dir.invalidate()
		}
		n.stats.remoteErrors.Add(1)
		n.finishLocked(p, c.o, &RemoteError{Status: c.st, Reason: c.why}, e)
		for i, f := range failed {
			if i != ci {
				ops = append(ops, f.o)
			}
		}
		n.requeueLocked(p, ops)
	case failRNR:
		c := failed[ci]
		if !c.o.deadline.IsZero() && n.clock.Now().After(c.o.deadline) {
			n.finishLocked(p, c.o, ErrReceiverBusy, e)
			for i, f := range failed {
				if i != ci {
					ops = append(ops, f.o)
				}
			}
			n.requeueLocked(p, ops)
			return
		}
		n.stats.rnrRetries.Add(1)
		for _, f := range failed {
			ops = append(ops, f.o)
		}
		p.pause.stall(ops)
		if p.pause.rnr() {
			e.rnr = append(e.rnr, p)
		}
	case failDown:
		n.lostLocked(p, failed, e)
	case failStale:
		for _, f := range failed {
			ops = append(ops, f.o)
		}
		p.pause.stall(ops)
		if p.pause.resolve() {
			// A resolve takes over an RNR pause: its timer finds it gone.
			e.relook = append(e.relook, p)
		}
	}
}

// loseAtomicsLocked ends, with ErrAtomicLost, every atomic of failed
// that may have executed: it was sent, and only its own refusal by the
// responder (mayRun cleared) says it did not run. Posting it again could
// apply it twice, on the same peer or, after a restart that kept its
// memory, on the peer's next incarnation. It returns the other failures,
// in order, and the index of the erroring one among them (-1 if none).
func (n *Node) loseAtomicsLocked(p *peer, failed []failure, ci int, e *effects) ([]failure, int) {
	kept, kci := failed[:0], -1
	for i, f := range failed {
		if f.o.code.atomic() && f.o.mayRun {
			n.finishLocked(p, f.o, fmt.Errorf("%w: no answer from gid %d (%v)", ErrAtomicLost, p.gid, f.st), e)
			continue
		}
		if i == ci {
			kci = len(kept)
		}
		kept = append(kept, f)
	}
	return kept, kci
}

// lostLocked handles a QP that exhausted its transport retries: the
// peer did not answer for a whole attempt. Unless that makes the evidence
// of death complete (see liveness.go), the operations are posted again
// within their deadlines (atomics that may have run never come here: see
// loseAtomicsLocked).
func (n *Node) lostLocked(p *peer, failed []failure, e *effects) {
	now := n.clock.Now()
	dead := n.struckLocked(p, now)
	if dead || p.live.firstSilence() {
		// The first silence may be a peer that moved: look it up in
		// the background (operations go on meanwhile).
		e.down = append(e.down, p)
	}
	if dead {
		// Everything queued for the dead peer would only wait for the
		// same silence again.
		for _, o := range p.dcq.take() {
			n.finishLocked(p, o, n.downErr(p, nil), e)
		}
	}
	ops := make([]*op, 0, len(failed))
	for _, f := range failed {
		o := f.o
		switch {
		case p.live.down:
			n.finishLocked(p, o, n.downErr(p, nil), e)
		case !n.canRetryLocked(o, now):
			n.stats.opTimeouts.Add(1)
			n.finishLocked(p, o, n.expiredErr(p, o), e)
		default:
			ops = append(ops, o)
		}
	}
	n.stats.lossRetries.Add(uint64(len(ops)))
	n.requeueLocked(p, ops)
}

// requeueLocked puts ops, in order, in front of p's DC queue.
func (n *Node) requeueLocked(p *peer, ops []*op) {
	for _, o := range ops {
		o.setState(opQueued)
	}
	p.dcq.pushFront(ops)
	n.stats.reposted.Add(uint64(len(ops)))
}

// relookup re-resolves a peer whose QP said its metadata is stale, then
// retries or fails the stalled ops.
func (n *Node) relookup(p *peer) {
	p.mu.Lock()
	cur := p.info
	fresh := p.pause.fresh() // some stalled op has its retry left: worth waiting for
	p.mu.Unlock()
	// After a restart the resolver may serve the old metadata until the
	// peer registered again: keep asking (with backoff), for at most
	// PeerTimeout less two attempts, which leaves the stalled operations
	// time for their retry within their deadline.
	ctx, cancel := clock.WithTimeout(n.ctx, n.clock, max(n.cfg.PeerTimeout-2*n.attempt, n.attempt))
	defer cancel()
	var info meta.NodeInfo
	var err error
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		n.res.Invalidate(p.gid)
		info, err = n.res.Lookup(ctx, p.gid)
		n.stats.relookups.Add(1)
		if !fresh || err != nil || info != cur {
			break
		}
		pause, stop := clock.After(n.clock, wait)
		select {
		case <-pause:
			continue
		case <-ctx.Done():
		}
		stop()
		break
	}
	e := n.newEffects()
	p.mu.Lock()
	defer func() {
		p.mu.Unlock()
		n.apply(e)
	}()
	if p.closed || !p.pause.is(pauseResolve) {
		return
	}
	changed := err == nil && info.GID == p.gid && info.Addr.IsValid() && info != p.info
	if changed {
		p.setInfoLocked(info)
		n.drainRCLocked(p, e)
	}
	retry := err == nil
	stalled := p.pause.end()
	var again []*op
	for _, o := range stalled {
		if o.dir && retry && o.retries == 0 && o.rkey != p.info.DirRKey {
			// The directory READ goes to the directory of the
			// incarnation just found, when it has the same size (else
			// it fails, ErrStale, and the next look reads again).
			if uint32(len(o.local)) == p.info.DirLen {
				o.rkey = p.info.DirRKey
			} else {
				n.finishLocked(p, o, fmt.Errorf("%w: gid %d: its directory changed size", ErrStale, p.gid), e)
				continue
			}
		}
		switch {
		case retry && o.retries == 0:
			o.retries++
			again = append(again, o)
			n.stats.staleRetries.Add(1)
		case err != nil:
			n.finishLocked(p, o, n.downErr(p, err), e)
		default:
			n.finishLocked(p, o, fmt.Errorf("%w: gid %d", ErrStale, p.gid), e)
		}
	}
	n.requeueLocked(p, again)
	n.kickLocked(p, e)
}

func (n *Node) downErr(p *peer, lookupErr error) error {
	if lookupErr != nil {
		return fmt.Errorf("%w: gid %d: %w", ErrPeerUnreachable, p.gid, lookupErr)
	}
	return fmt.Errorf("%w: gid %d did not answer within %v", ErrPeerUnreachable, p.gid, n.cfg.PeerTimeout)
}
