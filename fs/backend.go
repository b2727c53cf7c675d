package fs

import (
	"context"
	"io"
)

// Backend is what the filesystem needs from a krfs node. The daemon
// implements it over qpcore (virtual QPs) and the meta client; tests use an
// in-memory fake. Errors may wrap a syscall.Errno (ENOENT, EACCES,
// ETIMEDOUT, EHOSTDOWN, EINVAL, EFBIG, EAGAIN...), which the filesystem
// returns as is; any other error becomes EIO.
type Backend interface {
	// Self is this node's gid.
	Self() uint32
	// Peers lists the gids of the live nodes, this one included.
	Peers(ctx context.Context) ([]uint32, error)
	// PeerInfo describes a peer in text (address, incarnation, transport,
	// counters); ENOENT for an unknown gid.
	PeerInfo(ctx context.Context, gid uint32) (string, error)
	// Connect returns a virtual QP to a peer.
	Connect(ctx context.Context, gid uint32) (Conn, error)

	// Regions lists the regions this node exports.
	Regions() []Region
	// Export creates (or, with an existing name, resizes) a region.
	Export(name string, size int64, mode uint32, uid, gid uint32) (Region, error)
	// Unexport removes a region.
	Unexport(name string) error
	// LocalRegion returns the local region of that name.
	LocalRegion(name string) (LocalRegion, error)

	// Bind opens one of this node's receive ports.
	Bind(port uint32) (Port, error)
	// Ports lists the bound ports.
	Ports() []uint32

	// Stats writes the node's statistics in text or JSON.
	Stats(w io.Writer, json bool) error
}

// BufferRegistrar is implemented by a backend whose transfers are cheaper
// from memory registered once (qpcore.Node.Register) than from buffers it
// must register as they come. The filesystem then registers its IOBuffers
// at mount (and unregisters them at unmount) and passes sub-slices of
// their Memory to Conn.ReadAt; the backend may also report the pool's
// Stats.
type BufferRegistrar interface {
	RegisterIOBuffers(p *IOBuffers) error
	UnregisterIOBuffers(p *IOBuffers) error
}

// Region describes an exported memory region.
type Region struct {
	Name   string
	Size   int64
	Mode   uint32 // permission bits
	UID    uint32
	GID    uint32
	Remote bool // readable and writable by peers
}

// LocalRegion is a region of this node, accessed at memory speed.
type LocalRegion interface {
	Info() Region
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// FetchAdd and CompareAndSwap act atomically on the 8-byte word at off
	// (8-byte aligned) and return its old value.
	FetchAdd(off int64, delta uint64) (uint64, error)
	CompareAndSwap(off int64, cmp, swap uint64) (uint64, error)
	// Chmod and Chown change the region's owner and mode.
	Chmod(mode uint32) error
	Chown(uid, gid uint32) error
}

// Conn is a virtual QP to one peer. Methods may be called concurrently.
type Conn interface {
	// Regions lists the peer's exported regions ("mem" is the default).
	Regions(ctx context.Context) ([]Region, error)
	// ReadAt reads the peer's region into p with one-sided READs. The
	// response lands in p itself (zero copy). It returns len(p), or an
	// error (the filesystem then returns no bytes at all).
	ReadAt(ctx context.Context, region string, p []byte, off int64) (int, error)
	// WriteAt writes p into the peer's region with one-sided WRITEs, sent
	// from p itself. It returns len(p); on failure, the length of a prefix
	// of p known to have landed (possibly 0) and the error. The filesystem
	// reports a non-zero prefix as a short write and the error otherwise.
	WriteAt(ctx context.Context, region string, p []byte, off int64) (int, error)
	FetchAdd(ctx context.Context, region string, off int64, delta uint64) (uint64, error)
	CompareAndSwap(ctx context.Context, region string, off int64, cmp, swap uint64) (uint64, error)
	// Send delivers one message to a port of the peer.
	Send(ctx context.Context, port uint32, msg []byte) error
	Close() error
}

// Port is a bound receive port.
type Port interface {
	// Recv blocks for the next message and copies it into p, returning its
	// length; a message longer than p is an error (EMSGSIZE) and is kept.
	Recv(ctx context.Context, p []byte) (int, error)
	// TryRecv is Recv without the wait: with no message queued it fails
	// at once with EAGAIN (a read opened with O_NONBLOCK).
	TryRecv(ctx context.Context, p []byte) (int, error)
	// Close unbinds the port.
	Close() error
}

// CapacityReporter is implemented by a backend that knows how much memory
// its regions may use; statfs (df) reports it. Without it, statfs reports
// the regions' sizes as both the capacity and the use.
type CapacityReporter interface {
	// Capacity: the bytes regions may occupy in all (the region store's
	// filesystem), the bytes still free there, and the count of regions
	// the node may hold.
	Capacity() (total, free int64, maxRegions int, err error)
}
