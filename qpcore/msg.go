package qpcore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// Two-sided messaging. A node binds ports and receives messages on them;
// any node sends to (gid, port). Messages travel as SENDs to the
// receiver's DCT (its SRQ holds RecvBuffers posted buffers of
// MsgThreshold bytes plus a header):
//
//   - small (shorter than MsgThreshold): the sender copies header and
//     payload into a registered bounce buffer and SENDs it; the receiver's
//     NIC places it in a posted buffer, and Recv copies it into the
//     caller's buffer and posts the buffer again. Two copies per byte.
//   - large (MsgThreshold or more), zero-copy rendezvous: the sender
//     registers the caller's buffer as a temporary remotely-readable MR and
//     SENDs only a header (RTS: length, rkey, token); Recv READs the
//     message straight into the caller's buffer and SENDs a FIN back; the
//     sender then deregisters the MR and returns. No copy by krfs.
//     If no reader took an announced message within MsgStageAfter, the
//     receiver pulls it into memory of its own (at most MsgStageMax bytes
//     staged at once) so that the sender returns; the reader then gets a
//     copy, counted in MsgLargeCopied.
//
// A receiver that posted no buffer answers with RNR NAKs; the sender's
// DCI retries, then qpcore retries after a backoff until MsgTimeout.
// Messages from one sender to one port arrive in order.
//
// Receive buffers grow on demand. A node posts initialRecvBuffers at
// start, enough to refuse messages to ports it has not bound, and the
// rest of RecvBuffers when its first port is bound. Registered up front,
// the default 64 buffers of 64 KiB made a new process's heap pass the
// garbage collector's first goal (4 MiB) during its start, and the
// collection that followed slowed its first connects and READs 2-5x.
//
// Ports and backpressure. Each port queues at most PortDepth messages;
// a small message waits in its receive buffer until read, so PortDepth
// (below RecvBuffers) is also what one slow reader can hold of the shared
// receive buffers: a full port never stops messages to the others. The
// receiver answers every small message and every RTS with a verdict (a
// FIN carrying the sender's token): queued, no such port, or port full.
// Send returns when the message is queued (small) or pulled (large);
// to an unbound port it fails with ErrNoPort; on a full port it retries
// after a growing back-off until ctx ends, then fails with ErrPortFull
// (EAGAIN). A rendezvous whose sender gave up (timed out and
// deregistered its buffer) is skipped by the reader, counted as dropped.
//
// Header (48 bytes, little endian): magic u16, kind u8, status u8, port
// u32, source gid u32, rkey u32, length u64, token u64, incarnation u64,
// raddr u64. An RTS's rkey and raddr name the message: raddr is the
// remote address of its first byte, its MR's IOVA (the caller's buffer
// need not start on a page boundary, so its MR is not zero-based; see
// verbs.MR.IOVA). The magic changed with raddr: a node of a release
// before it is refused as malformed, never misread.

const (
	msgMagic  = 0x4d4c
	msgHdrLen = 48

	msgData = 1
	msgRTS  = 2
	msgFIN  = 3

	// FIN statuses: the outcome of a rendezvous (finOK, finNoPort,
	// finFailed), or a receiver's verdict on a message that asked for
	// one (finOK: queued; finNoPort; finFull: the port's queue is full).
	finOK     = 0
	finNoPort = 1
	finFailed = 2
	finFull   = 3
)

type msgHdr struct {
	kind, status uint8
	port, src    uint32
	rkey         uint32
	length       uint64
	token        uint64
	inc          uint64
	raddr        uint64 // an RTS's message: the remote address of its first byte
}

func (h *msgHdr) put(b []byte) {
	binary.LittleEndian.PutUint16(b[0:], msgMagic)
	b[2], b[3] = h.kind, h.status
	binary.LittleEndian.PutUint32(b[4:], h.port)
	binary.LittleEndian.PutUint32(b[8:], h.src)
	binary.LittleEndian.PutUint32(b[12:], h.rkey)
	binary.LittleEndian.PutUint64(b[16:], h.length)
	binary.LittleEndian.PutUint64(b[24:], h.token)
	binary.LittleEndian.PutUint64(b[32:], h.inc)
	binary.LittleEndian.PutUint64(b[40:], h.raddr)
}

