// Package verbstest is the conformance suite of the verbs contract: the
// behaviour every backend (verbs/softnic, verbs/rdma, ...) must show, and
// that the layers above verbs (dct, meta, qpcore) rely on. It imports only
// package verbs, so it runs unchanged against any backend.
//
// # Running it
//
// A backend's test gives the suite a Fabric: a way to open devices that
// can reach each other, and, on a simulated network, a way to move time.
//
//	func TestConformance(t *testing.T) {
//		verbstest.Run(t, verbstest.Fabric{
//			NewDevice: func(t testing.TB) verbs.Device { ... },
//			Advance:   clock.Advance, // nil on real time
//		})
//	}
//
// Every case is a subtest of Run named after the rule it checks, so that
// `go test -run 'Conformance/DC/KeyRejected'` runs one rule. Cases wait
// for completions with generous deadlines (30 s) and never with short real
// timeouts on a success path; where a case needs a timer to expire (retry
// exhaustion, RNR retries) it uses Fabric.Advance when the fabric has a
// manual clock and otherwise short protocol timeouts whose expiry is the
// expected outcome, so a busy machine only makes a case slower.
//
// # The contract (what dct, meta and qpcore rely on)
//
// Devices, PDs, MRs:
//   - Device.Addr is the address other devices name this one by (RC
//     RemoteAddr, DCTarget.Addr, ConnectRC); WC.SrcAddr of a received
//     message is the sender's Device.Addr and WC.SrcQPN its QPN (no layer
//     above reads them yet).
//   - An MR's remote addresses start at its IOVA, the buffer's offset in
//     its page (the kernel's rule for ibv_reg_mr): remote address 0 of a
//     sub-slice 100 bytes into a page is outside its MR, IOVA is its first
//     byte, and a page-aligned buffer's MR is zero-based (meta's table,
//     qpcore's directory and regions are allocated page-aligned;
//     qpcore's rendezvous publishes the IOVA of the message it exposes).
//   - The same memory may be registered twice with different access; each
//     rkey grants only its own MR's access (meta: a read-only table view for
//     clients and a writable one for its loopback QP).
//   - RegMR refuses an empty buffer (ErrLength) and remote write or atomic
//     access without local write (ErrInvalidArg); Dereg twice fails with
//     ErrMRDead; an rkey no longer works once its MR is deregistered.
//
// Posting (KRCORE's pre-check, done by the backend before any WR is
// handed to the NIC):
//   - PostSend and PostRecv validate WRs in order and stop at the first
//     bad one with a *verbs.PostError whose Index says how many were
//     posted (qpcore counts posted operations by it). Local errors:
//     ErrNoMR, ErrMRDead, ErrWrongPD, ErrBounds, ErrAccess (READ or atomic
//     into memory without local write), ErrLength (zero length, atomic sink
//     not 8 bytes, inline too long), ErrAlign, ErrOpcode, ErrNoTarget (DCI
//     WR without a target), ErrQueueFull, ErrQPState (send before RTS,
//     receive in RESET), ErrDestroyed.
//   - SendQueueFree counts down with posted WRs and back up with their
//     completions (qpcore sizes its doorbell batches by it).
//
// QP state machine:
//   - RESET -> INIT -> RTR -> RTS; other moves fail with ErrTransition; any
//     state -> ERR and -> RESET (a DCI not RESET -> ERR); a DCT moves only
//     RESET -> INIT -> RTR and serves there (verbs.ValidTransition).
//   - RC QPs can be connected by hand with Modify (meta's loopback pair on
//     one device) or by the connection manager.
//   - Access set on a QP in INIT survives a move back to RESET and is what
//     a passively connected QP grants (meta's server accept).
//   - A DCI recovers from ERR through RESET, INIT, RTR, RTS and works
//     again (dct.Pool.Recover).
//   - Modify and Post on a destroyed QP fail with ErrDestroyed.
//
// Operations (RC and DC alike): READ, WRITE, WRITE_WITH_IMM (consumes a
// receive, completes it as RECV_RDMA_WITH_IMM with the immediate), SEND and
// SEND_WITH_IMM into posted receives (ByteLen, Imm, SrcQPN), Inline SEND
// and WRITE (meta's requests), CMP_SWAP and FETCH_ADD returning the
// original value, multi-packet messages, batches of unsignaled WRs ended by
// one signaled WR (meta's table scans), one DCI alternating between DCTs
// on different devices (qpcore's DCIs).
//
// Errors as completions, each with its status and, where the backend can
// know it, its reason (qpcore tells a restarted peer from a bad request by
// them; meta.StaleReason):
//   - bad rkey, out of bounds, missing permission: REM_ACCESS_ERR with
//     ReasonRKey, ReasonBounds, ReasonPerm;
//   - wrong DC key: REM_INV_REQ_ERR with ReasonDCKey; an unknown DCT:
//     REM_INV_REQ_ERR with ReasonNoQP. The DCT itself keeps serving other
//     initiators (it is shared); the DCI moves to ERR.
//   - no receive posted and RNR retries exhausted: RNR_RETRY_EXC_ERR;
//     a peer that never answers: RETRY_EXC_ERR.
//   - every error completion is delivered even for an unsignaled WR; the QP
//     moves to ERR and every later outstanding WR, signaled or not,
//     completes with WR_FLUSH_ERR, in posting order; posted receives flush
//     too; WRs posted to a QP in ERR complete flushed.
//
// CQs: Poll returns what is there without blocking; Wait blocks until a
// completion is there or its context ends (no spinning); Notify's channel
// gets a value after completions are added (qpcore and meta select on
// it); Wait and Notify share the CQ's one wake-up, like an ibverbs
// completion channel, so a consumer uses one or the other; a destroyed
// CQ's Wait fails with ErrDestroyed.
//
// SRQs: receives posted to one SRQ serve every RC QP and the DCT attached
// to it; Posted counts them; a full SRQ refuses with ErrQueueFull at the
// right index.
//
// Connection manager: ConnectRC brings a RESET QP to RTS on both sides and
// carries private data both ways; a missing listener, a refused accept and
// a stopped listener fail with ErrCMRejected; an unreachable peer fails
// with ErrCMTimeout when the context ends; ListenRC refuses a duplicate
// service; ConnectRC needs a QP in RESET (ErrQPState).
//
// Hardware rules (mlx5 and the kernel's uverbs; softnic enforces them):
//   - A DCT has no number before RTR (QPN 0); the number it gets then is
//     the one DCIs reach it by; a DCT moves only RESET->INIT->RTR, a DCI
//     cannot go RESET->ERR.
//   - A responder RC QP that refuses a request moves to ERR: a remote
//     access error raises EventQPAccessErr for it (no completion there); a
//     SEND longer than the receive completes the receive with
//     LOC_LEN_ERR. Of an error completion only ID, Status, Reason and QPN
//     are defined.
//   - A shared DCI survives a target whose host is gone (retry error) and
//     a destroyed DCT, recovering each time; a SEND to an empty SRQ ends
//     in RNR_RETRY_EXC_ERR; one WR to a bad target fails and flushes the
//     WRs queued behind it for other targets, which never reach them and
//     succeed when posted again (KRCORE's isolation).
//   - A CQ overrun raises EventCQErr; a device without atomics
//     (Attr().Atomic AtomicNone) refuses them at post and at INIT with
//     ErrNotSupported; the connection manager settles on the smaller
//     path MTU, and Modify refuses one above MaxMTU or below 256.
//
// Cases that wait for retries use DCIs with a short ACK timeout, so they
// end well within Deadline on an RNIC too.
//
// # Backends without some features
//
// Fabric.NoDC skips DC cases with a message (an RNIC without DC: qpcore
// then runs RC-only). Fabric.InexactReasons accepts ReasonNone, and a
// transport error instead of REM_INV_REQ_ERR, where hardware cannot tell
// the reason (ibv_wc carries no reason; an mlx5 DCT drops requests with a
// wrong key silently): the status must still be an error and the QP must
// still move to ERR and flush. Fabric.DCTSourceUnknown accepts DCT
// receives without the sender's address (mlx5 reports only the DCI's
// QPN). Fabric.NewDeviceWithoutAtomics opens a device without atomics
// for the case that checks what one refuses.
package verbstest
