package meta

import (
	"net/netip"
	"syscall"

	"github.com/krfs/krfs/verbs"
)

// NodeInfo is what the meta service knows of a node: everything a peer
// needs to reach it with no handshake. A DCI reaches the node's DCT with
// (Addr, DCTN, DCKey); the region directory (DirRKey, DirLen) lists the
// regions the node exports. MemRKey, MemLen and MemAccess describe its default
// region ("mem") so that a peer's first READ of it needs no directory
// READ; they are a hint, which the data path checks like any cached key.
// MemOwnerKnown says MemMode, MemUID and MemGID hold the default region's
// permission bits and owner (the file layer's view of "mem", so that a
// peer can stat it without a directory READ); when it is false they are
// zero and mean "unknown: read the directory", never mode 0 (entries
// written before the fields existed decode so).
// Transport names the wire protocol the node speaks ("softnic/udp",
// "rdma/roce", "rdma/ib"; empty is softnic/udp): nodes of different
// transports cannot reach each other.
type NodeInfo struct {
	GID         uint32         // cluster-wide node ID, never 0
	Incarnation uint64         // new on every daemon start
	Addr        netip.AddrPort // the node's softnic device address
	DCTN        uint32         // the node's DCT number
	DCKey       uint64         // the key its DCT checks
	DirRKey     uint32         // rkey of the node's region directory
	DirLen      uint32         // length of the region directory in bytes
	MemRKey     uint32         // rkey of the default region; 0: none
	MemLen      uint64         // length of the default region in bytes
	MemAccess   verbs.Access   // what the default region allows
	// MemOwnerKnown: MemMode, MemUID, MemGID are set (else all zero).
	MemOwnerKnown bool
	MemMode       uint32 // permission bits (0o7777) of the default region
	MemUID        uint32 // its owner
	MemGID        uint32 // its group
	Transport     string // at most MaxTransport printable bytes
}

// Error is a meta error value. Each carries the errno a file operation
// should report for it (Errno), so that a failed lookup surfaces as
// ENOENT or EHOSTDOWN rather than EIO. Compare with errors.Is.
type Error struct {
	msg   string
	errno syscall.Errno
}

func (e *Error) Error() string { return e.msg }

// Errno is the errno that describes e.
func (e *Error) Errno() syscall.Errno { return e.errno }

func newError(msg string, errno syscall.Errno) *Error { return &Error{"meta: " + msg, errno} }

// Errors every meta client returns (wrapped with detail).
var (
	ErrNotFound = newError("no such node", syscall.ENOENT)
	ErrGIDInUse = newError("gid held by a live node", syscall.EADDRINUSE)
	// ErrUnreachable: no meta server answered (a connection failed, was
	// refused, or a READ or RPC found no live server in time).
	ErrUnreachable = newError("no meta server reachable", syscall.EHOSTDOWN)

	// ErrNotRegistered: a heartbeat or deregistration for a gid the
	// server holds no live lease for (it expired, or the server restarted).
	ErrNotRegistered = newError("not registered", syscall.ENOENT)
	// ErrTableFull: the server found no free slot within reach of the
	// gid's home slot, or no gid to assign.
	ErrTableFull = newError("node table full", syscall.ENOSPC)
	// ErrMalformed: the server could not parse a request.
	ErrMalformed = newError("malformed message", syscall.EPROTO)
	// ErrStale: the table still holds the metadata the data path just
	// found stale (the peer restarted and has not registered again).
	ErrStale = newError("peer metadata is stale", syscall.ESTALE)
	// ErrClosed: the Client, Server or Agent was closed.
	ErrClosed = newError("closed", syscall.EBADF)
)
