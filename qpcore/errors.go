package qpcore

import (
	"fmt"
	"syscall"

	"github.com/krfs/krfs/verbs"
)

// Error is a qpcore error value. Besides errors.Is against the Err*
// values below, each matches the errno a filesystem should report for it,
// so errors.Is(err, syscall.ENOENT) holds for ErrNoRegion.
type Error struct {
	msg   string
	errno syscall.Errno
}

func (e *Error) Error() string { return e.msg }

// Errno is the errno that describes e.
func (e *Error) Errno() syscall.Errno { return e.errno }

// Is matches e's errno.
func (e *Error) Is(target error) bool {
	t, ok := target.(syscall.Errno)
	return ok && t == e.errno
}

func newError(msg string, errno syscall.Errno) *Error { return &Error{"qpcore: " + msg, errno} }

// Errors of the pre-check: a request that fails one never reaches a QP.
var (
	ErrLocalLength  = newError("local buffer empty or too long", syscall.EINVAL)
	ErrNoRegion     = newError("no such region on the peer", syscall.ENOENT)
	ErrRemoteBounds = newError("range outside the peer's region", syscall.EFBIG)
	ErrRemoteAccess = newError("the peer's region does not allow this access", syscall.EACCES)
	ErrAlign        = newError("atomic offset not 8-byte aligned", syscall.EINVAL)
	ErrOpcode       = newError("operation not supported on this transport", syscall.EOPNOTSUPP)
	ErrWouldBlock   = newError("send queue full and asked not to block", syscall.EAGAIN)
)

// Errors of the data path and of the node.
var (
	ErrClosed          = newError("closed", syscall.EBADF)
	ErrNoPeer          = newError("peer not found", syscall.ENOENT)
	ErrPeerUnreachable = newError("peer unreachable", syscall.EHOSTDOWN)
	ErrStale           = newError("peer metadata stale after a retry", syscall.ESTALE)
	// ErrAtomicLost: an atomic was sent and no answer says whether it
	// executed (a lost response, a silent or restarted peer, a QP error).
	// It may have run; running it again may apply it twice. Every other
	// error of an atomic means it did not run.
	ErrAtomicLost = newError("atomic's outcome unknown: it may have executed", syscall.ETIMEDOUT)
	ErrRemote     = newError("remote operation failed", syscall.EIO)
	ErrDirectory  = newError("peer's region directory unreadable", syscall.EIO)
	ErrTimeout    = newError("timed out", syscall.ETIMEDOUT)
	// ErrRCPoolFull: an RC-only peer waited PeerTimeout for a slot of the
	// RC pool (RCCap QPs, none idle to reclaim).
	ErrRCPoolFull = newError("RC pool full: no RC QP idle to reclaim", syscall.EBUSY)
	// ErrTransportMismatch: the peer speaks another wire protocol (a
	// softnic node and an rdma node cannot reach each other).
	ErrTransportMismatch = newError("peer on another transport", syscall.EPROTO)
)

// Errors of region export.
var (
	ErrBadName    = newError("region name must be 1-32 bytes without '/' or NUL", syscall.EINVAL)
	ErrExists     = newError("region already exported", syscall.EEXIST)
	ErrNoSpace    = newError("region directory full", syscall.ENOSPC)
	ErrNotPresent = newError("no such exported region", syscall.ENOENT)
	// ErrUnaligned: a region must start on a page boundary (verbs.PageSize)
	// so that its MR is zero-based and peers address it by offsets (an
	// RNIC registers other memory only at a non-zero IOVA).
	ErrUnaligned = newError("region does not start on a page boundary (allocate it with verbs.PageAligned or mmap)", syscall.EINVAL)
)

// Errors of messaging.
var (
	ErrPortInUse    = newError("port already bound", syscall.EADDRINUSE)
	ErrNoPort       = newError("no such port on the peer", syscall.ENOENT)
	ErrShortBuffer  = newError("message longer than the buffer", syscall.EMSGSIZE)
	ErrReceiverBusy = newError("receiver posted no buffer in time", syscall.ETIMEDOUT)
	ErrPortFull     = newError("the peer's port queue is full", syscall.EAGAIN)
)

// RemoteError is a completion error from the peer that the pre-check
// could not foresee (the region changed between check and execution). It
// matches ErrRemote, EIO, and ErrRemoteAccess (EACCES) for permission
// reasons.
type RemoteError struct {
	Status verbs.Status
	Reason verbs.Reason
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("qpcore: remote operation failed: %v (%v)", e.Status, e.Reason)
}

func (e *RemoteError) Unwrap() error {
	if e.Reason == verbs.ReasonPerm {
		return ErrRemoteAccess
	}
	return ErrRemote
}

// PostError reports the first WR of a Post batch that was refused; WRs
// before Index were posted.
type PostError struct {
	Index int
	Err   error
}

func (e *PostError) Error() string { return fmt.Sprintf("qpcore: WR %d: %v", e.Index, e.Err) }
func (e *PostError) Unwrap() error { return e.Err }
