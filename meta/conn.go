package meta

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// conn is a client's RC connection to one meta server: the QP that READs
// the table and carries messages, its CQ, and a registered buffer with a
// landing area per operation slot and the receive buffers.
//
// Operations. A caller takes an op slot (acquire), arms it, posts one or
// more WRs whose IDs name the slot and the op's sequence number, and
// waits. Whoever waits polls the CQ under pollMu and dispatches every
// completion to its slot, so a lone caller wakes for its own completion
// without a goroutine handoff, and concurrent callers share the polling.
// A completion or reply whose sequence number is not the slot's current
// one is stale and ignored.
//
// Failure. Any error completion kills the connection: the QP moves to
// ERR, every outstanding WR completes flushed, waiting callers get an
// error, and the client connects again. A caller whose context ends
// abandons its op; a READ slot returns to the pool only when its READ
// completes (until then the NIC may still write its landing area).
//
// Lifetime. users counts the server record's reference and each op in
// progress; the verbs resources are released when the connection is dead
// and unused.
type conn struct {
	cl   *Client
	addr netip.AddrPort
	boot Bootstrap
	geom tableGeom
	gen  uint64 // which connection to its server this is (1, 2, ...)

	qp       verbs.QP
	cq       verbs.CQ
	mem      []byte
	mr       verbs.MR
	slotSize int // landing area per op slot
	recvOff  int // offset of the receive buffers in mem
	nrecv    int

	ops  []op
	free chan int // free op slots

	// pollMu guards polling the CQ and everything dispatch touches: the
	// ops' state (but not their done channels' receive side), wcs,
	// reposts.
	pollMu  sync.Mutex
	wcs     []verbs.WC
	reposts []verbs.RecvWR

	// mu guards users, dead and released.
	mu       sync.Mutex
	users    int
	dead     bool
	released bool
	deadCh   chan struct{} // closed when dead

	lastTx atomic.Int64 // clock time (unix ns) of the last message sent

	// rtoMu guards the connection's RC ACK timeout (see ackTimeout). It is
	// taken with no other lock held.
	rtoMu        sync.Mutex
	rto          time.Duration // the QP's ACK timeout now
	rtoAt        time.Time     // clock time of the last change of rto or completion
	srtt, rttvar time.Duration // smoothed READ time and its variation; 0: no sample yet

	// listMu guards listMem and listMR, the landing area of List.
	listMu  sync.Mutex
	listMem []byte
	listMR  verbs.MR
}

type opKind uint8

const (
	opIdle opKind = iota
	opRead
	opRPC
)

// op is one operation slot. Guarded by the conn's pollMu, except done,
// which the owner receives from.
type op struct {
	kind      opKind
	seq       uint32
	finished  bool
	abandoned bool
	wc        verbs.WC
	reply     message
	err       error
	done      chan struct{} // capacity 1: a finished op's wake-up
}

// WR and request IDs. A send WR's ID is slot | seq<<16; a receive WR's
// is recvBit | buffer. A request ID is slot | (seq mod 2^22)<<10.
const (
	recvBit  = 1 << 63
	maxSlots = 1 << 10
	reqSeqs  = 1 << 22
)

func wrID(slot int, seq uint32) uint64 { return uint64(slot) | uint64(seq)<<16 }
func reqID(slot int, seq uint32) uint32 {
	return uint32(slot) | (seq%reqSeqs)<<10
}

// dial connects to the meta server at addr and returns a live conn with
// the caller's reference (users 1).
func (c *Client) dial(ctx context.Context, addr netip.AddrPort, gen uint64) (*conn, error) {
	return c.dialSpare(ctx, addr, gen, nil)
}

// spareQP is a QP and CQ kept from a connection attempt that the server
// rejected, for the next attempt to the same server.
type spareQP struct {
	qp verbs.QP
	cq verbs.CQ
}

