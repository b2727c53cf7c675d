package qpcore

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/verbs"
)

// Resolver finds how to reach a peer. The meta client implements it (a
// cache hit sends nothing on the network, a miss costs one READ of the
// meta server); tests use a map.
type Resolver interface {
	// Lookup returns the peer's current metadata, or an error wrapping
	// meta.ErrNotFound for an unknown gid.
	Lookup(ctx context.Context, gid uint32) (meta.NodeInfo, error)
	// Invalidate drops any cached metadata of gid: the data path found it
	// stale (a DC key or DCT number NAK, or a peer that stopped answering).
	Invalidate(gid uint32)
}

// peer is what this node keeps for one remote node. Lock order:
// Node.mu -> peer.mu -> (Node.dcMu | rcPool.mu | VQP.mu | memCache.mu);
// never two peers' mu at once.
type peer struct {
	n   *Node
	gid uint32

	// Guarded by Node.mu.
	refs int           // open VQPs and callers in the middle of an operation
	elem *list.Element // in Node.lru
	gone bool          // removed from the table

	ready chan struct{} // closed when the first lookup ended (lookupErr set)

	mu        sync.Mutex // guards everything below
	lookupErr error
	closed    bool
	info      meta.NodeInfo
	target    verbs.DCTarget
	pause     peerPause // re-lookup or RNR backoff, and its stalled ops (pause.go)

	live liveness // what its answers and silences say (liveness.go)

	dir dirCache // its region directory (dircache.go, peerdir.go)

	// DC endpoint.
	dci       *dciSlot
	grant     *dciSlot // a DCI handed over by Release; guarded by Node.dcMu
	dciPosted int      // WRs posted on dci in this turn (quota)
	dcq       opQueue

	// RC connection (rclink.go).
	rcOnly bool // no DC to this peer (this node or the peer has none): its DC queue goes on rc
	rc     rcLink
	rcq    opQueue

	held   fencedVQPs // VQPs with held ops (switching fence)
	sys    *VQP       // internal VQP: directory reads, messages
	active int        // ops not done
}

func (p *peer) queue(t Transport) *opQueue {
	if t == RC {
		return &p.rcq
	}
	return &p.dcq
}

// setInfoLocked adopts new metadata. A new incarnation or directory
// invalidates the directory cache; a new incarnation also drains the RC
// connection to the old one.
func (p *peer) setInfoLocked(info meta.NodeInfo) {
	old := p.info
	p.info = info
	p.target = verbs.DCTarget{Addr: info.Addr, DCTN: info.DCTN, DCKey: info.DCKey}
	p.rcOnly = p.n.cfg.NoDC || info.DCTN == 0
	if old.Incarnation != info.Incarnation || old.DirRKey != info.DirRKey || old.DirLen != info.DirLen ||
		old.MemRKey != info.MemRKey || old.MemLen != info.MemLen || old.MemOwnerKnown != info.MemOwnerKnown ||
		old.MemMode != info.MemMode || old.MemUID != info.MemUID || old.MemGID != info.MemGID {
		p.dir.reset(&p.info, p.n.clock)
	}
}

// idleLocked reports whether the peer holds no resources and no work.
func (p *peer) idleLocked() bool {
	if p.active != 0 || p.dci != nil || !p.rc.idle() || p.pause.active() || p.dir.fetching {
		return false
	}
	p.n.dcMu.Lock()
	defer p.n.dcMu.Unlock()
	return p.grant == nil && !p.n.arb.IsWaiting(p)
}

// peerRef finds or creates the peer for gid and takes a reference.
func (n *Node) peerRef(ctx context.Context, gid uint32) (*peer, error) {
	if gid == 0 {
		return nil, fmt.Errorf("%w: gid 0", ErrNoPeer)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	p := n.peers[gid]
	if p != nil {
		p.refs++
		n.lru.MoveToFront(p.elem)
		n.mu.Unlock()
		select {
		case <-p.ready:
		default:
			select {
			case <-p.ready:
			case <-ctx.Done():
				n.unref(p)
				return nil, ctx.Err()
			}
		}
		if p.lookupErr != nil {
			n.unref(p)
			return nil, p.lookupErr
		}
		n.stats.connectHits.Add(1)
		return p, nil
	}
	p = &peer{n: n, gid: gid, refs: 1, ready: make(chan struct{})}
	p.sys = &VQP{n: n, p: p, sys: true}
	p.elem = n.lru.PushFront(p)
	n.peers[gid] = p
	victims := n.evictLocked()
	n.mu.Unlock()
	for _, v := range victims {
		v.mu.Lock()
		v.closed = true
		v.mu.Unlock()
	}
	n.stats.connectMisses.Add(1)
	info, err := n.res.Lookup(ctx, gid)
	if err == nil && (info.GID != gid || !info.Addr.IsValid()) {
		err = fmt.Errorf("qpcore: resolver returned unusable metadata %+v for gid %d", info, gid)
	}
	switch {
	case err == nil:
		err = n.reachable(info)
	case errors.Is(err, meta.ErrNotFound):
		err = fmt.Errorf("%w %d: %w", ErrNoPeer, gid, err)
	default:
		// The meta service did not answer: say so, with its errno
		// (EHOSTDOWN, ETIMEDOUT), rather than "no such peer".
		err = fmt.Errorf("qpcore: looking up gid %d: %w", gid, err)
	}
	p.mu.Lock()
	p.lookupErr = err
	if err == nil {
		p.setInfoLocked(info)
	}
	p.mu.Unlock()
	close(p.ready)
	if err != nil {
		n.mu.Lock()
		if n.peers[gid] == p {
			delete(n.peers, gid)
			n.lru.Remove(p.elem)
			p.gone = true
		}
		p.refs--
		n.mu.Unlock()
		return nil, err
	}
	return p, nil
}

// unref drops a reference taken by peerRef.
func (n *Node) unref(p *peer) {
	n.mu.Lock()
	p.refs--
	n.mu.Unlock()
}

// evictLocked removes peers beyond MaxPeers, least recently used first,
// among those with no reference, no work and no connection. It returns
// the evicted peers.
func (n *Node) evictLocked() []*peer {
	var out []*peer
	for el := n.lru.Back(); el != nil && len(n.peers) > n.cfg.MaxPeers; {
		p := el.Value.(*peer)
		prev := el.Prev()
		if p.refs == 0 && p.mu.TryLock() {
			if p.idleLocked() {
				delete(n.peers, p.gid)
				n.lru.Remove(el)
				p.gone = true
				out = append(out, p)
				n.stats.peerEvictions.Add(1)
			}
			p.mu.Unlock()
		}
		el = prev
	}
	return out
}

// Forget drops what this node knows of gid (cached metadata and region
// directory) if nothing uses it, and invalidates the resolver's entry. The
// next Connect looks the peer up again. It reports whether the peer was
// dropped.
func (n *Node) Forget(gid uint32) bool {
	n.res.Invalidate(gid)
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.peers[gid]
	if p == nil {
		return true
	}
	if p.refs != 0 || !p.mu.TryLock() {
		return false
	}
	defer p.mu.Unlock()
	if !p.idleLocked() {
		return false
	}
	delete(n.peers, gid)
	n.lru.Remove(p.elem)
	p.gone = true
	return true
}
