package qpcore

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/meta"
)

// VQP is a virtual QP to one peer: a handle multiplexed on the node's
// shared DCIs, or on the peer's RC QP once the peer is hot. Operations of
// one VQP execute in the order they were posted, across transport
// switches. Its methods may be called concurrently.
type VQP struct {
	n   *Node
	p   *peer
	sys bool // the peer's internal VQP

	fence // guarded by p.mu (fence.go)

	postSeq uint64 // sequence number of the next async op; guarded by p.mu

	mu      sync.Mutex // guards the fields below
	closed  bool
	inUse   int // admitted ops not yet returned to the caller
	comps   []Completion
	nextSeq uint64                // next async op whose completion may be released
	early   map[uint64]Completion // completions that arrived before an earlier one
	notify  chan struct{}         // a completion was added (cap 1)
	space   chan struct{}         // inUse dropped (cap 1)
}

// WR is an asynchronous operation for Post.
type WR struct {
	// ID is returned in the operation's Completion.
	ID uint64
	Op OpCode
	// Local is the READ destination or the WRITE source. The caller must
	// not touch it until the completion. Unused by atomics.
	Local []byte
	// Region and Offset name the remote memory.
	Region string
	Offset uint64
	// Compare and Swap are CMP_SWAP's operands; Add is FETCH_ADD's.
	Compare, Swap, Add uint64
}

// Completion is the result of a posted WR.
type Completion struct {
	ID  uint64
	Op  OpCode
	Err error
	// Old is the remote word before an atomic.
	Old uint64
}

// PostFlags modify Post.
type PostFlags uint8

const (
	// NoBlock makes Post return ErrWouldBlock instead of waiting when the
	// VQP has VQPDepth operations outstanding.
	NoBlock PostFlags = 1 << iota
)

// Connect returns a VQP to the peer gid. A peer this node knows costs no
// lookup and no network traffic; an unknown one costs one Resolver.Lookup.
func (n *Node) Connect(ctx context.Context, gid uint32) (*VQP, error) {
	p, err := n.peerRef(ctx, gid)
	if err != nil {
		return nil, err
	}
	n.stats.vqpsOpen.Add(1)
	return &VQP{n: n, p: p, notify: make(chan struct{}, 1), space: make(chan struct{}, 1)}, nil
}

// Peer is the gid of the VQP's peer.
func (v *VQP) Peer() uint32 { return v.p.gid }

// PeerInfo is the peer's metadata as this node last resolved it.
func (v *VQP) PeerInfo() meta.NodeInfo {
	v.p.mu.Lock()
	defer v.p.mu.Unlock()
	return v.p.info
}

// Transport is the transport the VQP's operations take now: during a
// switch, the old one until the fence lifts.
func (v *VQP) Transport() Transport {
	p := v.p
	p.mu.Lock()
	defer p.mu.Unlock()
	return v.current(v.n.wantLocked(p, v))
}

// Close releases the VQP. Operations in flight complete (synchronous
// callers get their results; asynchronous completions are dropped).
func (v *VQP) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return ErrClosed
	}
	v.closed = true
	v.n.stats.vqpsOpen.Add(-1)
	idle := v.inUse == 0
	v.comps = nil
	v.mu.Unlock()
	if idle {
		v.n.unref(v.p)
	}
	return nil
}

// Read reads len(dst) bytes at off of the peer's region into dst, which
// the READ response lands in directly.
func (v *VQP) Read(ctx context.Context, dst []byte, region string, off uint64) error {
	_, err := v.do(ctx, WR{Op: OpRead, Local: dst, Region: region, Offset: off})
	return err
}

// PendingRead is a READ that ReadStart posted. Its response lands in the
// destination buffer, which belongs to the NIC until Wait returns.
type PendingRead struct {
	v      *VQP
	o      *op
	err    error
	waited bool
	taken  bool // Await received the op's done signal (a device that cannot be driven)
}

// ReadStart posts a READ of len(dst) bytes at off of the peer's region, as
// Read does, and returns without waiting for it: a caller with more work
// (a FUSE ring thread with other requests) waits for it later, and READs
// started back to back leave together. Wait must be called exactly once
// for every READ started; dst must not be touched before it returns.
func (v *VQP) ReadStart(ctx context.Context, dst []byte, region string, off uint64) (*PendingRead, error) {
	if err := v.admit(ctx, 1, true); err != nil {
		return nil, err
	}
	wr := WR{Op: OpRead, Local: dst, Region: region, Offset: off}
	o, err := v.n.post(ctx, v, &wr)
	if err != nil {
		v.release(1)
		return nil, err
	}
	return &PendingRead{v: v, o: o}, nil
}

