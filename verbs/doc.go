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
// Memory regions are zero-based: a WR names remote memory by (rkey, offset
// within that MR), and local memory by an SGE (MR, offset, length). This is
// IBV_ACCESS_ZERO_BASED in ibverbs terms. A device is addressed by the UDP
// address it is opened on (its GID analogue), a QP by its 24-bit QPN on that
// device.
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
// and every WR names its target (DCTarget). A DCT serves as a target once in
// RTR; its receive side is an SRQ.
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
// completions are generated even for unsignaled WRs.
package verbs
