package qpcore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/verbs"
)

// The peer directory cache: each peer's region directory (see regdir.go)
// is READ once and cached; an unknown region name, a NAK for an invalid
// rkey or a new incarnation invalidates it and the next lookup READs it
// again (no more often than dirRefreshMin for unknown names).
//
// The default region. A peer's meta entry carries the rkey and length of
// its default region (DefaultRegion, "mem"), so a new peer's directory
// cache starts as a hint holding that region alone: the first operation
// on it goes out right after the meta lookup, with no directory READ (a
// cold peer in two round trips: the lookup and the data). Any other name,
// a listing (VQP.Regions) or an rkey, bounds or access NAK replaces the
// hint with the directory itself. A hint that went stale (the region was
// exported again after the node registered) therefore costs one failed
// operation, which the caller may retry (see RetryableStale).
//
// The entry also carries the default region's mode and owner (when the
// node published them: meta.NodeInfo.MemOwnerKnown), which qpcore does not
// interpret but a file system shows: FreshRegion answers the default
// region from such a hint while the hint is no older than its maxAge, so
// a cold peer's "mem" is stat'ed, opened and read with no directory READ.
// How current that mode is: the hint is as old as the meta entry it was
// seeded from, which the meta client's DCCache may have held for up to
// its TTL (meta.ClientConfig.CacheTTL), plus at most maxAge since qpcore
// seeded it; after that the directory is read. Access is never decided
// by the mode: the peer's NIC checks every operation's rkey and access.

// DefaultRegion is the region a node exports by default, whose rkey and
// length its meta entry carries.
const DefaultRegion = "mem"

// dirRefreshMin is how old a directory must be before an unknown region
// name makes qpcore read it again.
const dirRefreshMin = 5 * time.Millisecond

// regionLocked finds a region of p by name. It may release and retake
// p.mu.
func (n *Node) regionLocked(ctx context.Context, p *peer, name string) (Region, error) {
	if p.dir.hint && p.dir.valid && name == DefaultRegion {
		if err := n.usableLocked(p); err != nil {
			return Region{}, err
		}
		n.stats.dirHints.Add(1)
		return p.dir.regions[name], nil
	}
	if err := n.ensureDirLocked(ctx, p); err != nil {
		return Region{}, err
	}
	r, ok := p.dir.regions[name]
	if !ok && clock.Since(n.clock, p.dir.at) > dirRefreshMin {
		p.dir.valid = false
		if err := n.ensureDirLocked(ctx, p); err != nil {
			return Region{}, err
		}
		r, ok = p.dir.regions[name]
	}
	if !ok {
		return Region{}, fmt.Errorf("%w: %q on gid %d", ErrNoRegion, name, p.gid)
	}
	return r, nil
}

// ensureDirLocked makes sure p's directory is cached (the directory
// itself, not a hint), reading it if needed. It releases p.mu while
// waiting and returns with it held.
func (n *Node) ensureDirLocked(ctx context.Context, p *peer) error {
	for tries := 0; ; tries++ {
		if err := n.usableLocked(p); err != nil {
			return err
		}
		if p.dir.full() {
			return nil
		}
		if tries > 0 && p.dir.err != nil && !p.dir.fetching {
			return p.dir.err
		}
		e := n.newEffects()
		n.fetchDirLocked(p)
		ch := p.dir.wait
		n.kickLocked(p, e)
		p.mu.Unlock()
		n.apply(e)
		var err error
		if ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		p.mu.Lock()
		if err != nil {
			return err
		}
	}
}

// FreshRegions lists the peer's exported regions from a directory READ no
// older than maxAge (a file system's directory listing: regions created
// or removed on the peer show within maxAge).
func (v *VQP) FreshRegions(ctx context.Context, maxAge time.Duration) ([]Region, error) {
	p := v.p
	p.mu.Lock()
	if p.dir.valid && !p.dir.fetching && clock.Since(v.n.clock, p.dir.at) > maxAge {
		p.dir.invalidate()
	}
	p.mu.Unlock()
	return v.Regions(ctx)
}

