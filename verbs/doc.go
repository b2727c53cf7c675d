// Package verbs is the RDMA verbs interface that every krfs layer programs
// against: devices, protection domains, memory regions (MRs), completion
// queues (CQs), queue pairs (QPs) of the RC, DCI and DCT kinds, shared
// receive queues (SRQs), work requests (WRs) and work completions (WCs).
//
// Backends implement it; the default one is verbs/softnic, a software RDMA
// NIC over UDP. Layers above (meta, dct, qpcore, fs) import only this package,
// never a backend.
//
// # Addressing
//
// A WR names local memory by an SGE (MR, offset in MR.Buf, length) and
// remote memory by (rkey, address), where MR.Buf()[i] is at address
// MR.IOVA()+i. RegMR registers a buffer at the IOVA the kernel allows:
// its offset in its page (PageOffset), because ib_uverbs_reg_mr refuses an
// IOVA that differs from the buffer's address within the page. A
// page-aligned buffer's MR is therefore zero-based (IOVA 0) and peers
// address it by offsets alone; any other buffer's MR starts at a small
// non-zero IOVA, which its owner must publish beside the rkey.
//
// krfs allocates every buffer it publishes by rkey alone page-aligned
// (PageAligned: the region directory, exported regions, the meta service's
// table) and publishes the IOVA where it exposes memory it did not
// allocate (a rendezvous message's buffer). Local-only MRs may start
// anywhere: SGE offsets are relative to Buf whatever the IOVA.
//
// A device is addressed by the address its peers reach it at (Device.Addr:
// softnic's UDP socket, the rdma backend's connection manager), a QP by
// its 24-bit QPN on that device.
//
// # QP lifecycle
//
//	RESET -> INIT -> RTR -> RTS
//	  ^        |       |      |
//	  +--------+-------+------+---- any state -> ERR -> RESET
//
// RC QPs are normally brought up by the device's connection manager
// (Device.ListenRC / Device.ConnectRC), which exchanges QPNs and start PSNs
// over the device's control path, like rdma_cm. They can also be moved
// manually with QP.Modify. A DCI needs no peer: RESET -> INIT -> RTR -> RTS,
// and every WR names its target (DCTarget); it cannot go from RESET to
// ERR. A DCT moves RESET -> INIT -> RTR and nowhere else (it is destroyed,
// never moved to ERR or back to RESET); it serves as a target in RTR, its
// receive side is an SRQ, and its number (QPN) exists only from RTR on:
// read it after the transition (ValidTransition has the whole table).
//
// # Capabilities
//
// Device.Attr says what a device supports. Without atomics (AtomicNone)
// CMP_SWAP and FETCH_ADD are refused at post and remote atomic access at
// INIT, both with ErrNotSupported; AtomicHCA atomics are not atomic with
// the CPU's own accesses to the same word.
//
// # Errors
//
// Malformed WRs (no MR, deregistered MR, out-of-bounds SGE, zero or oversized
// length, misaligned atomics, unsupported opcode for the QP type, a full send
// queue, posting in a state that does not allow it) are rejected by PostSend
// or PostRecv with an error wrapping one of the Err* values below and the
// index of the first bad WR; nothing of the batch from that WR on is posted.
//
// Remote failures surface as completions: a remote access error (bad rkey,
// bounds, permissions), a remote invalid request (misaligned atomic, unknown
// DCT, wrong DC key), retry or RNR retry exhaustion. Each moves the QP to ERR,
// and every outstanding WR then completes with StatusWRFlushErr. Error
// completions are generated even for unsignaled WRs. Of an error
// completion only ID, Status, Reason, QPN and VendorErr are defined (see
// WC).
//
// The responder suffers too: an RC QP that refuses a request (remote
// access error, invalid request) moves to ERR as well, without a
// completion of its own; the device says so with an asynchronous event.
// A DCT, being shared, stays up.
//
// # Asynchronous events
//
// What a device reports outside completions arrives as an Event to every
// subscriber of Device.OnEvent: a QP moved to ERR as a responder
// (EventQPAccessErr, EventQPReqErr), an SRQ-attached QP in ERR
// (EventQPLastWQE), a fatal QP error, a CQ overrun (EventCQErr), an armed
// SRQ limit reached (EventSRQLimit), the port going down or up. A QP an
// event reports in ERR is of no further use: destroy it.
package verbs