// dialSpare is dial, keeping the QP and CQ of an attempt that the server
// rejected (busy, as in a start storm) for the next one, and using the
// one kept: the server made nothing for the request, and
// the QP is back in RESET with nothing posted. A node backing off from a
// busy service then does not make and drop a QP and CQ per attempt (most
// of what a 10,000-node storm allocated). s, if not nil, is the server
// record whose spare (guarded by its mu) is used and kept.
func (c *Client) dialSpare(ctx context.Context, addr netip.AddrPort, gen uint64, s *server) (*conn, error) {
	cfg := &c.cfg
	var qp verbs.QP
	var cq verbs.CQ
	if s != nil {
		s.mu.Lock()
		qp, cq = s.spare.qp, s.spare.cq
		s.spare = spareQP{}
		s.mu.Unlock()
	}
	if qp == nil {
		var err error
		if cq, err = c.dev.CreateCQ(2*cfg.Depth + 2*(cfg.Depth+16) + 64); err != nil {
			return nil, err
		}
		qp, err = c.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq, RecvCQ: cq,
			Caps: verbs.QPCaps{MaxSendWR: 2*cfg.Depth + 8, MaxRecvWR: cfg.Depth + 16, MaxInline: MaxMessage}})
		if err != nil {
			cq.Destroy()
			return nil, err
		}
	}
	fail := func(err error) (*conn, error) {
		qp.Destroy()
		cq.Destroy()
		return nil, err
	}
	priv, err := c.dev.ConnectRC(ctx, qp, addr, cfg.Service, verbs.ConnParams{
		Timeout: cfg.QPTimeout, RetryCnt: cfg.QPRetryCnt, Private: bootRequest()})
	if err != nil {
		if s != nil && errors.Is(err, verbs.ErrCMRejected) && qp.State() == verbs.StateReset {
			s.mu.Lock()
			// Close takes the spares after it marks the client closed.
			keep := s.spare.qp == nil && !c.closed()
			if keep {
				s.spare = spareQP{qp, cq}
			}
			s.mu.Unlock()
			if keep {
				return nil, err
			}
		}
		return fail(err)
	}
	boot, err := parseBootstrap(priv)
	if err != nil {
		return fail(err)
	}
	g, _ := boot.geom()
	cn := &conn{cl: c, addr: addr, boot: boot, geom: g, gen: gen, qp: qp, cq: cq,
		slotSize: g.nbhdBytes(), nrecv: cfg.Depth + 16, users: 1, deadCh: make(chan struct{})}
	cn.recvOff = cfg.Depth * cn.slotSize
	cn.mem = make([]byte, cn.recvOff+cn.nrecv*MaxMessage)
	if cn.mr, err = c.pd.RegMR(cn.mem, verbs.AccessLocalWrite); err != nil {
		return fail(err)
	}
	cn.ops = make([]op, cfg.Depth)
	cn.free = make(chan int, cfg.Depth)
	for i := range cn.ops {
		cn.ops[i].done = make(chan struct{}, 1)
		cn.free <- i
	}
	wrs := make([]verbs.RecvWR, cn.nrecv)
	for i := range wrs {
		wrs[i] = cn.recvWR(i)
	}
	if err := qp.PostRecv(wrs); err != nil {
		cn.mr.Dereg()
		return fail(err)
	}
	cn.wcs = make([]verbs.WC, 64)
	cn.lastTx.Store(c.clock.Now().UnixNano())
	cn.rto, cn.rtoAt = cfg.QPTimeout, c.clock.Now()
	if err := c.authenticate(ctx, cn); err != nil {
		cn.kill()
		cn.unref()
		return nil, err
	}
	return cn, nil
}

// The connection's RC ACK timeout adapts to what the server can do, as
// TCP's retransmission timeout does (RFC 6298), on the client's clock.
//
// The NIC retransmits a request whose ACK or response is late every ACK
// timeout, and a meta server that is slow (its host starved of CPU, many
// nodes asking at once) answers every copy it finds in its socket,
// however late: at a fixed 125 ms, an operation that waited 2 s behind a
// backlog was sent 16 times and answered 16 times, so the backlog and
// every answer's delay grew until connections failed. So an operation
// still waiting after the current timeout doubles it (up to
// MaxQPTimeout), as the QP's new ACK timeout, which the NIC reads at its
// next expiry: the copies of one request grow with the log of the
// server's delay, not linearly. A completion that was never late gives a
// sample of the server's time (Karn: a late one may answer an earlier
// copy); the timeout falls back to the smoothed time plus four times its
// variation, never below ClientConfig.QPTimeout.

// ackTimeout returns the connection's current ACK timeout.
func (cn *conn) ackTimeout() time.Duration {
	cn.rtoMu.Lock()
	defer cn.rtoMu.Unlock()
	return cn.rto
}

