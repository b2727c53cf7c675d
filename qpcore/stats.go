package qpcore

import (
	"errors"
	"reflect"
	"sync/atomic"
)

// counters are the node's statistics, updated without locks. Each is a
// row of the stat table (stattable.go), which Stats and the metrics read.
type counters struct {
	connectHits, connectMisses, peerEvictions atomic.Uint64
	vqpsOpen                                  atomic.Int64

	opsDC, opsRC, doorbells, opErrors atomic.Uint64
	coalesced                         atomic.Uint64
	fences, vqpToRC, vqpToDC          atomic.Uint64
	dciWaits, dciYields               atomic.Uint64

	rejLocal, rejNoRegion, rejBounds, rejAccess atomic.Uint64
	rejAlign, rejOpcode, rejWouldBlock          atomic.Uint64

	qpErrors, dciRecoveries, reposted, remoteErrors  atomic.Uint64
	rnrRetries, relookups, staleRetries, unreachable atomic.Uint64
	postErrors                                       atomic.Uint64
	opTimeouts, lossRetries, peersDown, peersUp      atomic.Uint64

	rcConnects, rcConnectFailures, rcEvictions, rcIdle atomic.Uint64
	rcFallbacks, rcErrors, rcAccepted, rcReclaimed     atomic.Uint64
	rcSlotWaits                                        atomic.Uint64

	rcPassiveErrors, qpEvents, cqErrors, srqLimits, portDowns, portUps atomic.Uint64

	dirReads, dirTorn, dirHints atomic.Uint64

	msgSent, msgRecv, msgRendezvous, msgDropped, msgMalformed    atomic.Uint64
	msgSmallBytes, msgSmallCopied, msgLargeBytes, msgLargeCopied atomic.Uint64
	msgFINErrors, msgRepostErrors                                atomic.Uint64
	msgRefused, msgFullRetries                                   atomic.Uint64
	msgStaged, msgStageFull                                      atomic.Uint64
}

// reject counts a pre-check refusal.
func (c *counters) reject(err error) {
	switch {
	case errors.Is(err, ErrLocalLength):
		c.rejLocal.Add(1)
	case errors.Is(err, ErrNoRegion):
		c.rejNoRegion.Add(1)
	case errors.Is(err, ErrRemoteBounds):
		c.rejBounds.Add(1)
	case errors.Is(err, ErrRemoteAccess):
		c.rejAccess.Add(1)
	case errors.Is(err, ErrAlign):
		c.rejAlign.Add(1)
	case errors.Is(err, ErrOpcode):
		c.rejOpcode.Add(1)
	case errors.Is(err, ErrWouldBlock):
		c.rejWouldBlock.Add(1)
	}
}

// Stats is a snapshot of a node's counters and pool state.
type Stats struct {
	// Peers known, VQPs open, connects served from known state (hits)
	// or after a lookup (misses), peers evicted beyond MaxPeers.
	Peers, VQPsOpen                           int
	ConnectHits, ConnectMisses, PeerEvictions uint64

	// WRs posted on DCIs and RC QPs, and the PostSend calls (doorbells)
	// that carried them; operations that ended in an error.
	OpsDC, OpsRC, Doorbells, OpErrors uint64
	// Coalesced counts synchronous operations that waited for an
	// in-flight completion to share its doorbell (Config.NoCoalesce).
	Coalesced uint64
	// Switching: fences (a VQP held operations until its old transport
	// drained) and VQP moves to RC and back to DC.
	Fences, VQPToRC, VQPToDC uint64
	// DCI pool: free DCIs now, peers waiting now, waits and quota yields.
	DCIsFree, DCIWaiters int
	DCIWaits, DCIYields  uint64

	// Pre-check refusals by cause. None of these reached a QP.
	RejectLocal, RejectNoRegion, RejectBounds, RejectAccess uint64
	RejectAlign, RejectOpcode, RejectWouldBlock             uint64

	// QP errors (error completions on shared QPs) and what followed:
	// DCI recoveries, innocent WRs posted again, errors reported to their
	// owner, RNR retries, re-lookups of stale or silent peers, operations
	// retried after one, peers found unreachable. PostErrors counts
	// PostSend refusals, which the pre-check should make impossible.
	QPErrors, DCIRecoveries, Reposted, RemoteErrors  uint64
	RNRRetries, Relookups, StaleRetries, Unreachable uint64
	PostErrors                                       uint64
	// Liveness and deadlines (see "Timeouts and liveness" in the package
	// doc): operations ended by their deadline, operations posted again
	// after their QP exhausted its transport retries, peers declared down
	// on evidence of death, and down peers that answered again.
	OpTimeouts, LossRetries, PeersDown, PeersUp uint64

	// RC pool: QPs now, connections made and failed, LRU evictions, idle
	// teardowns, fallbacks to DC (any teardown), QP errors; passive QPs
	// now, accepted and reclaimed.
	RCActive, RCPassive                                int
	RCConnects, RCConnectFailures, RCEvictions, RCIdle uint64
	RCFallbacks, RCErrors, RCAccepted, RCReclaimed     uint64
	// RCSlotWaits counts the times an RC-only peer's connection found the
	// pool full with no idle QP to reclaim and waited for a slot.
	RCSlotWaits uint64

	// Asynchronous events of the device: passive RC QPs it reported in
	// ERR (destroyed at once), error events on this node's other QPs,
	// overruns of its CQs, its SRQ's limit reached, the port going down
	// and coming back.
	RCPassiveErrors, QPEvents, CQErrors, SRQLimits, PortDowns, PortUps uint64

	// Region directory READs, torn reads repeated, and pre-checks of the
	// default region answered by the meta entry's hint (no directory READ).
	DirReads, DirTorn, DirHints uint64

	// Messages sent and received, by rendezvous, dropped (queued on a
	// port that was closed, or a rendezvous its sender withdrew),
	// malformed; payload bytes delivered and bytes copied by qpcore on
	// each path (small: sender bounce + receiver copy; large: none, but
	// for staged messages).
	MsgSent, MsgRecv, MsgRendezvous, MsgDropped, MsgMalformed    uint64
	MsgSmallBytes, MsgSmallCopied, MsgLargeBytes, MsgLargeCopied uint64
	// MsgRefused counts messages this node refused (no such port, or the
	// port's queue full); MsgFullRetries the sends this node repeated
	// because the peer's port was full.
	MsgRefused, MsgFullRetries uint64
	// MsgStaged counts large messages pulled ahead of their reader (no
	// reader waited for them; see Config.MsgStageAfter), MsgStageFull
	// the ones left to wait because MsgStageMax bytes were staged.
	MsgStaged, MsgStageFull uint64
	// MsgRecvBuffers is how many receive buffers of MsgThreshold bytes
	// are registered and posted: a few until the first port is bound,
	// then Config.RecvBuffers.
	MsgRecvBuffers int

	// Local buffer registrations: cache hits, misses, evictions, buffers
	// too large to cache (registered per operation), and what the cache
	// holds now (entries and bytes, at most Config.MemCacheMax and
	// Config.MemCacheSize).
	MemHits, MemMisses, MemEvictions, MemUncached uint64
	MemCached                                     int
	MemCachedBytes                                int
}

