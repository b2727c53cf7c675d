package qpcore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/krfs/krfs/verbs"
)

// A node's message buffers: the receive buffers posted on its SRQ (grown
// when the first port is bound) and the bounce buffers small messages are
// sent from. See msg.go for the protocol.

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