// late is called by an operation that has waited the ACK timeout it read
// (rto) without completing: the timeout doubles, unless another operation
// (or a completion) changed it less than a timeout ago.
func (cn *conn) late(rto time.Duration) {
	cfg := &cn.cl.cfg
	now := cn.cl.clock.Now()
	cn.rtoMu.Lock()
	if cn.rto != rto || now.Sub(cn.rtoAt) < cn.rto || cn.rto >= cfg.MaxQPTimeout {
		cn.rtoMu.Unlock()
		return
	}
	cn.rto = min(2*cn.rto, cfg.MaxQPTimeout)
	cn.rtoAt = now
	next := cn.rto
	cn.rtoMu.Unlock()
	cn.cl.st.backoffs.Add(1)
	cn.setAckTimeout(next)
}

// took records that an operation completed after d; clean says it never
// waited past the ACK timeout (its answer is to its first copy).
func (cn *conn) took(d time.Duration, clean bool) {
	cfg := &cn.cl.cfg
	cn.rtoMu.Lock()
	cn.rtoAt = cn.cl.clock.Now()
	if !clean {
		cn.rtoMu.Unlock()
		return
	}
	if cn.srtt == 0 {
		cn.srtt, cn.rttvar = d, d/2
	} else {
		cn.rttvar = (3*cn.rttvar + (cn.srtt - d).Abs()) / 4
		cn.srtt = (7*cn.srtt + d) / 8
	}
	want := min(max(cn.srtt+4*cn.rttvar, cfg.QPTimeout), cfg.MaxQPTimeout)
	changed := want != cn.rto
	cn.rto = want
	cn.rtoMu.Unlock()
	if changed {
		cn.setAckTimeout(want)
	}
}

// setAckTimeout makes d the QP's ACK timeout. A QP that is no longer in
// RTS (dead) keeps the old one.
func (cn *conn) setAckTimeout(d time.Duration) {
	_ = cn.qp.Modify(verbs.QPAttr{State: verbs.StateRTS, Timeout: d})
}

// rpcTimeout is how long an RPC waits for its reply: RPCTimeout, or the
// NIC's retry budget at the current ACK timeout if that is longer (a
// reply that the NIC is still trying to get is not given up on).
func (cn *conn) rpcTimeout() time.Duration {
	cfg := &cn.cl.cfg
	return max(cfg.RPCTimeout, cn.ackTimeout()*time.Duration(cfg.QPRetryCnt+1))
}

func (cn *conn) recvWR(i int) verbs.RecvWR {
	return verbs.RecvWR{ID: recvBit | uint64(i),
		Local: verbs.SGE{MR: cn.mr, Offset: uint64(cn.recvOff + i*MaxMessage), Length: MaxMessage}}
}

// ref takes a reference for an operation; false if the conn is dead.
func (cn *conn) ref() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.dead {
		return false
	}
	cn.users++
	return true
}

// unref drops a reference, releasing the resources of a dead conn when
// it was the last.
func (cn *conn) unref() {
	cn.mu.Lock()
	cn.users--
	rel := cn.dead && cn.users == 0 && !cn.released
	if rel {
		cn.released = true
	}
	cn.mu.Unlock()
	if rel {
		cn.qp.Destroy()
		cn.mr.Dereg()
		cn.listMu.Lock()
		if cn.listMR != nil {
			cn.listMR.Dereg()
		}
		cn.listMu.Unlock()
		cn.cq.Destroy()
	}
}

func (cn *conn) isDead() bool {
	select {
	case <-cn.deadCh:
		return true
	default:
		return false
	}
}

// kill marks the conn dead and moves its QP to ERR, which flushes every
// outstanding WR.
func (cn *conn) kill() {
	cn.mu.Lock()
	if cn.dead {
		cn.mu.Unlock()
		return
	}
	cn.dead = true
	cn.mu.Unlock()
	// ERR first, so that once deadCh is closed the NIC no longer writes
	// any landing area.
	_ = cn.qp.Modify(verbs.QPAttr{State: verbs.StateErr})
	close(cn.deadCh)
	cn.cl.poke() // its server is down: maintain reconnects at its next tick
}