// Rejects is the total of pre-check refusals.
func (s *Stats) Rejects() uint64 {
	return s.RejectLocal + s.RejectNoRegion + s.RejectBounds + s.RejectAccess + s.RejectAlign +
		s.RejectOpcode + s.RejectWouldBlock
}

// Stats returns the node's counters (those of the stat table, stattable.go)
// and its pools' state now.
func (n *Node) Stats() Stats {
	c := &n.stats
	var s Stats
	sv := reflect.ValueOf(&s).Elem()
	for _, f := range statCounters {
		sv.Field(f.index).SetUint(f.live(c).Load())
	}
	s.VQPsOpen = int(c.vqpsOpen.Load())
	n.mu.Lock()
	s.Peers = len(n.peers)
	n.mu.Unlock()
	n.dcMu.Lock()
	s.DCIsFree, s.DCIWaiters = n.arb.FreeCount(), n.arb.Waiting()
	n.dcMu.Unlock()
	if n.cfg.NoDC {
		s.DCIsFree = 0
	}
	s.RCActive = n.rcs.len()
	n.passiveMu.Lock()
	s.RCPassive = len(n.passive)
	n.passiveMu.Unlock()
	n.msg.mu.Lock()
	s.MsgRecvBuffers = n.msg.posted
	n.msg.mu.Unlock()
	n.mem.mu.Lock()
	s.MemHits, s.MemMisses, s.MemEvictions = n.mem.stats.hits, n.mem.stats.misses, n.mem.stats.evictions
	s.MemCached, s.MemCachedBytes, s.MemUncached = n.mem.lru.Len(), n.mem.bytes, n.mem.stats.uncached
	n.mem.mu.Unlock()
	return s
}

// PeerState describes what this node keeps for one peer.
type PeerState struct {
	GID         uint32
	Incarnation uint64
	Addr        string
	Transport   Transport // what a new VQP's operations take now
	RC          string    // RC connection phase
	Regions     int       // regions in the cached directory (-1: not cached)
	Active      int       // operations in progress
	Down        bool      // declared down on evidence of death (see the package doc)
}

// Peer describes the state kept for gid, if any.
func (n *Node) Peer(gid uint32) (PeerState, bool) {
	n.mu.Lock()
	p := n.peers[gid]
	n.mu.Unlock()
	if p == nil {
		return PeerState{}, false
	}
	select {
	case <-p.ready:
	default:
		return PeerState{GID: gid, RC: rcNone.String(), Regions: -1}, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PeerState{GID: gid, Incarnation: p.info.Incarnation, Addr: p.info.Addr.String(), RC: p.rc.phase.String(),
		Regions: -1, Active: p.active, Down: p.live.down}
	if p.rc.phase == rcReady {
		s.Transport = RC
	}
	if p.dir.valid {
		s.Regions = len(p.dir.regions)
	}
	return s, true
}