// FreshRegion is Region from a directory READ no older than maxAge: a
// name the cache does not know, or a size the caller must trust (a
// file's open), is looked up in a recent copy. The default region is
// also answered from the meta entry's hint, with no directory READ, when
// the hint carries its mode and owner and is no older than maxAge (see
// the package's notes on the default region for how current it is).
func (v *VQP) FreshRegion(ctx context.Context, name string, maxAge time.Duration) (Region, error) {
	p := v.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dir.ownerHint(name, maxAge, v.n.clock) {
		if err := v.n.usableLocked(p); err != nil {
			return Region{}, err
		}
		if r, ok := p.dir.regions[name]; ok {
			v.n.stats.dirHints.Add(1)
			return r, nil
		}
	}
	if (p.dir.hint || clock.Since(v.n.clock, p.dir.at) > maxAge) && p.dir.valid && !p.dir.fetching {
		p.dir.invalidate()
	}
	if err := v.n.ensureDirLocked(ctx, p); err != nil {
		return Region{}, err
	}
	r, ok := p.dir.regions[name]
	if !ok {
		return Region{}, fmt.Errorf("%w: %q on gid %d", ErrNoRegion, name, p.gid)
	}
	return r, nil
}

// FreshSize is the length of a region, as an open needs it. The default
// region is sized from whatever the cache holds for it, of any age: the
// hint (the peer's meta entry) or a directory copy; another region from
// a directory copy no older than maxAge (as FreshRegion). The default
// region therefore opens with no directory READ, cold (the meta lookup
// alone) or warm. The cached length is as current as a directory READ
// for what an open uses it for: it comes with the rkey the data path
// will use, and a region exported again (another size) gets a new rkey,
// so an operation sized by a stale length is refused by the peer, never
// served from the wrong region, and the caller looks again
// (RetryableStale). The default region is never removed, only resized.
func (v *VQP) FreshSize(ctx context.Context, name string, maxAge time.Duration) (uint64, error) {
	p := v.p
	p.mu.Lock()
	if name == DefaultRegion && p.dir.valid && !p.dir.fetching {
		r, ok := p.dir.regions[name]
		hint := p.dir.hint
		if err := v.n.usableLocked(p); err != nil {
			p.mu.Unlock()
			return 0, err
		}
		p.mu.Unlock()
		if ok {
			if hint {
				v.n.stats.dirHints.Add(1)
			}
			return r.Len, nil
		}
	} else {
		p.mu.Unlock()
	}
	r, err := v.FreshRegion(ctx, name, maxAge)
	return r.Len, err
}

// RetryableStale reports whether err is a data operation's failure that
// a fresh look at the peer's directory may cure: the region's rkey was
// refused (it was exported again), the range fell outside it (it shrank
// or grew) or the region is gone from the cached copy. The directory is
// already invalidated then; a caller retries once.
func RetryableStale(err error) bool {
	var re *RemoteError
	if errors.As(err, &re) {
		return re.Reason == verbs.ReasonRKey || re.Reason == verbs.ReasonBounds
	}
	return errors.Is(err, ErrRemoteBounds) || errors.Is(err, ErrNoRegion)
}

// fetchDirLocked starts reading p's directory with one READ, unless a
// read is in progress or the directory is valid.
func (n *Node) fetchDirLocked(p *peer) {
	if p.dir.fetching || p.dir.full() {
		return
	}
	if p.dir.wait == nil {
		p.dir.wait = make(chan struct{})
	}
	p.dir.err = nil
	if p.info.DirLen == 0 || p.info.DirRKey == 0 {
		p.dir.done(map[string]Region{}, nil, n.clock.Now())
		return
	}
	buf := make([]byte, p.info.DirLen)
	mr, err := n.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		p.dir.done(nil, err, n.clock.Now())
		return
	}
	p.dir.fetching = true
	o := newOp()
	o.v, o.p, o.code, o.sys, o.dir = p.sys, p, opRawRead, true, true
	o.local, o.lmr, o.tmp, o.rkey = buf, mr, true, p.info.DirRKey
	o.onDone = n.dirFetched
	n.ops.add(o)
	p.active++
	n.queueLocked(p, o, DC)
	n.stats.dirReads.Add(1)
}

