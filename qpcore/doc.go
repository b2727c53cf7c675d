// Package qpcore gives a node virtual QPs (VQPs) to any peer in
// microseconds, KRCORE's core: a VQP is a handle multiplexed on a fixed
// pool of DC initiators shared by every peer, or on an RC QP built in the
// background for peers talked to a lot. Requests are checked before they
// reach a shared QP, a shared QP that fails anyway is recovered without
// its other users noticing, and a node's memory does not grow with the
// size of the cluster.
//
// qpcore imports only package verbs (and dct, meta's NodeInfo); it runs on
// any verbs.Device, softnic today.
//
// # Quick start
//
//	n, err := qpcore.NewNode(dev, resolver, qpcore.Config{GID: 7})
//	metaClient.Register(n.Info())            // what peers need to reach n
//	n.Export("mem", buf, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
//
//	v, err := n.Connect(ctx, 12)             // no network traffic if 12 is known
//	err = v.Read(ctx, dst, "mem", 4096)      // one-sided READ into dst
//	err = v.Write(ctx, src, "mem", 0)
//	old, err := v.FetchAdd(ctx, "mem", 8, 1) // 8-byte aligned word
//	v.Close()
//
// The Resolver (the meta client, or a map in tests) maps a gid to the
// peer's meta.NodeInfo: address, DCT number, DC key, and the rkey and
// length of its region directory. Connect to a peer the node already
// knows costs a map lookup (about 0.1 us); to an unknown one, one
// Resolver.Lookup (one READ of the meta server). Peers with no open VQP
// are forgotten LRU beyond Config.MaxPeers.
//
// # Operations
//
// Synchronous: Read, Write, CompareAndSwap, FetchAdd. Asynchronous: Post a
// batch of WRs, then Wait and Poll for Completions, which come in post
// order. A batch reaches each QP with one PostSend (one doorbell), and
// concurrent callers' operations to the same peer are batched the same
// way. A VQP executes its operations in post order, like a QP, across
// transport switches and error recovery.
//
// Buffers are plain []byte and zero-copy: a READ's response lands in dst
// and a WRITE is sent from src. qpcore registers a buffer on first use, up
// to its capacity, and caches the registration by base address (LRU, at
// most Config.MemCacheMax entries and Config.MemCacheSize bytes, 32 MiB by
// default; a cached registration keeps its buffer reachable, so the byte
// bound is what keeps the node's memory from growing with I/O sizes, and
// an entry unused for 1,024 lookups is let go), so a pool of reused
// buffers (go-fuse's, for example) is registered once. A buffer larger
// than MemCacheSize is registered for its operation only.
// Stats reports the cache (MemCached, MemCachedBytes, MemUncached). Register
// registers a buffer for good; any sub-slice of it can then be used. A
// buffer belongs to the NIC from the call until the operation completes:
// a synchronous call returns only then, even when ctx is cancelled after
// the operation reached a QP (cancellation withdraws operations still
// queued). Atomics' results come back through qpcore's own registered
// slots. A caller blocked in the device's receive (driving, see
// verbs.DrivenCQ) sees ctx end within 20 ms (link.DonePoll) when ctx's
// deadline was 100 ms or more away as it began waiting, and at once
// otherwise; this spares every operation with a timeout a wake-up
// registration (about 0.7 us).
//
// # Regions and the region directory
//
// Export registers a buffer and lists it, by name, in the node's region
// directory. The buffer must start on a page boundary (ErrUnaligned):
// peers address a region by offsets, and a NIC registers memory at its
// page offset (verbs.MR.IOVA), so only then is its MR zero-based. The
// directory is a registered, remotely readable, page-aligned block (DirLen(MaxRegions)
// bytes, 4 KiB by default) of fixed-size records — name of up to 32 bytes,
// rkey, length, access flags, owner and mode bits for the filesystem, and
// a seqlock per record (see regdir.go for the layout). Peers read it with
// one READ the first time they operate on the node, cache it, and read it
// again when a NAK says it is stale (invalid rkey, bounds, permission) or
// when an unknown name is asked for; a READ that caught a record being
// rewritten is detected by the seqlock and repeated (a few times at once,
// then with a backoff, for up to PeerTimeout, since the writer may be
// descheduled in the middle of its update; then ErrDirectory). Unexport
// removes the record, then deregisters the memory.
//
// # Pre-check
//
// Every operation is checked before it may reach a QP shared with other
// VQPs: local buffer length (ErrLocalLength), opcode (ErrOpcode), atomic
// alignment (ErrAlign), the remote range against the region's length
// (ErrRemoteBounds) and access flags (ErrRemoteAccess) from the directory,
// region existence (ErrNoRegion). The rkey is taken from the directory
// again when the operation is posted, so a region that shrank or vanished
// meanwhile fails the operation there, still before the QP. Queue
// capacity: a VQP has at most Config.VQPDepth operations outstanding;
// Post waits for room, or returns ErrWouldBlock with NoBlock; qpcore
// never posts more WRs than a QP has free slots (operations wait in
// software queues instead). Refusals are counted per cause in Stats and
// never touch a QP. Errors match their errno (errors.Is(err,
// syscall.ENOENT)), for the filesystem.
//
// # The hybrid pool
//
// Each node has Config.DCIs DCIs (16 by default; see package dct for why)
// and one DCT with an SRQ. All operations to one peer share the DCI the
// arbiter gives that peer while it has work (a DCI serves one target at a
// time, so sharing one between two busy peers would block one behind the
// other); the arbiter follows UCX's dcs_quota policy (LIFO stack of free
// DCIs, release when drained, quota against starvation).
//
// A peer with RCThreshold operations within RCWindow is hot: an RC QP to
// it is built in the background with the connection manager, while its
// VQPs go on over DC. When it is ready, each VQP moves to it at its next
// operation, but only once its operations in flight on DC completed: until
// then new operations are held (the fence), so no operation overtakes an
// earlier one of the same VQP. At most RCCap RC QPs exist; one idle for
// RCIdle is torn down, and a new hot peer evicts the least recently used
// one that has been idle for RCWindow. Teardown drains the QP first and
// moves its VQPs back to DC through the same fence.
//
// # RC-only
//
// On a device without DC transport (rxe, siw, RNICs other than mlx5) set
// Config.NoDC: the node creates no DCI and no DCT and publishes DCT number
// 0 (and DC key 0), which tells peers it has none. Every peer of such a
// node, and every peer that published DCT number 0 to a node with DC, is
// RC-only: all its operations, the directory READs and messages included,
// wait in one queue while an RC QP is connected through the connection
// manager on first use (bounded by PeerTimeout), then go on it in order.
// There is no transport switch, hence no fence; DisableRC and RCThreshold
// do not apply to RC-only peers.
//
// RCCap still bounds the active RC QPs. A connection to a new RC-only peer
// that finds the pool full reclaims the least recently used RC QP with
// nothing queued or in flight (its peer reconnects on its next operation);
// if every QP is busy it waits, looking again every Tick and whenever a
// slot is freed, and after PeerTimeout the peer's queued operations fail
// with ErrRCPoolFull. Stats.RCEvictions counts the reclaims, RCSlotWaits
// the waits. An RC QP that fails (or whose passive side the peer
// reclaimed) is dropped and its operations wait for a new one; a failed
// connection fails the queued operations (ErrPeerUnreachable).
//
// The passive side keeps at most 4*RCCap accepted QPs, reclaiming those
// idle for 2*RCIdle, and destroying at once one the device reports in ERR
// (a peer's bad request moves a responder QP to ERR with no completion on
// this side; see events.go): a node reached over RC by more initiators than that
// within 2*RCIdle refuses the next ones, whose operations fail. Size RCCap
// for the number of peers a node talks to at once. Memory: on softnic one
// RC connection costs about 9 KiB of heap (4.4 KiB for the active QP,
// 4.6 KiB for the passive QP and connection state), the DCI pool and DCT
// of a DC node about 300 KiB in all (BenchmarkQPCoreRCOnlyMemory); see
// docs/hardware.md for what that means at 1,000 and 10,000 peers.
//
// # Failures
//
// Isolation: when a shared QP errors anyway (a region deregistered
// between check and execution), every WR on it comes back flushed. qpcore
// then resets a DCI to RTS (an RC QP is dropped and its operations go to
// DC), reports the error (a *RemoteError with the NAK's reason) to the
// erroring operation only, and posts the flushed innocent operations
// again, in order, after re-reading the directory. Other VQPs see nothing
// but a short delay. An atomic is never posted again once it was sent,
// unless the responder refused it: it may have executed, so it fails with
// ErrAtomicLost (ETIMEDOUT, "outcome unknown"). Every other error of an
// atomic (EHOSTDOWN, ENOENT, EACCES, a *RemoteError...) means it did not
// run, so a caller may retry those and only those.
//
// Staleness: a DC key or unknown-DCT NAK means the peer restarted. The
// peer's operations are parked, the Resolver entry invalidated and the
// peer looked up again; then each operation is retried once with the new
// metadata and directory (ErrStale if that fails too).
//
// Timeouts and liveness: Config.PeerTimeout (krfs's --timeout, 1 s by
// default) is a hard bound on every READ, WRITE and atomic, success or
// error (a message's SENDs: MsgTimeout): it ends within PeerTimeout plus
// one housekeeping Tick, with no timer per operation. One transport attempt of a WR lasts PeerTimeout/4 (ACK
// timeout PeerTimeout/32, 7 retries, restarted by any progress); an
// operation whose attempt exhausted its retries is posted again if one
// more attempt ends by its deadline (an atomic is not: it may have
// executed, ErrAtomicLost, also when the peer is then found dead); an operation waiting outside a QP (queued,
// held by a fence, stalled for a re-lookup) is failed by the housekeeping
// tick once its deadline passed, with ErrTimeout. A peer is declared down
// only on evidence of death: 3 consecutive retry-exhausted attempts with
// no answer in between, spanning 3/4 of PeerTimeout of silence. Then its
// operations fail with ErrPeerUnreachable, new ones at once except one
// probe at a time (one per attempt), and any answer brings it back. The
// first silence of a peer also looks it up again in the background, so a
// peer that moved is followed within an attempt or two. See liveness.go.
// A caller therefore needs no deadline of its own: pass a context with one
// only for a shorter bound or to cancel. context.WithTimeout costs a runtime
// timer and 4 allocations per call (0.5-0.7 us on a 2-vCPU VM, a few
// percent of an 8-byte READ).
//
// # Messages
//
// Bind(port) returns a Port to Recv from; Send(ctx, gid, port, msg)
// delivers one message. Messages below Config.MsgThreshold (64 KiB) are
// SENT through a bounce buffer into one of the receiver's RecvBuffers
// posted buffers and copied out by Recv (2 copies per byte, counted);
// larger ones use a zero-copy rendezvous: the receiver READs them straight
// from the sender's buffer into its own (0 copies). A receiver out of
// buffers makes senders retry (RNR) until MsgTimeout. See msg.go.
//
// # Memory
//
// A node's footprint is the DCI pool (none with NoDC), the RC pool (RCCap), the receive and
// bounce buffers, the peer table (MaxPeers) and the registration cache
// (MemCacheMax entries, MemCacheSize bytes), all bounded by configuration and independent of the
// number of nodes in the cluster: about 10 MiB of heap with the defaults,
// 10,000 peers known and 1,000 VQPs open (BenchmarkQPCoreMemory).
//
// # Code map
//
// Node coordinates; each state machine is a type of its own, in its own
// file, whose fields change only through its methods and which knows
// nothing of the node:
//
//	rcLink    rclink.go    a peer's RC connection: none, connecting, ready,
//	                       draining; its QP (rcConn), retry bound, traffic
//	                       meter. The only code that changes the RC phase,
//	                       each edge checked (rcLink.set).
//	fence     fence.go     a VQP's route (DC or RC), its operations on each,
//	                       and those held while a switch waits for the old
//	                       route to drain; fencedVQPs lists a peer's.
//	liveness  liveness.go  a peer's strikes, silence, down state and probe.
//	peerPause pause.go     a peer paused for a re-lookup or an RNR backoff,
//	                       and the failed operations waiting for it.
//	dirCache  dircache.go  a peer's cached region directory, or the meta
//	                       entry's hint of its default region.
//	opState   op.go        an operation: new, held, queued, posted,
//	                       stalled, done (op.setState checks each edge).
//
// rcPool (rcpool.go) keeps the RC QPs' slots under its own lock. The
// node's side of each: rc.go (reserving, evicting and freeing slots, and
// the coordination of a connection's transitions), fence.go (which route a VQP wants, queueing
// what a fence lets through), liveness.go (deadlines, declaring a peer
// down), dci.go (DCIs through dct's arbiter), failures.go (what an
// errored QP's operations become; starting a pause's re-lookup or
// backoff).
//
// A READ, in the order the files read:
//
//	vqp.go       VQP.Read -> do: admit (VQPDepth), post, wait, release
//	post.go      post: usable peer (liveness.go), build the op
//	precheck.go  pre-check against the directory cache (peerdir.go)
//	fence.go     enqueue: the VQP's route queue, or held behind its fence
//	rc.go        noteTraffic: a peer turning hot starts an RC connection
//	kick.go      kick: the queue onto the peer's DCI (dci.go) or RC QP
//	wait.go      wait: drive the device or wait for the dispatcher
//	complete.go  the send completion: its QP's accounting
//	effects.go   finishLocked, then deliver (after the peer's lock)
//
// Errors continue in failures.go; messages in msg.go (wire), msgsend.go,
// msgrecv.go, port.go, rendezvous.go, staging.go and msgbuf.go; the
// figures in stats.go and stattable.go.
//
// # Concurrency and locks
//
// Node, VQP and Port methods may be called from any goroutine. Locks, in
// the order they may nest:
//
//	Node.pollMu  serializes send completion processing
//	Node.mu      the peer table and LRU
//	peer.mu      everything of one peer: metadata, directory cache, queues,
//	             its DCI, its rcLink, liveness and pause, and its VQPs' fences
//	Node.dcMu    the DCI arbiter and DCI handovers (peer.grant)
//	rcPool.mu    the RC pool's accounting (rcConn.lastUsed is atomic)
//	VQP.mu       a VQP's admission count and completions
//	memCache.mu  registrations
//
// Two peers' locks are never held together; work that concerns another
// peer, results to deliver and QPs to destroy are collected while a lock
// is held and done after it is released. Node.passiveMu is taken by the
// device's receive goroutine (accepting RC connections) and is never held
// across a device call that waits for that goroutine.
//
// A dispatcher goroutine per node processes completions and does the
// housekeeping (RC idle teardown, passive QP reclaim). A goroutine waiting
// for a synchronous operation drives when the device supports it
// (verbs.DrivenCQ): it may receive packets for the device on its own
// goroutine and processes every send completion it finds (its own, other
// callers', asynchronous ones) until its operation is done; finishing
// another caller's operation wakes that caller through the operation's
// channel and the CQ's Wake. While any caller drives, the send CQ does not
// signal the dispatcher. Driving saves the hand-off from the device's
// receive goroutine to the caller, a thread wake-up per operation.
// With Config.NoDrive (or a device that cannot be driven) the caller polls
// the send CQ itself when it signals, and otherwise waits for the
// dispatcher.
//
// # Time
//
// Every time read, timer and timeout of a node (RC hot and idle windows,
// PeerTimeout, MsgTimeout, RNR back-off, the housekeeping tick) comes
// from Config.Clock, the system clock unless set. Tests give the node,
// its device and the in-memory network one softnictest.ManualClock, so
// nothing expires unless the test moves time.
//
// # Counters
//
// Node.Stats reports connects (hits, misses), WRs and doorbells per
// transport, fences and switches, DCI waits and yields, pre-check
// refusals by cause, QP errors and recoveries, re-posted WRs, re-lookups,
// RC connections, evictions and teardowns, directory reads, and message
// bytes delivered and copied per path. Each figure is one row of the stat
// table (stattable.go), which also names the Prometheus metric that
// exports it (package node). Node.Peer describes one peer.
package qpcore
