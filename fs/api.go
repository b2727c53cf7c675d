package fs

import (
	"context"
	"time"
)

// Optional interfaces.
//
// A Backend, and the Conn values its Connect returns, may implement more
// than Backend and Conn ask for. The filesystem checks for each interface
// below with a type assertion and falls back to the behaviour described
// when it is absent, so a small backend (the tests' fake) stays small.
// Implementers should assert the interfaces they mean to meet, as node
// does:
//
//	var _ fs.FreshConn = (*vqpConn)(nil)
//
// so that a renamed method is a compile error rather than a silent
// fallback.
//
//	interface         implemented by   without it
//	BufferRegistrar   Backend          buffers are registered as they come
//	MemoryRegistrar   Backend          READs on io_uring land in IOBuffers, copied to the ring
//	CapacityReporter  Backend          statfs reports the regions' sizes only
//	FreshConn         Conn             the directory is read with Regions every time
//	SizeConn          Conn             an open reads the peer's directory
//	ReadStarter       Conn             a READ holds its FUSE ring thread until it completes
//	StreamPort        Port             a message whose reader gave up is lost; ports/<port> has size 0

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

// MemoryRegistrar is implemented by a backend that can register memory
// the filesystem does not allocate: the payload buffers of the FUSE ring
// entries (FUSE over io_uring). The filesystem registers them at mount
// and unregisters them at unmount; a READ whose reply buffer lies in
// them lands there, by the NIC, and the kernel's copy to the caller is
// the only one (a WRITE's data leaves from them the same way).
type MemoryRegistrar interface {
	RegisterMemory(b []byte) error
	UnregisterMemory(b []byte) error
}

// ReadStarter is a Conn that can post a READ and return before its
// response is there (node's VQPs). A READ whose destination is a FUSE ring
// entry's buffer then leaves the ring's thread free to serve its other
// entries while the READ is on the wire (fuseserve.PendingRead).
type ReadStarter interface {
	// ReadStart posts a READ of len(p) bytes at off of the region into
	// p; p belongs to the NIC until the PendingRead's Wait returns, which
	// must be called exactly once.
	ReadStart(ctx context.Context, region string, p []byte, off int64) (StartedRead, error)
}

// StartedRead is a READ that ReadStart posted.
type StartedRead interface {
	// Ready reports whether Wait would return at once.
	Ready() bool
	// Await waits at most d for the READ and reports whether it is
	// done; it never gives the READ up.
	Await(d time.Duration) bool
	// Wait waits for the READ and returns len(p) or its error.
	Wait(ctx context.Context) (int, error)
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

// FreshConn is a Conn that keeps a copy of the peer's region directory
// and reads it again only when the copy is older than maxAge. Without it
// the filesystem asks Regions, which reads the directory.
type FreshConn interface {
	FreshRegions(ctx context.Context, maxAge time.Duration) ([]Region, error)
	FreshRegion(ctx context.Context, name string, maxAge time.Duration) (Region, error)
}

// SizeConn is a Conn that can size a region for an open without reading
// the peer's directory when it already holds a description of it (the
// default region, from the peer's meta entry). A stale size is caught by
// the peer (a new rkey) and the read or write looks again, as the
// stale-region rule says (retryStale in tree.go).
type SizeConn interface {
	FreshSize(ctx context.Context, name string, maxAge time.Duration) (int64, error)
}

// StreamPort is a Port that can take a message back and say how many
// bytes wait on it. ports/<port> then gives back a message whose reader
// was interrupted before the message reached it, and reports the waiting
// bytes in st_size (see "Ports" in the package documentation).
type StreamPort interface {
	// Unrecv puts msg (a message Recv or TryRecv returned; Unrecv keeps
	// its own copy) back at the head of the queue, waking a waiting
	// reader.
	Unrecv(msg []byte)
	// QueuedBytes is the total size of the messages waiting.
	QueuedBytes() int64
	// OnQueue sets a function called each time a message is queued
	// (nil: none); it must not block.
	OnQueue(f func())
}
