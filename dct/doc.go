// Package dct manages a node's Dynamically Connected Transport: the fixed
// pool of DC initiators (DCIs) it sends through, the policy that shares
// those DCIs among peers, and the node's single DC target (DCT) with its
// shared receive queue (SRQ) and DC key.
//
// It is the layer under qpcore that KRCORE calls the DCQP pool. It imports
// only package verbs; nothing here knows about virtual QPs or peers beyond
// an opaque endpoint value.
//
// # The pieces
//
//   - Target is the node's DCT: one per node, created in RTR, its receive
//     side an SRQ, its key random (NewKey). Peers reach the node with
//     (address, Target.DCTN, Target.Key) and nothing else: no handshake.
//   - Pool is the node's DCIs, created in RTS at start and never more. A DCI
//     that went to ERR is brought back with Pool.Recover (RESET, INIT, RTR,
//     RTS), keeping its QPN.
//   - Arbiter decides which endpoint (for qpcore, a peer) may use which DCI.
//     It is a pure state machine: no locks, no verbs, no time.
//
// # Assignment policy
//
// A DCI is connected to one target at a time: softnic, like mlx5, will not
// start a WR for another target until every earlier WR of the DCI
// completed. Sharing a DCI between two busy peers therefore blocks one
// behind the other (head-of-line blocking). The Arbiter follows UCX's
// dcs_quota policy instead:
//
//   - an endpoint with work and no DCI calls Acquire and gets the DCI on
//     top of a LIFO stack of free DCIs (the most recently used one, warm in
//     caches); all work of that endpoint then goes to that DCI, so one DCI
//     never serves two targets at once;
//   - when the endpoint's work on the DCI drained, it calls Release; the DCI
//     goes back on the stack, or straight to the first waiting endpoint;
//   - when no DCI is free, Acquire queues the endpoint (FIFO) and the caller
//     waits for Release to hand it one;
//   - the quota stops starvation: once an endpoint posted Quota WRs on its
//     DCI and others wait (Arbiter.Yield), it stops posting, lets the DCI
//     drain, releases it, and queues again behind the waiters.
//
// # DCI states
//
//	        Acquire                 StartRecovery
//	Free ------------> Busy ------------------------> Recovering
//	 ^                 |  ^                              |
//	 +---- Release ----+  +------- FinishRecovery -------+
//
// Release to a waiting endpoint keeps the DCI Busy under its new owner.
// A DCI is recovered by its owner; it is never released while Recovering.
// Any other transition is a bug in the caller and panics.
//
// # Defaults
//
// DefaultDCIs is 16. A DCI costs little (a QP and a send queue of
// DefaultDepth entries, about 60 KiB when full in softnic), and the pool is
// fixed, so the number only bounds how many peers can have work in flight
// at the same instant before one waits for another. UCX uses 32 per
// interface on hosts with dozens of cores; krfs nodes are small (the
// reference machine has 2 vCPUs, which cannot keep more than a handful of
// targets busy at once) and the quota keeps a queue of waiting peers
// moving, so 16 leaves headroom for bursts to many peers at half UCX's
// memory. Nodes talking to few peers at a time can go lower (the tests run
// 1,000 VQPs on 8).
package dct
