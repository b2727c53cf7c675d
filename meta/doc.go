// Package meta is krfs's meta service: it tells a node how to reach any
// other node with no handshake. Every node registers its DC metadata
// (device address, DCT number, DC key) and the rkey and length of its
// region directory; a peer resolves a node by gid with one one-sided RDMA
// READ of the meta server's node table, and caches the answer in a
// DCCache. This is KRCORE's meta server (USENIX ATC '22, section 4.1),
// with the parts its artifact lacks: leases, versioned entries, a hash
// table that one READ covers, cache invalidation, replicas.
//
// # Using it
//
// Standalone (`krfs meta`), the daemon opens a device and serves until
// told to stop:
//
//	dev, _ := softnic.OpenUDP("10.0.0.1:4791")
//	err := meta.Serve(ctx, dev, meta.ServerConfig{})
//
// Embedded (the single-node default of `krfs mount`), NewServer runs the
// server on the node's own device, next to everything else on it:
//
//	srv, _ := meta.NewServer(dev, meta.ServerConfig{})
//	defer srv.Close()
//
// (meta imports only the verbs interface, so opening the device is the
// caller's part.) A node makes one Client of one or more meta servers,
// registers itself through an Agent, and resolves peers through the
// Client:
//
//	cl, _ := meta.NewClient(ctx, dev, meta.ClientConfig{Servers: addrs})
//	defer cl.Close()
//	ag, _ := cl.Register(ctx, meta.NodeInfo{GID: 7, Addr: dev.Addr(),
//		DCTN: dct.QPN(), DCKey: key, DirRKey: dir.RKey(), DirLen: n}, meta.AgentConfig{})
//	defer ag.Close() // deregisters
//	peer, err := cl.Lookup(ctx, 12) // DCCache, else one READ
//
// When a work request to a peer fails with a reason for which StaleReason
// is true (the DCT rejected the DC key, or the DCT is gone: the peer
// restarted), the data path calls Stale with the NodeInfo it used; Stale
// drops the cached entry, reads the table again and returns the peer's
// new metadata, or ErrStale while the table still holds the old one.
//
// # The node table
//
// The table is one memory region of the server, registered for remote
// READ only: a 64-byte header, then slots of 128 bytes (EntrySize, two
// cache lines). layout.go has the byte layout. Besides what a DCI needs
// (address, DCT number, DC key) and the region directory's key, an entry
// carries the node's default region ("mem": rkey, length, access), so a
// peer's first READ of it follows the lookup with no directory READ, and
// the node's transport ("softnic/udp", "rdma/roce", "rdma/ib"), so a node
// can refuse a peer it cannot reach. Agent.Update publishes new values
// (the default region is exported after registration). A gid's home slot is Fibonacci
// hashing of the gid; the entry lies in one of the H slots starting at
// its home (hopscotch hashing, neighbourhood H = 16 by default), and the
// table has H-1 slots of padding at its end so a neighbourhood never
// wraps. A lookup is therefore exactly one READ of H*128 bytes (2 KiB) at
// a place the client computes; no server code runs. A miss is certain
// when the READ shows no torn slot and no match.
//
// Why hopscotch: it bounds where an entry can be to one contiguous range
// that a single READ covers, and keeps that range small while allowing a
// high load, because an insertion that finds its free slot too far away
// moves entries towards it (each move shifts an entry to a higher slot
// within its own neighbourhood). A 2-choice table needs two READs (or
// reads of two buckets) per lookup; a flat array scanned linearly, as in
// the KRCORE artifact, needs more. Sizing: keep the load at or below 1/2
// (the default is 32,768 home slots, 2 MiB, for up to 16,384 nodes): with
// random gids and H = 16 insertions start failing around 0.7
// (ErrTableFull); consecutive gids, which Fibonacci hashing spreads
// evenly, fill the table completely.
//
// List (the full-mesh bootstrap) and LookupMany with many misses read the
// membership map that follows the table in the same MR: a generation and
// one bit per live slot (layout.go). List READs the map, then the live
// slots (adjacent ones in one READ, 16 READs per doorbell), then the
// generation again, and starts over if it changed (a write group that
// changes which slots are live writes the generation odd before its slots
// and even after its bitmap words). So a List of 64 nodes moves about
// 12 KiB, not the whole table (4 MiB at the default size), which many
// nodes listing at once made the meta service's main load. From a server
// without a map (Bootstrap.MapOffset 0), or after 8 changes in a row, List
// READs the whole table: one READ up to ListChunk (16 MiB), otherwise
// several READs posted with one doorbell.
//
// # Versioned entries
//
// Each slot carries a 32-bit version at both ends (bytes 0 and 60). The
// server writes a slot from version v (even) to v+2 with four RDMA WRITEs
// that the NIC executes in order: head := v+1 (odd: write in progress),
// tail := v+2, body, head := v+2. A reader accepts a slot only if head
// equals tail and is even, and otherwise READs again. A READ lands in
// address order (a READ response is served front to back, and a lost
// packet is served again from that packet on, never earlier), so the
// head is read before the body and the body before the tail. If the
// reader saw any byte of the new body, it read the tail after the tail
// became v+2, so it accepts only if it also read head v+2, which the
// server writes after the whole body: the body it read is entirely new.
// If it saw only old body bytes and read the tail before it changed, both
// ends say v: entirely old. TestSeqlockInterleavings checks this against
// random interleavings at byte granularity, and shows that the naive order
// (body before tail) does accept torn slots.
//
// One field changes in place without a version change: the lease expiry
// word (byte 56), renewed by every heartbeat with one aligned 4-byte
// WRITE. It is advisory; readers never need it (the server clears expired
// entries itself).
//
// Moves: a hopscotch move first writes the entry to its new, higher slot
// and only later overwrites the old one (the next move's copy, or the new
// entry). Since a READ serves lower slots no later than higher ones, a
// lookup that misses the old copy (already overwritten) sees the new one;
// if it sees both, the higher one is current.
//
// The server never stores into the table with the CPU: it posts the
// WRITEs on a loopback RC QP connected to its own device. The NIC is then
// the table's only writer, ordering table writes and READ responses as a
// NIC does, which also keeps the Go race detector's view of the memory
// correct (a CPU store racing the NIC's copy of a READ response would be
// a data race in Go's memory model, whatever the versions say).
//
// The loopback QP pair is a QP pair like any other: a burst of loss on the
// host's own address (a firewall rule, a full socket buffer) exhausts its
// retries and puts it in the error state. The server then heals it by
// construction: it destroys the pair, connects a new one, and rewrites,
// from its registry, every slot that a write group in flight or waiting
// would have written (each under a newer version, so that a slot a failed
// group left half-written is whole again); the replies those groups held
// leave once the rewrite is done. A registration made during the fault is
// therefore published, not lost, and ServerStats.LoopRepairs counts the
// repairs. The DCT and client QPs are responders or per-client: a failed
// client QP is reaped and the client reconnects.
//
// # Bootstrap
//
// A client connects to a server's connection-manager service
// (DefaultService) with an RC QP; the reply's private data is a Bootstrap
// (bootstrap.go has the layout): table rkey and size, home slots and H,
// the table epoch, the server's incarnation (new at every start), the
// server DCT's number and key, the idle timeout and default lease. The
// client READs the table and sends messages over that QP. The server's
// DCT serves READs of the table too, so a node may READ it through any of
// its DCIs with (server address, DCTN, DCKey); a server on a device
// without DC (ServerConfig.NoDC) has none and says DCTN 0. Client QPs get remote READ
// access only, on a read-only MR: a client cannot write the table.
//
// # Messages
//
// Registration, heartbeats, deregistration, RPC lookups and pings are
// two-sided: an inline SEND to the server, whose receive buffers are
// shared by all clients through one SRQ, and an inline SEND back. The
// format (msg.go) is strict: every accepted message has one encoding
// (FuzzMessage checks parse/append round trips). Messages that do not
// parse are counted (ServerStats.Malformed) and, when their header
// allows, answered with a malformed status (ErrMalformed). One server
// goroutine handles every message; replies that announce a table change
// leave only once the table WRITEs completed, so a node that registered
// can be looked up at once.
//
// The RPC lookup path (LookupRPC, or ClientConfig.UseRPC, like KRCORE's
// meta-rpc build) answers from the server's in-memory registry through
// that goroutine. It exists as the baseline of the one-sided path.
//
// # Leases
//
// A registration holds a lease (ServerConfig.Lease unless the node asks
// for another, clamped to [MinLease, MaxLease]). The agent heartbeats
// every third of it. A lease that runs out is removed at the next sweep
// (every SweepInterval): its slot is cleared in the table, so a crashed
// node's entry stops being readable; a heartbeat that arrives after the
// expiry is refused too (ErrNotRegistered), so no late heartbeat revives
// a dead lease. A gid held by a live lease of another incarnation is
// refused with ErrGIDInUse; the same incarnation registering again is a
// refresh. Clean shutdown (Agent.Close) deregisters at once. Each daemon
// start makes a new Agent with a new random incarnation (or the node
// chooses it), so peers holding the old one see a different entry. A gid
// of 0 asks the server to assign one (from FirstAssignedGID up). Lease
// time comes from an injected clock.Clock (ServerConfig.Clock,
// ClientConfig.Clock), so tests drive it by hand.
//
// # Meta server restart
//
// A restarted server has an empty table and a new incarnation. Nodes
// notice when a heartbeat fails (their connection breaks: the old QP is
// gone) and reconnect; the new bootstrap's server incarnation tells them
// to register again, with the same gid and the same incarnation: the
// incarnation names the node daemon's life, and the node did not
// restart, so peers keep valid cached entries. Meanwhile peers go on
// using their DCCache; lookups that miss fail until nodes re-register.
//
// # Replicas
//
// A Client may name several servers. There is no consensus: each node
// writes only its own entry, to every server (an Agent runs one goroutine
// per server, so a server that is down delays no other, and registers
// with it when it comes back). Lookups go to the preferred live server
// and fail over to the next one when a connection fails (a dead server is
// noticed by the RC retry limit, QPTimeout*(QPRetryCnt+1), about the
// RPC timeout); a gid is
// reported not found only when every reachable server says so. NewClient
// returns as soon as one server answers, so a dead replica does not stop
// a node from starting or connecting. An assigned gid comes from the
// first server and is registered explicitly with the others.
//
// # Slow and unreachable servers
//
// A loaded machine can leave a process unscheduled for tens of
// milliseconds, more than a NIC's default ACK budget (softnic: 8 ms x 8).
// Both ends of a client connection therefore size their RC ACK timeout
// to the RPC timeout (QPTimeout = RPCTimeout/(QPRetryCnt+1), about 1 s in
// all): a slow server is not mistaken for a dead one, and a burst of
// lookups does not turn into a reconnection per lookup
// (TestColdLookupBurstSlowServer). A server whose connect failed is not
// dialed again by every caller: until its backoff ends (RetryInterval,
// doubling; see Start storms), callers fail at once and the client's
// maintenance goroutine retries.
//
// Many nodes starting at once load the machine that runs the meta
// service, which may then answer a connection request seconds late. A
// new client's first connection attempt therefore lasts until the
// caller's deadline (NewClient's ctx; at most FirstConnectTimeout, 8 s),
// not ConnectTimeout: the NIC
// resends the request with backoff (20 ms, doubling to 1 s), so a slow
// server gets one handshake per client to answer, where abandoning it at
// ConnectTimeout and starting another would leave it more requests whose
// requesters are gone (TestManyArriveAtASlowServer). Later reconnections
// keep ConnectTimeout, or twice the last handshake that succeeded if
// that took longer (at most FirstConnectTimeout), so that with the
// service down a lookup fails, or answers from the last entry it read,
// within it, while a service that was slow to answer is not given up on
// sooner than it answered.
//
// On an established connection, the NIC resends a READ whose response is
// late every ACK timeout, and a slow server answers every copy it finds
// in its socket. At a fixed 125 ms that fed on itself: 64 processes
// reading a meta service starved of CPU made it a backlog of seconds (a
// 10 MB receive queue), each READ was sent and answered up to 8 times,
// and connections failed. So a connection's ACK timeout adapts, as TCP's
// retransmission timeout does: a READ still waiting after it doubles it
// (on the client's clock, up to MaxQPTimeout, RPCTimeout by default; the
// NIC reads the new value at its next expiry), and a READ answered in
// time gives a sample, from which the timeout is the smoothed time plus
// four deviations, never below QPTimeout (ClientStats.Backoffs;
// TestLookupsBackOffFromASlowServer). A connection to a server that died
// therefore fails after about 6 s without an answer, not 1 s. An RPC
// waits for its reply RPCTimeout, or the NIC's retry budget at the
// current ACK timeout if longer. The server's own loopback QP, which
// writes the table, uses the connection ACK timeout too, not the NIC's
// 8 ms default: on a starved host its ACKs wait in the server's socket,
// and resending every 8 ms filled that socket with its own WRITEs
// (TestStarvedServerLoopbackRetransmits).
//
// An operation whose connection fails under it with a transport error
// (its QP went to ERR: a SEND or READ out of retries, a server that lost
// the QP) is not failed at once: the client connects to the same server
// again, which rebuilds the QP, and repeats it, while the caller's
// context lasts and at most MaxRebuilds times (ClientStats.Rebuilds).
// Every request is safe to repeat: the server may have executed the
// first, so a registration that asks for a gid gets the gid it was
// assigned then, not a second one.
//
// Every error a client returns is a meta *Error with an errno (Errno):
// ErrUnreachable is EHOSTDOWN, ErrNotFound ENOENT, ErrStale ESTALE...;
// failures below (a connection request that timed out, a QP error) are
// wrapped in ErrUnreachable, so a file system never reports them as EIO.
//
// With every server unreachable, Lookup answers a gid it read before
// from the last entry it read (Stats.LastKnown), whatever the DCCache
// evicted: peers in use keep working while the meta service is down.
// Stale and a server's "not found" drop that entry.
//
// # Start storms
//
// Many nodes starting at once, or a server continued after a stop that
// finds every lease expired together, ask for more than the server can do
// at once. It admits what it can serve and sheds the rest early, with an
// answer clients back off from (admit.go), rather than let requests queue
// until they time out and are sent again:
//
//   - At most ServerConfig.MaxHalfOpen connections (default 2,048) may be
//     accepted and not yet heard from; further connection requests are
//     rejected as busy before any QP is made.
//   - While more than MaxPendingWrites table WRITEs (default 8,192, about
//     2,000 registrations) wait, registrations are answered ErrBusy
//     (EAGAIN) without queuing anything. Heartbeats, deregistrations,
//     lookups and pings are always served: registered nodes keep their
//     leases. A client of message version 2, which does not know the
//     status, is served.
//   - Every batch of table WRITEs, a sweep that removes 10,000 expired
//     leases included, is cut into groups that fit the loopback send
//     queue (tablewrite.go), so the loop never waits for room that cannot
//     come (TestMassExpiryKeepsAnswering, TestStoppedServerRecovers).
//
// ServerStats.Busy counts the load shed; HalfOpen, PendingWrites and their
// peaks show how close the server came to its bounds.
//
// A client backs off (reconnect.go), on its clock (ClientConfig.Clock, by
// default the device's: the clock of its ACK timeouts): a server whose
// connection attempt failed is tried again after RetryInterval, doubled
// per further failure up to MaxRetryInterval (8 s), each wait multiplied
// by a random factor in [0.5, 1.5) so that nodes refused together do not
// return together. A new client's first connection and an agent's
// registration that are answered busy wait out the backoff and try again
// while the caller's context lasts (ClientStats.Busy); a later caller
// whose server was busy waits out the rest of the backoff if it ends
// within a connection attempt's time. Requests back off like READs: an
// RPC still waiting after its connection's ACK timeout doubles it, so a
// slow server is not sent a copy every 125 ms. TestStartStorm simulates
// 10,000 nodes starting within 1 s against a server that handles 50,000
// packets per second (a testing/synctest bubble on the fake network,
// softnictest's SetRxRate), and against three replicas.
//
// # DCCache
//
// Lookup answers from a ristretto cache bounded by cost (one per node,
// ClientConfig.CacheEntries) with a TTL (CacheTTL, wall-clock time, as
// ristretto keeps it). Invalidate drops one entry; a lookup that raced an
// invalidation does not put what it read back into the cache. NewClient
// does not wait for the cache to be built: lookups of its first
// millisecond or so read the table and are not cached (Stats.Uncached).
// The cache's frequency sketch, which ristretto consults only once the
// cache is full, is sized for 4,096 entries whatever CacheEntries says:
// sized for 64 Ki it made a fresh process's NewClient 2-3x slower.
//
// Ristretto applies each Set and Del on its own goroutine, which an idle
// cache must wake: a thread woken on another CPU in the middle of every
// cold connect. So an entry read from a server first goes to a small map
// in front of ristretto (dcfront.go; lookups look there first) and moves
// into ristretto with 63 others; until an entry has moved, Invalidate does
// not touch ristretto. A process that looks up a few peers never wakes
// ristretto's goroutine (cold connect + first READ across a veth: 3.1
// futex calls per connect before, 0.07 after).
//
// # Concurrency
//
// Server: one goroutine owns the registry and all posting; regMu lets
// Nodes and Stats read the registry, connMu guards the connection map
// (the connection manager's accept runs on the device's receive path).
// Client: safe for concurrent use; per server connection, callers take an
// operation slot and whoever waits polls the connection's CQ for everyone
// (pollMu), so a single caller is woken by its own completion without a
// goroutine handoff. Lock order: Server regMu, then connMu; Client
// server.mu, then conn.mu; conn pollMu, then the QP's internal locks.
//
// # Files
//
// The wire formats are leaves that know nothing of the server or the
// client: layout.go (the table, its slots and the membership map),
// msg.go (messages), bootstrap.go (the connection's private data),
// nodeinfo.go (NodeInfo and the errors). The server: server.go
// (configuration, setup, accepting connections), srvloop.go (its one
// goroutine: messages, replies, sweeps), tablewrite.go (write groups and
// the loopback QP that executes them), registry.go and table.go (leases
// and the hopscotch index, a pure state machine), admit.go (load
// shedding), auth.go and limits.go (node keys, per-source limits). The
// client: client.go (configuration and the connection to each server),
// conn.go (one connection: operation slots, completions, the adaptive ACK
// timeout), reconnect.go (backoff), failover.go (running an operation on
// the servers in turn), lookup.go and connread.go (lookups and listing),
// dcfront.go (the DCCache's front),
// agent.go (registration and heartbeats).
package meta