// acquire takes an op slot and arms it as kind. The caller holds a
// reference.
func (cn *conn) acquire(ctx context.Context, kind opKind) (int, uint32, error) {
	var slot int
	if cn.isDead() {
		return 0, 0, cn.deadErr()
	}
	select {
	case slot = <-cn.free:
	default:
		select {
		case slot = <-cn.free:
		case <-cn.deadCh:
			return 0, 0, cn.deadErr()
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	cn.pollMu.Lock()
	o := &cn.ops[slot]
	o.seq++
	o.kind, o.finished, o.abandoned, o.err = kind, false, false, nil
	o.wc, o.reply = verbs.WC{}, message{}
	seq := o.seq
	cn.pollMu.Unlock()
	return slot, seq, nil
}

// finish returns a slot whose op completed.
func (cn *conn) finish(slot int) {
	cn.pollMu.Lock()
	o := &cn.ops[slot]
	o.kind = opIdle
	cn.pollMu.Unlock()
	select {
	case <-o.done:
	default:
	}
	cn.free <- slot
}

func (cn *conn) deadErr() error {
	return fmt.Errorf("%w: connection to %v failed", ErrUnreachable, cn.addr)
}

// wait waits until the op in slot finishes, polling the CQ meanwhile. On
// a timeout or a cancelled ctx it abandons the op and returns the error;
// the slot is then no longer the caller's.
//
// A READ (adapt) is timed from its post on the client's clock: one that
// completes gives the ACK timeout a sample, one that waits past the ACK
// timeout makes it back off (see ackTimeout). An RPC backs off the same
// way - its SEND is resent every ACK timeout until the server's NIC
// acknowledges it, and a slow server must not get a copy every 125 ms -
// but gives no sample: its reply may wait for the server's table WRITEs,
// after the NIC's ACK.
func (cn *conn) wait(ctx context.Context, slot int, seq uint32, timeout <-chan struct{}, adapt bool) (abandoned bool, err error) {
	o := &cn.ops[slot]
	clk := cn.cl.clock
	var t0 time.Time
	var rto time.Duration
	var ackC <-chan struct{}
	stopAck := func() bool { return false }
	cn.pollMu.Lock()
	rpc := o.kind == opRPC
	cn.pollMu.Unlock()
	if adapt || rpc {
		t0, rto = clk.Now(), cn.ackTimeout()
		ackC, stopAck = clock.After(clk, rto)
	}
	defer func() { stopAck() }()
	clean := true
	for {
		cn.pollMu.Lock()
		cn.pollLocked()
		if o.finished {
			select {
			case <-o.done:
			default:
			}
			cn.pollMu.Unlock()
			if adapt && o.err == nil {
				cn.took(clk.Now().Sub(t0), clean)
			}
			return false, o.err
		}
		cn.pollMu.Unlock()
		select {
		case <-o.done:
			// Finished: the next round sees it under pollMu.
		case <-ackC:
			clean = false
			cn.late(rto)
			rto = cn.ackTimeout()
			stopAck()
			ackC, stopAck = clock.After(clk, rto)
		case <-cn.cq.Notify():
		case <-cn.deadCh:
			// Flushed completions may still be on their way; give up
			// unless they are already here.
			cn.pollMu.Lock()
			cn.pollLocked()
			fin := o.finished
			cn.pollMu.Unlock()
			if !fin {
				return cn.abandon(slot, seq), cn.deadErr()
			}
		case <-timeout:
			return cn.abandon(slot, seq), fmt.Errorf("%w: %v did not answer in time", ErrUnreachable, cn.addr)
		case <-ctx.Done():
			return cn.abandon(slot, seq), ctx.Err()
		}
	}
}

// abandon gives up the op in slot. An RPC's slot is free at once (a late
// reply no longer matches its sequence number); a READ's slot waits for
// the READ's completion. It reports false if the op had finished after
// all (the caller still owns the slot then).
func (cn *conn) abandon(slot int, seq uint32) bool {
	cn.pollMu.Lock()
	o := &cn.ops[slot]
	if o.finished || o.seq != seq {
		cn.pollMu.Unlock()
		return false
	}
	if o.kind == opRead && !cn.isDead() {
		o.abandoned = true
		cn.pollMu.Unlock()
		return true
	}
	o.seq++ // anything late is stale now
	o.kind = opIdle
	cn.pollMu.Unlock()
	select {
	case <-o.done:
	default:
	}
	cn.free <- slot
	return true
}

// pollLocked moves completions from the CQ to their ops. pollMu held.
func (cn *conn) pollLocked() {
	for {
		n := cn.cq.Poll(cn.wcs)
		for i := range cn.wcs[:n] {
			cn.dispatchLocked(&cn.wcs[i])
		}
		if n < len(cn.wcs) {
			break
		}
	}
	if len(cn.reposts) > 0 && !cn.isDead() {
		if err := cn.qp.PostRecv(cn.reposts); err != nil {
			cn.kill()
		}
	}
	cn.reposts = cn.reposts[:0]
}

func (cn *conn) dispatchLocked(wc *verbs.WC) {
	if wc.ID&recvBit != 0 {
		if wc.Status != verbs.StatusSuccess {
			cn.kill()
			return
		}
		buf := int(wc.ID &^ recvBit)
		off := cn.recvOff + buf*MaxMessage
		m, err := parseMessage(cn.mem[off : off+int(min(wc.ByteLen, MaxMessage))])
		cn.reposts = append(cn.reposts, cn.recvWR(buf))
		if err != nil || m.kind&replyBit == 0 {
			cn.cl.st.strayReplies.Add(1)
			return
		}
		slot := int(m.reqID % maxSlots)
		if slot >= len(cn.ops) {
			cn.cl.st.strayReplies.Add(1)
			return
		}
		o := &cn.ops[slot]
		if o.kind != opRPC || o.finished || reqID(slot, o.seq) != m.reqID {
			cn.cl.st.strayReplies.Add(1)
			return
		}
		o.reply = m
		cn.finishLocked(o)
		return
	}
	if wc.Status != verbs.StatusSuccess {
		cn.kill()
	}
	slot := int(wc.ID & 0xffff)
	if slot >= len(cn.ops) {
		return
	}
	o := &cn.ops[slot]
	if o.seq != uint32(wc.ID>>16) || o.finished || o.kind == opIdle {
		return
	}
	if o.abandoned {
		o.kind, o.abandoned = opIdle, false
		o.seq++
		cn.free <- slot // never blocks: the slot was taken from it
		return
	}
	if wc.Status != verbs.StatusSuccess {
		o.err = fmt.Errorf("%w: %v: %v", ErrUnreachable, cn.addr, wc.Err())
		o.wc = *wc
		cn.finishLocked(o)
		return
	}
	if o.kind == opRead {
		o.wc = *wc
		cn.finishLocked(o)
	}
}

func (cn *conn) finishLocked(o *op) {
	o.finished = true
	select {
	case o.done <- struct{}{}:
	default:
	}
	cn.wakeDriver()
}

// call sends request m and waits for its reply (at most the client's
// RPC timeout).
func (cn *conn) call(ctx context.Context, m message) (message, error) {
	slot, seq, err := cn.acquire(ctx, opRPC)
	if err != nil {
		return message{}, err
	}
	m.reqID = reqID(slot, seq)
	var buf [MaxMessage]byte
	wr := verbs.SendWR{ID: wrID(slot, seq), Op: verbs.OpSend, Flags: verbs.Inline, InlineData: m.append(buf[:0])}
	cn.lastTx.Store(cn.cl.clock.Now().UnixNano())
	if err := cn.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		cn.kill()
		cn.abandon(slot, seq)
		return message{}, fmt.Errorf("%w: %v: %v", ErrUnreachable, cn.addr, err)
	}
	if m.kind == kindBye {
		cn.abandon(slot, seq)
		return message{}, nil
	}
	timeout, stop := clock.After(cn.cl.clock, cn.rpcTimeout())
	abandoned, err := cn.wait(ctx, slot, seq, timeout, false)
	stop()
	if err != nil {
		if !abandoned {
			cn.finish(slot)
		}
		return message{}, err
	}
	cn.pollMu.Lock()
	rep := cn.ops[slot].reply
	cn.pollMu.Unlock()
	cn.finish(slot)
	cn.cl.st.rpcs.Add(1)
	if rep.kind != m.kind|replyBit {
		return rep, fmt.Errorf("meta: %v answered with %v", m.kind, rep.kind)
	}
	return rep, nil
}
