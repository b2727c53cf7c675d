package qpcore

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// Ports: binding, the queue of messages waiting on a port, and Recv,
// which copies a small message out of its receive buffer or pulls a large
// one (rendezvous.go).

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
	back  []byte // a message a reader gave back (Unrecv)
}

// Port is a bound receive port.
type Port struct {
	n   *Node
	num uint32

	mu     sync.Mutex // guards q and closed
	q      []inMsg
	closed bool
	notify chan struct{}
	onMsg  atomic.Pointer[func()] // see OnQueue
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

// OnQueue sets f to be called, with no lock held, each time a message is
// queued on the port (received, or given back with Unrecv); nil stops
// the calls. f must not block: it runs on the node's receive path.
func (pt *Port) OnQueue(f func()) {
	if f == nil {
		pt.onMsg.Store(nil)
		return
	}
	pt.onMsg.Store(&f)
}

// queued wakes a waiting reader and calls the OnQueue function.
func (pt *Port) queued() {
	pt.wake()
	if f := pt.onMsg.Load(); f != nil {
		(*f)()
	}
}

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
			if im.back != nil {
				copy(dst, im.back)
				return Message{From: im.from, Len: im.n}, nil
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
			// The pull is not cut short by ctx: the message has left the
			// queue, and a reader that gives up now gets it anyway and
			// can give it back (Unrecv). A pull ends within PeerTimeout.
			err := n.pull(context.WithoutCancel(ctx), &im, dst[:im.n])
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

// Unrecv puts back a message Recv returned, as the next message of the
// port, for a reader that could not hand it on (its caller was
// interrupted before the message reached it). It keeps its own copy of
// data; the port's depth does not limit it (the message held a place in
// the queue already). On a closed port the message is dropped.
func (pt *Port) Unrecv(from uint32, data []byte) {
	im := inMsg{kind: msgData, from: from, n: len(data), buf: -1, back: append(make([]byte, 0, len(data)), data...)}
	pt.mu.Lock()
	if pt.closed {
		pt.mu.Unlock()
		pt.n.stats.msgDropped.Add(1)
		return
	}
	pt.q = append([]inMsg{im}, pt.q...)
	pt.mu.Unlock()
	pt.queued()
}

// QueuedBytes is the number of payload bytes waiting on the port.
func (pt *Port) QueuedBytes() int64 {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	var b int64
	for _, im := range pt.q {
		b += int64(im.n)
	}
	return b
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
	if im.back != nil {
		return
	}
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
