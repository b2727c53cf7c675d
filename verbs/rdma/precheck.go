package rdma

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/krfs/krfs/verbs"
)

// MaxMsgSize is the largest message this backend posts (IB's limit is
// 2^31; one SGE of a Go slice is the practical bound).
const MaxMsgSize = 1 << 30

// mrState is what the pre-check knows of a registered MR. Hardware checks
// local keys too, but only by failing the WR with a completion and moving
// the QP to ERR; verbs promises a synchronous error instead, so every SGE
// is checked here before the WR reaches the NIC.
type mrState struct {
	buf        []byte
	iova       uint64 // the IOVA buf[0] is registered at (mrIOVA)
	lkey, rkey uint32
	access     verbs.Access
	pd         any // identity of the MR's PD
	dead       atomic.Bool
}

// localAddr is the address an SGE at offset off of the MR names to the
// NIC: the MR's IOVA plus the offset.
func (m *mrState) localAddr(off uint64) uint64 { return m.iova + off }

// mrStater is implemented by this backend's MRs.
type mrStater interface{ state() *mrState }

// checkSGE validates a local SGE of protection domain pd needing access.
func checkSGE(s verbs.SGE, pd any, need verbs.Access) error {
	if s.MR == nil {
		return verbs.ErrNoMR
	}
	h, ok := s.MR.(mrStater)
	if !ok {
		return fmt.Errorf("%w: MR of another backend", verbs.ErrNoMR)
	}
	m := h.state()
	if m.dead.Load() {
		return fmt.Errorf("%w: lkey %#x", verbs.ErrMRDead, m.lkey)
	}
	if m.pd != pd {
		return verbs.ErrWrongPD
	}
	if s.Offset > uint64(len(m.buf)) || uint64(s.Length) > uint64(len(m.buf))-s.Offset {
		return fmt.Errorf("%w: [%d, +%d) of a %d-byte MR", verbs.ErrBounds, s.Offset, s.Length, len(m.buf))
	}
	if m.access&need != need {
		return fmt.Errorf("%w: have %v, need %v", verbs.ErrAccess, m.access, need)
	}
	return nil
}

// checkSend validates a send WR for a QP of type typ with caps, in PD pd,
// on a device whose atomics are atomics. The QP's state is checked by the
// caller.
func checkSend(wr *verbs.SendWR, typ verbs.QPType, caps verbs.QPCaps, pd any, atomics verbs.AtomicCap) error {
	if typ == verbs.DCT {
		return fmt.Errorf("%w: a DCT has no send queue", verbs.ErrOpcode)
	}
	if typ == verbs.DCI && wr.Target == nil {
		return verbs.ErrNoTarget
	}
	if _, ok := wrOpcode(wr.Op); !ok {
		return fmt.Errorf("%w: %v", verbs.ErrOpcode, wr.Op)
	}
	switch wr.Op {
	case verbs.OpRead:
		if wr.Flags&verbs.Inline != 0 {
			return fmt.Errorf("%w: inline READ", verbs.ErrInvalidArg)
		}
		if err := checkLen(wr.Local.Length); err != nil {
			return err
		}
		return checkSGE(wr.Local, pd, verbs.AccessLocalWrite)
	case verbs.OpWrite, verbs.OpWriteImm, verbs.OpSend, verbs.OpSendImm:
		if wr.Flags&verbs.Inline != 0 {
			if len(wr.InlineData) > caps.MaxInline {
				return fmt.Errorf("%w: %d inline bytes, max %d", verbs.ErrLength, len(wr.InlineData), caps.MaxInline)
			}
			if len(wr.InlineData) == 0 && (wr.Op == verbs.OpWrite || wr.Op == verbs.OpWriteImm) {
				return fmt.Errorf("%w: zero-length inline WRITE", verbs.ErrLength)
			}
			return nil
		}
		if wr.Local.Length == 0 && (wr.Op == verbs.OpSend || wr.Op == verbs.OpSendImm) && wr.Local.MR == nil {
			return nil // an empty SEND needs no memory
		}
		if err := checkLen(wr.Local.Length); err != nil {
			return err
		}
		return checkSGE(wr.Local, pd, 0)
	case verbs.OpCmpSwap, verbs.OpFetchAdd:
		if atomics == verbs.AtomicNone {
			return fmt.Errorf("%w: %v on a device without atomics (atomic_cap NONE)", verbs.ErrNotSupported, wr.Op)
		}
		if wr.Flags&verbs.Inline != 0 {
			return fmt.Errorf("%w: inline atomic", verbs.ErrInvalidArg)
		}
		if wr.RemoteAddr%verbs.AtomicSize != 0 {
			return fmt.Errorf("%w: remote address %#x", verbs.ErrAlign, wr.RemoteAddr)
		}
		if wr.Local.Length != verbs.AtomicSize {
			return fmt.Errorf("%w: atomic sink must be %d bytes, got %d", verbs.ErrLength, verbs.AtomicSize, wr.Local.Length)
		}
		return checkSGE(wr.Local, pd, verbs.AccessLocalWrite)
	}
	return fmt.Errorf("%w: %v", verbs.ErrOpcode, wr.Op)
}

func checkLen(n uint32) error {
	if n == 0 || n > MaxMsgSize {
		return fmt.Errorf("%w: %d bytes (1..%d)", verbs.ErrLength, n, MaxMsgSize)
	}
	return nil
}

// checkRecv validates a receive WR in PD pd.
func checkRecv(wr *verbs.RecvWR, pd any) error {
	if err := checkLen(wr.Local.Length); err != nil {
		return err
	}
	return checkSGE(wr.Local, pd, verbs.AccessLocalWrite)
}

// posted is one send WR the NIC holds.
type posted struct {
	id       uint64
	op       verbs.Opcode
	signaled bool
	target   netip.AddrPort // a DCI WR's target (its CM address)
}

// sendTrack follows a send queue's WRs from post to completion. The NIC
// completes a QP's send WRs in order and reports only signaled WRs and
// errors, so a completion for WR id also retires every unsignaled WR
// posted before it; the track counts the free slots (SendQueueFree) and
// remembers each WR's opcode, which an error completion does not carry.
type sendTrack struct {
	ring    []posted
	head, n int
}

func newSendTrack(depth int) *sendTrack { return &sendTrack{ring: make([]posted, depth)} }

func (t *sendTrack) free() int { return len(t.ring) - t.n }

// push records a posted WR; false when the queue is full.
func (t *sendTrack) push(p posted) bool {
	if t.n == len(t.ring) {
		return false
	}
	t.ring[(t.head+t.n)%len(t.ring)] = p
	t.n++
	return true
}

// complete retires the oldest WR with this id and every WR before it. It
// returns the WR, or ok false if no outstanding WR has the id (a
// completion after RESET dropped the queue).
func (t *sendTrack) complete(id uint64) (p posted, ok bool) {
	for i := 0; i < t.n; i++ {
		p := t.ring[(t.head+i)%len(t.ring)]
		if p.id == id {
			t.head = (t.head + i + 1) % len(t.ring)
			t.n -= i + 1
			return p, true
		}
	}
	return posted{}, false
}

// reset forgets every WR (ibv_modify_qp to RESET drops them uncompleted).
func (t *sendTrack) reset() { t.head, t.n = 0, 0 }