func parseMsgHdr(b []byte) (msgHdr, bool) {
	if len(b) < msgHdrLen || binary.LittleEndian.Uint16(b) != msgMagic {
		return msgHdr{}, false
	}
	h := msgHdr{kind: b[2], status: b[3], port: binary.LittleEndian.Uint32(b[4:]),
		src: binary.LittleEndian.Uint32(b[8:]), rkey: binary.LittleEndian.Uint32(b[12:]),
		length: binary.LittleEndian.Uint64(b[16:]), token: binary.LittleEndian.Uint64(b[24:]),
		inc: binary.LittleEndian.Uint64(b[32:]), raddr: binary.LittleEndian.Uint64(b[40:])}
	return h, h.kind >= msgData && h.kind <= msgFIN
}

type bounceBuf struct {
	buf []byte
	mr  verbs.MR
}

// initialRecvBuffers is how many receive buffers a node posts before it
// binds a port (see "Receive buffers grow on demand").
const initialRecvBuffers = 4

// recvChunk is registered memory holding receive buffers first,
// first+1, ... of bufSize bytes each.
type recvChunk struct {
	buf   []byte
	mr    verbs.MR
	first int
}

// msgState is a node's messaging side.
type msgState struct {
	n       *Node
	bufSize int
	// chunks holds the receive buffers: the initial ones, and the rest
	// once a port is bound. A chunk is appended under mu before any of
	// its buffers is posted, and the slice is replaced, never changed in
	// place, so whoever holds a buffer's index (from its completion)
	// finds its chunk with a load.
	chunks atomic.Pointer[[]recvChunk]
	bounce chan *bounceBuf

	mu      sync.Mutex // guards the fields below
	staged  int64      // bytes of staged messages (at most MsgStageMax)
	ports   map[uint32]*Port
	rdv     map[uint64]chan uint8 // rendezvous sends waiting for their FIN
	token   uint64
	bounces []*bounceBuf
	closed  bool
	posted  int // receive buffers registered and posted so far
}

func (m *msgState) init(n *Node) error {
	m.n = n
	m.bufSize = n.cfg.MsgThreshold + msgHdrLen
	m.ports = make(map[uint32]*Port)
	m.rdv = make(map[uint64]chan uint8)
	m.bounce = make(chan *bounceBuf, n.cfg.SendBuffers)
	m.chunks.Store(&[]recvChunk{})
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.growLocked(min(initialRecvBuffers, n.cfg.RecvBuffers))
}

// growLocked registers and posts receive buffers up to a total of k.
func (m *msgState) growLocked(k int) error {
	if k <= m.posted {
		return nil
	}
	c := recvChunk{buf: make([]byte, (k-m.posted)*m.bufSize), first: m.posted}
	mr, err := m.n.pd.RegMR(c.buf, verbs.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("qpcore: registering receive buffers: %w", err)
	}
	c.mr = mr
	old := *m.chunks.Load()
	chunks := append(old[:len(old):len(old)], c)
	m.chunks.Store(&chunks)
	wrs := make([]verbs.RecvWR, k-m.posted)
	for i := range wrs {
		wrs[i] = m.recvWR(m.posted + i)
	}
	if err := m.n.target.SRQ().PostRecv(wrs); err != nil {
		return fmt.Errorf("qpcore: posting receive buffers: %w", err)
	}
	m.posted = k
	return nil
}

// slot returns receive buffer i's memory, its MR and its offset there.
func (m *msgState) slot(i int) ([]byte, verbs.MR, int) {
	chunks := *m.chunks.Load()
	for j := len(chunks) - 1; j >= 0; j-- {
		if c := chunks[j]; i >= c.first {
			off := (i - c.first) * m.bufSize
			return c.buf[off : off+m.bufSize], c.mr, off
		}
	}
	panic(fmt.Sprintf("qpcore: receive buffer %d was never posted", i))
}

