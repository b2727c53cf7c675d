package meta

import (
	"errors"
	"net/netip"
)

// NodeInfo is what the meta service knows of a node: everything a peer
// needs to reach it with no handshake. A DCI reaches the node's DCT with
// (Addr, DCTN, DCKey); the region directory (DirRKey, DirLen) lists the
// regions the node exports.
type NodeInfo struct {
	GID         uint32         // cluster-wide node ID, never 0
	Incarnation uint64         // new on every daemon start
	Addr        netip.AddrPort // the node's softnic device address
	DCTN        uint32         // the node's DCT number
	DCKey       uint64         // the key its DCT checks
	DirRKey     uint32         // rkey of the node's region directory
	DirLen      uint32         // length of the region directory in bytes
}

// Errors every meta client returns (wrapped with detail).
var (
	ErrNotFound    = errors.New("meta: no such node")
	ErrGIDInUse    = errors.New("meta: gid held by a live node")
	ErrUnreachable = errors.New("meta: no meta server reachable")

	// ErrNotRegistered: a heartbeat or deregistration for a gid the
	// server holds no live lease for (it expired, or the server restarted).
	ErrNotRegistered = errors.New("meta: not registered")
	// ErrTableFull: the server found no free slot within reach of the
	// gid's home slot, or no gid to assign.
	ErrTableFull = errors.New("meta: node table full")
	// ErrMalformed: the server could not parse a request.
	ErrMalformed = errors.New("meta: malformed message")
	// ErrStale: the table still holds the metadata the data path just
	// found stale (the peer restarted and has not registered again).
	ErrStale = errors.New("meta: peer metadata is stale")
	// ErrClosed: the Client, Server or Agent was closed.
	ErrClosed = errors.New("meta: closed")
)