// Ready reports whether Wait would return at once: the READ has completed.
// It does not receive; a response still in the socket is not ready.
func (p *PendingRead) Ready() bool {
	return p.waited || p.o.fin.Load() != finPending
}

// Await waits at most d for the READ, receiving on the caller's thread as
// Wait does, and reports whether it completed (Wait then returns at once).
// It never withdraws the READ: a caller that also serves other work (a
// FUSE ring thread) awaits in slices and looks at that work in between.
func (p *PendingRead) Await(d time.Duration) bool {
	if p.Ready() {
		return true
	}
	n, o := p.v.n, p.o
	if n.dscq != nil {
		ready := o.ready
		if ready == nil {
			ready = func() bool { return n.opReady(o) }
		}
		ctx, cancel := clock.WithTimeout(context.Background(), n.clock, d)
		_ = n.dscq.Drive(ctx, o.done, ready)
		cancel()
		return p.Ready()
	}
	expired, stop := clock.After(n.clock, d)
	defer stop()
	for {
		select {
		case <-o.done:
			p.taken = true
			return true
		case <-n.scq.Notify():
			n.pollSend(1)
			if p.Ready() {
				return true
			}
		case <-expired:
			return p.Ready()
		}
	}
}

// Wait waits for the READ, receiving on the caller's thread as Read does
// (ctx ends the wait only for a READ not yet posted: once posted, the
// transport's timeouts bound it), and returns its error. Later calls
// return the same error.
func (p *PendingRead) Wait(ctx context.Context) error {
	if p.waited {
		return p.err
	}
	if !p.taken {
		p.v.n.wait(ctx, p.o)
	}
	p.err = p.o.err
	p.v.release(1)
	p.v.n.recycle(p.o)
	p.o, p.waited = nil, true
	return p.err
}

// Write writes src at off of the peer's region, sent from src itself.
func (v *VQP) Write(ctx context.Context, src []byte, region string, off uint64) error {
	_, err := v.do(ctx, WR{Op: OpWrite, Local: src, Region: region, Offset: off})
	return err
}

// CompareAndSwap sets the 8-byte word at off (8-byte aligned, host byte
// order of the peer) to swap if it equals cmp, and returns its old value.
func (v *VQP) CompareAndSwap(ctx context.Context, region string, off uint64, cmp, swap uint64) (uint64, error) {
	return v.do(ctx, WR{Op: OpCompareAndSwap, Region: region, Offset: off, Compare: cmp, Swap: swap})
}

// FetchAdd adds delta to the 8-byte word at off and returns its old value.
func (v *VQP) FetchAdd(ctx context.Context, region string, off uint64, delta uint64) (uint64, error) {
	return v.do(ctx, WR{Op: OpFetchAdd, Region: region, Offset: off, Add: delta})
}

// Send sends msg to port on the VQP's peer (see Node.Send).
func (v *VQP) Send(ctx context.Context, port uint32, msg []byte) error {
	return v.n.Send(ctx, v.p.gid, port, msg)
}