func (m *msgState) recvWR(i int) verbs.RecvWR {
	_, mr, off := m.slot(i)
	return verbs.RecvWR{ID: uint64(i), Local: verbs.SGE{MR: mr, Offset: uint64(off), Length: uint32(m.bufSize)}}
}

func (m *msgState) repost(i int) {
	if err := m.n.target.SRQ().PostRecv([]verbs.RecvWR{m.recvWR(i)}); err != nil {
		m.n.stats.msgRepostErrors.Add(1)
	}
}

func (m *msgState) close() {
	m.mu.Lock()
	m.closed = true
	ports := m.ports
	m.ports = map[uint32]*Port{}
	bs := m.bounces
	m.bounces = nil
	m.mu.Unlock()
	for _, pt := range ports {
		pt.mu.Lock()
		pt.closed = true
		pt.q = nil
		pt.mu.Unlock()
		pt.wake()
	}
	for _, b := range bs {
		b.mr.Dereg()
	}
	for _, c := range *m.chunks.Load() {
		c.mr.Dereg()
	}
}

func (m *msgState) getBounce(ctx context.Context) (*bounceBuf, error) {
	select {
	case b := <-m.bounce:
		return b, nil
	default:
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	if len(m.bounces) < cap(m.bounce) {
		b := &bounceBuf{buf: make([]byte, m.bufSize)}
		mr, err := m.n.pd.RegMR(b.buf, verbs.AccessLocalWrite)
		if err != nil {
			m.mu.Unlock()
			return nil, err
		}
		b.mr = mr
		m.bounces = append(m.bounces, b)
		m.mu.Unlock()
		return b, nil
	}
	m.mu.Unlock()
	select {
	case b := <-m.bounce:
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Message describes a received message.
type Message struct {
	From     uint32 // sender's gid
	Len      int
	ZeroCopy bool // pulled by rendezvous straight into the buffer
}

// inMsg is a message waiting on a port: in receive buffer buf (small), or
// announced by an RTS (large).
type inMsg struct {
	kind  uint8
	from  uint32
	n     int
	buf   int
	rkey  uint32
	raddr uint64 // where the READ of a rendezvous message starts
	token uint64
	st    *stage // a large message pulled ahead of its reader
}

// stage is a large message that no reader took within MsgStageAfter: the
// receiver pulls it into memory of its own, so that the sender's write
// completes, and the reader later copies it out (a copy counted in
// MsgLargeCopied: zero-copy holds only for a reader that is waiting).
type stage struct {
	done chan struct{} // closed when the pull ended
	data []byte
	err  error
}

// Port is a bound receive port.
type Port struct {
	n   *Node
	num uint32

	mu     sync.Mutex // guards q and closed
	q      []inMsg
	closed bool
	notify chan struct{}
}

// Bind opens receive port num.
func (n *Node) Bind(num uint32) (*Port, error) {
	m := &n.msg
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if _, dup := m.ports[num]; dup {
		return nil, fmt.Errorf("%w: %d", ErrPortInUse, num)
	}
	if err := m.growLocked(n.cfg.RecvBuffers); err != nil {
		return nil, err
	}
	pt := &Port{n: n, num: num, notify: make(chan struct{}, 1)}
	m.ports[num] = pt
	return pt, nil
}

// Ports lists the bound ports.
func (n *Node) Ports() []uint32 {
	m := &n.msg
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]uint32, 0, len(m.ports))
	for k := range m.ports {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Num is the port number.
func (pt *Port) Num() uint32 { return pt.num }

func (pt *Port) wake() {
	select {
	case pt.notify <- struct{}{}:
	default:
	}
}

// Recv waits for the next message and places it in dst. A message longer
// than dst is not consumed: Recv returns ErrShortBuffer with its length in
// Message.Len. Large messages are READ straight into dst; one whose sender
// gave up waiting (its buffer is gone) is dropped, counted in MsgDropped,
// and Recv goes on with the next.
func (pt *Port) Recv(ctx context.Context, dst []byte) (Message, error) {
	return pt.recv(ctx, dst, true)
}

// TryRecv is Recv that does not wait: with no message queued it fails at
// once with ErrWouldBlock (EAGAIN), as a non-blocking read does.
func (pt *Port) TryRecv(ctx context.Context, dst []byte) (Message, error) {
	return pt.recv(ctx, dst, false)
}

func (pt *Port) recv(ctx context.Context, dst []byte, block bool) (Message, error) {
	n := pt.n
	for {
		pt.mu.Lock()
		if len(pt.q) > 0 {
			im := pt.q[0]
			if im.n > len(dst) {
				pt.mu.Unlock()
				return Message{From: im.from, Len: im.n}, fmt.Errorf("%w: %d bytes", ErrShortBuffer, im.n)
			}
			pt.q = pt.q[1:]
			more := len(pt.q) > 0
			pt.mu.Unlock()
			if more {
				pt.wake()
			}
			if im.st != nil {
				select {
				case <-im.st.done:
				case <-ctx.Done():
					pt.mu.Lock()
					pt.q = append([]inMsg{im}, pt.q...) // still the next message
					pt.mu.Unlock()
					pt.wake()
					return Message{}, ctx.Err()
				}
				if im.st.err != nil {
					n.unstage(im.st)
					n.stats.msgDropped.Add(1)
					continue
				}
				copy(dst, im.st.data)
				n.unstage(im.st)
				n.stats.msgLargeCopied.Add(uint64(im.n))
				return Message{From: im.from, Len: im.n}, nil
			}
			if im.kind == msgData {
				b, _, _ := n.msg.slot(im.buf)
				copy(dst, b[msgHdrLen:msgHdrLen+im.n])
				n.msg.repost(im.buf)
				n.stats.msgSmallBytes.Add(uint64(im.n))
				n.stats.msgSmallCopied.Add(uint64(im.n))
				n.stats.msgRecv.Add(1)
				return Message{From: im.from, Len: im.n}, nil
			}
			err := n.pull(ctx, &im, dst[:im.n])
			if withdrawn(err) {
				// The sender timed out and deregistered its buffer:
				// that message is lost to it (its Send failed), not to
				// the messages behind it.
				n.stats.msgDropped.Add(1)
				continue
			}
			return Message{From: im.from, Len: im.n, ZeroCopy: true}, err
		}
		if pt.closed {
			pt.mu.Unlock()
			return Message{}, ErrClosed
		}
		pt.mu.Unlock()
		if !block {
			return Message{}, ErrWouldBlock
		}
		select {
		case <-pt.notify:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
}

// Close unbinds the port; queued messages are dropped (rendezvous senders
// learn it at once).
func (pt *Port) Close() error {
	n := pt.n
	n.msg.mu.Lock()
	if n.msg.ports[pt.num] == pt {
		delete(n.msg.ports, pt.num)
	}
	n.msg.mu.Unlock()
	pt.mu.Lock()
	if pt.closed {
		pt.mu.Unlock()
		return ErrClosed
	}
	pt.closed = true
	q := pt.q
	pt.q = nil
	pt.mu.Unlock()
	pt.wake()
	for _, im := range q {
		n.dropMsg(&im)
	}
	return nil
}

// Queued is the number of messages waiting on the port.
func (pt *Port) Queued() int {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return len(pt.q)
}

func (n *Node) dropMsg(im *inMsg) {
	n.stats.msgDropped.Add(1)
	if im.kind == msgData {
		n.msg.repost(im.buf)
		return
	}
	if st := im.st; st != nil {
		// The sender already has its FIN (from the staging pull).
		n.goSafe(func() { <-st.done; n.unstage(st) })
		return
	}
	from, token := im.from, im.token
	n.goSafe(func() { n.sendFIN(from, token, finNoPort) })
}

// pollRecv processes receive completions (dispatcher goroutine).
func (n *Node) pollRecv() {
	for {
		k := n.rcq.Poll(n.rwcs[:])
		if k == 0 {
			return
		}
		for i := range k {
			n.onRecv(&n.rwcs[i])
		}
	}
}

func (n *Node) onRecv(wc *verbs.WC) {
	m := &n.msg
	i := int(wc.ID)
	if i < 0 || i >= n.cfg.RecvBuffers {
		return
	}
	if wc.Status != verbs.StatusSuccess {
		if wc.Status != verbs.StatusWRFlushErr {
			n.stats.msgMalformed.Add(1)
			m.repost(i)
		}
		return
	}
	b, _, _ := m.slot(i)
	b = b[:min(int(wc.ByteLen), m.bufSize)]
	h, ok := parseMsgHdr(b)
	if !ok || (h.kind == msgData && uint64(len(b)-msgHdrLen) != h.length) {
		n.stats.msgMalformed.Add(1)
		m.repost(i)
		return
	}
	if h.kind == msgFIN {
		m.repost(i)
		m.mu.Lock()
		ch := m.rdv[h.token]
		m.mu.Unlock()
		if ch != nil {
			select {
			case ch <- h.status:
			default:
			}
		}
		return
	}
	im := inMsg{kind: h.kind, from: h.src, n: int(h.length), buf: i, rkey: h.rkey, raddr: h.raddr, token: h.token}
	if h.kind == msgRTS {
		m.repost(i)
		im.buf = -1
	}
	m.mu.Lock()
	pt := m.ports[h.port]
	m.mu.Unlock()
	verdict := uint8(finNoPort)
	if pt != nil {
		pt.mu.Lock()
		switch {
		case pt.closed:
		case len(pt.q) >= n.cfg.PortDepth:
			verdict = finFull
		default:
			pt.q = append(pt.q, im)
			pt.mu.Unlock()
			pt.wake()
			if h.kind == msgData && h.token != 0 {
				n.goSafe(func() { n.sendFIN(h.src, h.token, finOK) })
			}
			if h.kind == msgRTS {
				from, tok := h.src, h.token
				n.clock.AfterFunc(n.cfg.MsgStageAfter, func() { n.stageUnread(pt, from, tok) })
			}
			return
		}
		pt.mu.Unlock()
	}
	// Refused: the sender learns why (a sender that asked for no verdict,
	// token 0, sees its message dropped).
	n.stats.msgRefused.Add(1)
	if h.kind == msgData {
		m.repost(im.buf)
	}
	if h.token != 0 {
		n.goSafe(func() { n.sendFIN(h.src, h.token, verdict) })
	}
}

// Send sends msg to port on peer gid and returns once it is queued on
// the port (small) or pulled by the reader (large). It fails with
// ErrNoPort if the port is not bound, and with ErrPortFull if the port's
// queue stayed full until ctx ended (it retries meanwhile). A small
// message whose attempt was on its way when ctx ended may still be
// queued by the receiver after Send returned its error, if the port has
// room by the time it arrives.
func (n *Node) Send(ctx context.Context, gid uint32, port uint32, msg []byte) error {
	p, err := n.peerRef(ctx, gid)
	if err != nil {
		return err
	}
	defer n.unref(p)
	h := msgHdr{port: port, src: n.gid.Load(), length: uint64(len(msg)), inc: n.incarnation}
	var mr verbs.MR
	if len(msg) < n.cfg.MsgThreshold {
		h.kind = msgData
	} else {
		if mr, err = n.pd.RegMR(msg, verbs.AccessRemoteRead); err != nil {
			return fmt.Errorf("qpcore: exposing a message: %w", err)
		}
		defer mr.Dereg()
		h.kind, h.rkey, h.raddr = msgRTS, mr.RKey(), mr.IOVA()
	}
	ch := make(chan uint8, 2)
	n.msg.mu.Lock()
	n.msg.token++
	tok := n.msg.token
	n.msg.rdv[tok] = ch
	n.msg.mu.Unlock()
	defer func() {
		n.msg.mu.Lock()
		delete(n.msg.rdv, tok)
		n.msg.mu.Unlock()
	}()
	h.token = tok
	if h.src == 0 && h.kind == msgData {
		// A node outside the meta service (a benchmark client) cannot be
		// answered: its message is sent as is, without a verdict.
		h.token = 0
		if err := n.sendSmall(ctx, p, &h, msg); err != nil {
			return err
		}
		n.stats.msgSent.Add(1)
		return nil
	}
	backoff := time.Millisecond
	full := false // the port was full at least once
	portFull := func() error {
		return fmt.Errorf("%w: port %d on gid %d until %v", ErrPortFull, port, gid, context.Cause(ctx))
	}
	for {
		payload := msg
		if h.kind == msgRTS {
			payload = nil
		}
		if err := n.sendSmall(ctx, p, &h, payload); err != nil {
			if full && ctx.Err() != nil {
				return portFull()
			}
			return err
		}
		timeout, stop := clock.After(n.clock, n.cfg.MsgTimeout)
		var st uint8
		select {
		case st = <-ch:
			stop()
		case <-ctx.Done():
			stop()
			if full {
				return portFull()
			}
			return ctx.Err()
		case <-timeout:
			if h.kind == msgData {
				return fmt.Errorf("%w: no answer from the receiver within %v", ErrTimeout, n.cfg.MsgTimeout)
			}
			return fmt.Errorf("%w: receiver did not pull the message within %v", ErrTimeout, n.cfg.MsgTimeout)
		}
		switch st {
		case finOK:
			n.stats.msgSent.Add(1)
			if h.kind == msgRTS {
				n.stats.msgRendezvous.Add(1)
			}
			return nil
		case finNoPort:
			return fmt.Errorf("%w: %d on gid %d", ErrNoPort, port, gid)
		case finFull:
			full = true
			n.stats.msgFullRetries.Add(1)
			wait, stop := clock.After(n.clock, backoff)
			select {
			case <-wait:
			case <-ctx.Done():
				stop()
				return portFull()
			}
			backoff = min(2*backoff, 50*time.Millisecond)
		default:
			return fmt.Errorf("%w: the receiver could not pull the message", ErrRemote)
		}
	}
}

// sendSmall SENDs header h and payload through a bounce buffer.
func (n *Node) sendSmall(ctx context.Context, p *peer, h *msgHdr, payload []byte) error {
	b, err := n.msg.getBounce(ctx)
	if err != nil {
		return err
	}
	defer func() { n.msg.bounce <- b }()
	h.put(b.buf)
	copy(b.buf[msgHdrLen:], payload)
	n.stats.msgSmallCopied.Add(uint64(len(payload)))
	o := newOp()
	o.v, o.p, o.code, o.sys = p.sys, p, opSend, true
	o.local, o.lmr = b.buf[:msgHdrLen+len(payload)], b.mr
	o.deadline = n.clock.Now().Add(n.cfg.MsgTimeout)
	o.done = make(chan struct{}, 1)
	if err := n.postSys(p, o); err != nil {
		return err
	}
	n.wait(ctx, o)
	return o.err
}

// pull READs a rendezvous message into dst and tells the sender.
func (n *Node) pull(ctx context.Context, im *inMsg, dst []byte) error {
	p, err := n.peerRef(ctx, im.from)
	if err != nil {
		return err
	}
	defer n.unref(p)
	me, off, err := n.mem.get(dst)
	if err != nil {
		return err
	}
	o := newOp()
	o.v, o.p, o.code, o.sys = p.sys, p, opRawRead, true
	o.local, o.mem, o.lmr, o.loff, o.rkey, o.off = dst, me, me.mr, off, im.rkey, im.raddr
	o.done = make(chan struct{}, 1)
	if err := n.postSys(p, o); err != nil {
		n.mem.put(me)
		return err
	}
	n.wait(ctx, o)
	st := uint8(finOK)
	if o.err != nil {
		st = finFailed
	} else {
		n.stats.msgLargeBytes.Add(uint64(len(dst)))
		n.stats.msgRecv.Add(1)
	}
	fin := msgHdr{kind: msgFIN, status: st, src: n.gid.Load(), token: im.token, inc: n.incarnation}
	if err := n.sendSmall(context.WithoutCancel(ctx), p, &fin, nil); err != nil {
		n.stats.msgFINErrors.Add(1)
	}
	return o.err
}

// stageUnread pulls a large message that is still queued (no reader took
// it in MsgStageAfter) into the receiver's own memory, if the staging
// budget MsgStageMax allows; the sender's Send then completes.
func (n *Node) stageUnread(pt *Port, from uint32, token uint64) {
	pt.mu.Lock()
	i := -1
	for k := range pt.q {
		if pt.q[k].kind == msgRTS && pt.q[k].from == from && pt.q[k].token == token && pt.q[k].st == nil {
			i = k
			break
		}
	}
	if i < 0 || pt.closed {
		pt.mu.Unlock()
		return // taken by a reader meanwhile
	}
	im := pt.q[i]
	m := &n.msg
	m.mu.Lock()
	if m.staged+int64(im.n) > int64(n.cfg.MsgStageMax) {
		m.mu.Unlock()
		pt.mu.Unlock()
		n.stats.msgStageFull.Add(1)
		return // the sender keeps waiting for a reader
	}
	m.staged += int64(im.n)
	m.mu.Unlock()
	st := &stage{done: make(chan struct{})}
	pt.q[i].st = st
	pt.mu.Unlock()
	if !n.goSafe(func() {
		ctx, cancel := clock.WithTimeout(n.ctx, n.clock, n.cfg.MsgTimeout)
		defer cancel()
		st.data = make([]byte, im.n)
		st.err = n.pull(ctx, &im, st.data)
		if st.err == nil {
			n.stats.msgStaged.Add(1)
		}
		close(st.done)
	}) {
		st.err = ErrClosed
		close(st.done)
	}
}

// unstage gives a staged message's bytes back to the budget.
func (n *Node) unstage(st *stage) {
	n.msg.mu.Lock()
	n.msg.staged -= int64(len(st.data))
	n.msg.mu.Unlock()
	st.data = nil
}

// withdrawn reports whether a pull failed because the sender's buffer was
// no longer registered (it gave up waiting): the READ met an access error
// at the sender.
func withdrawn(err error) bool {
	var re *RemoteError
	return errors.As(err, &re) && re.Status == verbs.StatusRemAccessErr && re.Reason == verbs.ReasonRKey
}

// sendFIN tells a rendezvous sender the outcome (goroutine).
func (n *Node) sendFIN(gid uint32, token uint64, status uint8) {
	ctx, cancel := clock.WithTimeout(n.ctx, n.clock, n.cfg.PeerTimeout)
	defer cancel()
	p, err := n.peerRef(ctx, gid)
	if err != nil {
		return
	}
	defer n.unref(p)
	fin := msgHdr{kind: msgFIN, status: status, src: n.gid.Load(), token: token, inc: n.incarnation}
	if n.sendSmall(ctx, p, &fin, nil) != nil {
		n.stats.msgFINErrors.Add(1)
	}
}

// postSys enqueues an internal op on p's DC queue.
func (n *Node) postSys(p *peer, o *op) error {
	e := n.newEffects()
	p.mu.Lock()
	if err := n.usableLocked(p); err != nil {
		p.mu.Unlock()
		return err
	}
	n.ops.add(o)
	p.active++
	n.queueLocked(p, o, DC)
	n.kickLocked(p, e)
	p.mu.Unlock()
	n.apply(e)
	return nil
}
