package node

import "github.com/krfs/krfs/fs"

// SetFuseStats makes stats.json ("fuse"), the metrics (krfs_fuse_*) and
// krfs res report how the mount's FUSE requests are served: f is the
// mount's fs.Server.Stats.
func (b *Node) SetFuseStats(f func() fs.FuseStats) { b.fuseStats.Store(&f) }

// fuseStatsNow returns the mount's FUSE counters, or nil before a mount.
func (b *Node) fuseStatsNow() *fs.FuseStats {
	f := b.fuseStats.Load()
	if f == nil {
		return nil
	}
	s := (*f)()
	return &s
}

var (
	mFuseTransport = desc("fuse_transport", "1 for the transport that serves the mount's FUSE requests (io_uring or dev).", gauge, "transport")
	mFuseRing      = desc("fuse_ring_entries", "FUSE over io_uring: queues (one per possible CPU) and entries per queue.", gauge, "what")
	mFuseRequests  = desc("fuse_requests_total", "FUSE requests served, by path: dev (/dev/fuse), ring (io_uring, on the ring's thread) and ring_async (io_uring, off it: requests that may block).", counter, "path")
	mFusePending   = desc("fuse_ring_pending_total", "FUSE over io_uring READs answered after their ring thread served other requests: the READ was posted and answered when its data came.", counter)
	mFuseCopies    = desc("fuse_fallback_copies_total", "READ replies whose data did not land in the reply buffer and was copied into it.", counter)
	mFuseRereg     = desc("fuse_ring_reregistered_total", "FUSE ring entries the kernel refused a command of while mounted, registered again.", counter)
	mFuseStalls    = desc("fuse_stalls_total", "Times the kernel held FUSE requests for 30 s while the daemon had none in service and served none.", counter)
)

// collectFuse emits the FUSE metrics (zero before a mount: Describe
// collects once, at registration).
func (b *Node) collectFuse(emit func(metricDesc, float64, ...string)) {
	var s fs.FuseStats
	if p := b.fuseStatsNow(); p != nil {
		s = *p
	}
	uring := 0.0
	if s.Transport == "io_uring" {
		uring = 1
	}
	emit(mFuseTransport, uring, "io_uring")
	emit(mFuseTransport, 1-uring, "dev")
	emit(mFuseRing, float64(s.Queues), "queues")
	emit(mFuseRing, float64(s.EntriesPerQueue), "entries_per_queue")
	emit(mFuseRequests, float64(s.DevRequests), "dev")
	emit(mFuseRequests, float64(s.RingRequests-min(s.RingAsync, s.RingRequests)), "ring")
	emit(mFuseRequests, float64(s.RingAsync), "ring_async")
	emit(mFusePending, float64(s.RingPending))
	emit(mFuseCopies, float64(s.FallbackCopies))
	emit(mFuseRereg, float64(s.RingReregistered))
	emit(mFuseStalls, float64(s.Stalls))
}