// Regions lists the peer's exported regions, from the directory cache
// (read from the peer if not cached).
func (v *VQP) Regions(ctx context.Context) ([]Region, error) {
	p := v.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := v.n.ensureDirLocked(ctx, p); err != nil {
		return nil, err
	}
	out := make([]Region, 0, len(p.dir.regions))
	for _, r := range p.dir.regions {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Region returns one region of the peer, refreshing the directory once if
// the name is unknown.
func (v *VQP) Region(ctx context.Context, name string) (Region, error) {
	p := v.p
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := v.n.regionLocked(ctx, p, name)
	return r, err
}

// do runs one operation synchronously.
func (v *VQP) do(ctx context.Context, wr WR) (uint64, error) {
	if err := v.admit(ctx, 1, true); err != nil {
		return 0, err
	}
	o, err := v.n.post(ctx, v, &wr)
	if err != nil {
		v.release(1)
		return 0, err
	}
	v.n.wait(ctx, o)
	old, err := o.old, o.err
	v.release(1)
	v.n.recycle(o)
	return old, err
}

// Post posts a batch of operations with one doorbell per QP it reaches
// and returns how many were posted. Each posted WR yields one Completion
// (see Poll). A WR refused by the pre-check stops the batch with a
// *PostError; when the VQP has VQPDepth operations outstanding, Post
// waits for room, or returns ErrWouldBlock with NoBlock. The first Post to
// a peer reads its region directory.
func (v *VQP) Post(ctx context.Context, wrs []WR, flags PostFlags) (int, error) {
	posted := 0
	for posted < len(wrs) {
		k, err := v.admitUpTo(ctx, len(wrs)-posted, flags&NoBlock == 0)
		if err != nil {
			return posted, err
		}
		m, err := v.n.postBatch(ctx, v, wrs[posted:posted+k], posted)
		posted += m
		if m < k {
			v.release(k - m)
		}
		if err != nil {
			return posted, err
		}
	}
	return posted, nil
}

// Poll moves up to len(cs) completions into cs and returns how many.
func (v *VQP) Poll(cs []Completion) int {
	v.mu.Lock()
	k := copy(cs, v.comps)
	if k > 0 {
		rest := copy(v.comps, v.comps[k:])
		clear(v.comps[rest:])
		v.comps = v.comps[:rest]
		v.inUse -= k
		select {
		case v.space <- struct{}{}:
		default:
		}
	}
	v.mu.Unlock()
	return k
}

// Wait blocks until a completion can be polled, or ctx ends (with nothing
// outstanding, that is the only way out).
func (v *VQP) Wait(ctx context.Context) error {
	for {
		v.mu.Lock()
		ready, closed := len(v.comps) > 0, v.closed
		v.mu.Unlock()
		if ready {
			return nil
		}
		if closed {
			return ErrClosed
		}
		select {
		case <-v.notify:
		case <-v.n.scq.Notify():
			v.n.pollSend(1)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// admit reserves k operation slots, waiting if block.
func (v *VQP) admit(ctx context.Context, k int, block bool) error {
	for {
		v.mu.Lock()
		if v.closed {
			v.mu.Unlock()
			return ErrClosed
		}
		if v.inUse+k <= v.n.cfg.VQPDepth {
			v.inUse += k
			v.mu.Unlock()
			return nil
		}
		v.mu.Unlock()
		if !block {
			v.n.stats.reject(ErrWouldBlock)
			return ErrWouldBlock
		}
		if err := v.waitSpace(ctx); err != nil {
			return err
		}
	}
}

// admitUpTo reserves between 1 and k slots.
func (v *VQP) admitUpTo(ctx context.Context, k int, block bool) (int, error) {
	for {
		v.mu.Lock()
		if v.closed {
			v.mu.Unlock()
			return 0, ErrClosed
		}
		if free := v.n.cfg.VQPDepth - v.inUse; free > 0 {
			k = min(k, free)
			v.inUse += k
			v.mu.Unlock()
			return k, nil
		}
		v.mu.Unlock()
		if !block {
			v.n.stats.reject(ErrWouldBlock)
			return 0, ErrWouldBlock
		}
		if err := v.waitSpace(ctx); err != nil {
			return 0, err
		}
	}
}

func (v *VQP) waitSpace(ctx context.Context) error {
	recheck, stop := clock.After(v.n.clock, 10*time.Millisecond)
	defer stop()
	select {
	case <-v.space:
		return nil
	case <-v.n.scq.Notify():
		v.n.pollSend(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-recheck:
		return nil // re-check (a Poll by another goroutine may have made room)
	}
}

// release returns k slots.
func (v *VQP) release(k int) {
	v.mu.Lock()
	v.inUse -= k
	unref := v.closed && v.inUse == 0 && !v.sys
	v.mu.Unlock()
	select {
	case v.space <- struct{}{}:
	default:
	}
	if unref {
		v.n.unref(v.p)
	}
}

// complete hands an asynchronous op's result to the VQP.
func (v *VQP) complete(o *op) {
	v.mu.Lock()
	if v.closed {
		v.inUse--
		unref := v.inUse == 0
		v.mu.Unlock()
		if unref {
			v.n.unref(v.p)
		}
		return
	}
	c := Completion{ID: o.userID, Op: o.code, Err: o.err, Old: o.old}
	if o.seq != v.nextSeq {
		// Completions of one VQP are released in post order, whichever
		// goroutine delivers them.
		if v.early == nil {
			v.early = make(map[uint64]Completion)
		}
		v.early[o.seq] = c
		v.mu.Unlock()
		return
	}
	v.comps = append(v.comps, c)
	v.nextSeq++
	for {
		c, ok := v.early[v.nextSeq]
		if !ok {
			break
		}
		delete(v.early, v.nextSeq)
		v.comps = append(v.comps, c)
		v.nextSeq++
	}
	v.mu.Unlock()
	select {
	case v.notify <- struct{}{}:
	default:
	}
}
