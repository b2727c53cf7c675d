package qpcore

import (
	"context"
	"fmt"

	"github.com/krfs/krfs/verbs"
)

// The pre-check: before an operation reaches a QP, it is checked against
// the peer's region directory (name, bounds, access, alignment, opcode), so
// that one caller's mistake is refused locally and never puts a shared DCI
// or RC QP into the error state under other callers' operations.

// checkRange checks an access of length bytes at off against a region.
func checkRange(r *Region, code OpCode, off uint64, length int) error {
	if off > r.Len || uint64(length) > r.Len-off {
		return fmt.Errorf("%w: [%d, +%d) of %q (%d bytes)", ErrRemoteBounds, off, length, r.Name, r.Len)
	}
	var need verbs.Access
	switch code {
	case OpRead:
		need = verbs.AccessRemoteRead
	case OpWrite:
		need = verbs.AccessRemoteWrite
	case OpCompareAndSwap, OpFetchAdd:
		need = verbs.AccessRemoteAtomic
	}
	if r.Access&need != need {
		return fmt.Errorf("%w: %v on %q (%v)", ErrRemoteAccess, code, r.Name, r.Access)
	}
	return nil
}

// maxOpLen bounds one READ or WRITE.
const maxOpLen = 1 << 30

// precheckLocked validates wr before it may reach a shared QP: local
// buffer, opcode, alignment, and the remote range against the peer's
// region directory (size and access flags).
func (n *Node) precheckLocked(ctx context.Context, p *peer, v *VQP, wr *WR) error {
	length := len(wr.Local)
	switch wr.Op {
	case OpRead, OpWrite:
		if length == 0 || length > maxOpLen {
			return fmt.Errorf("%w: %d bytes (1..%d)", ErrLocalLength, length, maxOpLen)
		}
	case OpCompareAndSwap, OpFetchAdd:
		length = verbs.AtomicSize
		if n.dev.Attr().Atomic == verbs.AtomicNone {
			// The NIC would refuse it at post (verbs.ErrNotSupported).
			return fmt.Errorf("%w: %v: this node's NIC has no atomics", ErrOpcode, wr.Op)
		}
		if wr.Offset%verbs.AtomicSize != 0 {
			return fmt.Errorf("%w: offset %d", ErrAlign, wr.Offset)
		}
	default:
		// DC and RC carry the same four operations: one check serves both.
		return fmt.Errorf("%w: %v", ErrOpcode, wr.Op)
	}
	r, err := n.regionLocked(ctx, p, wr.Region)
	if err != nil {
		return err
	}
	return checkRange(&r, wr.Op, wr.Offset, length)
}