// dirFetched is the completion of a directory READ.
func (n *Node) dirFetched(o *op) {
	p := o.p
	var regions map[string]Region
	err := o.err
	if err == nil {
		regions, _, err = parseDirectory(o.local)
	}
	e := n.newEffects()
	p.mu.Lock()
	p.dir.fetching = false
	now := n.clock.Now()
	if errors.Is(err, errTorn) && p.dir.torn == 0 {
		p.dir.tornSince = now
	}
	if errors.Is(err, errTorn) && !p.closed &&
		(p.dir.torn < dirTornAtOnce || now.Sub(p.dir.tornSince) < n.cfg.PeerTimeout) {
		p.dir.torn++
		n.stats.dirTorn.Add(1)
		if p.dir.torn <= dirTornAtOnce {
			n.fetchDirLocked(p)
		} else {
			// The writer may be a thread the peer's host left unscheduled
			// in the middle of an update: give it time.
			p.dir.fetching = true // no other fetch while we wait
			backoff := min(dirTornBackoff<<min(p.dir.torn-dirTornAtOnce-1, 10), dirTornBackoffMax)
			n.clock.AfterFunc(backoff, func() {
				if !n.goSafe(func() { n.refetchDir(p) }) {
					n.refetchDir(p) // closed: only ends the wait, with ErrClosed
				}
			})
		}
	} else {
		if errors.Is(err, errTorn) {
			err = fmt.Errorf("%w: records kept changing during %d READs (%v)", ErrDirectory, p.dir.torn+1, now.Sub(p.dir.tornSince))
		}
		p.dir.torn = 0
		p.dir.done(regions, err, now)
		if err != nil {
			// Operations waiting for the directory cannot be checked.
			for _, q := range []*opQueue{&p.dcq, &p.rcq} {
				for _, u := range q.filter(func(x *op) bool { return x.sys }) {
					n.finishLocked(p, u, err, e)
				}
			}
		}
	}
	n.kickLocked(p, e)
	p.mu.Unlock()
	n.apply(e)
}

// A directory READ that finds a record in the middle of an update is
// repeated at once dirTornAtOnce times, then after a backoff that doubles
// from dirTornBackoff to dirTornBackoffMax, for as long as PeerTimeout: a
// writer on a loaded host can be descheduled for milliseconds in the
// middle of its update, longer than any number of READs back to back
// lasts.
const (
	dirTornAtOnce     = 4
	dirTornBackoff    = 100 * time.Microsecond
	dirTornBackoffMax = 20 * time.Millisecond
)

// refetchDir reads p's directory again after a torn READ's backoff.
func (n *Node) refetchDir(p *peer) {
	e := n.newEffects()
	p.mu.Lock()
	p.dir.fetching = false
	if p.closed {
		p.dir.done(nil, ErrClosed, n.clock.Now())
		p.dir.torn = 0
	} else {
		n.fetchDirLocked(p)
	}
	n.kickLocked(p, e)
	p.mu.Unlock()
	n.apply(e)
}

// reachable checks that this node can reach a peer of info's transport
// (an empty transport is softnic/udp, the transport of nodes that
// predate the field).
func (n *Node) reachable(info meta.NodeInfo) error {
	mine, theirs := n.cfg.Transport, info.Transport
	if mine == "" {
		mine = DefaultTransport
	}
	if theirs == "" {
		theirs = DefaultTransport
	}
	if mine != theirs {
		return fmt.Errorf("%w: gid %d speaks %s and this node %s (run both on the same backend)",
			ErrTransportMismatch, info.GID, theirs, mine)
	}
	return nil
}
