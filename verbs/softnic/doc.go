// Package softnic is a software RDMA NIC: the default backend of the verbs
// interface, for machines without RDMA hardware. It speaks a RoCE-like
// protocol over UDP (package wire) and behaves like a NIC, failure
// semantics included, so that everything built on it is honest.
//
// # Opening a device
//
//	dev, err := softnic.OpenUDP("127.0.0.1:0") // or Open(Config{Link: ...})
//	pd, _ := dev.AllocPD()
//	cq, _ := dev.CreateCQ(1024)
//	mr, _ := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
//
// A device owns one link endpoint (one UDP socket) and demultiplexes
// packets by destination QPN. Tests use softnictest's in-memory network,
// which drops, duplicates, reorders and delays packets, with the same code.
//
// # Transports
//
// RC QPs are connected by the device's connection manager
// (Device.ListenRC, Device.ConnectRC): a REQ/REP/RTU handshake that
// exchanges QPNs and start PSNs, like rdma_cm. A DCI needs no connection:
// each WR names a DCTarget (device address, DCT number, DC key). As on
// mlx5, a DCI serves one target at a time: a WR for another target waits
// until the earlier WRs completed. Each time its queue drains, the DCI
// opens a new session (the PSN it starts at travels in every DC request);
// the DCT keeps only the latest session's state per initiator, bounded by
// MaxDCTContexts, and checks the DC key on every request.
//
// # Reliability
//
// Requests carry 24-bit PSNs. The requester keeps up to 4,096 PSNs in
// flight, asks for an ACK on every message's last packet and every 16th
// packet, and retransmits go-back-N from the oldest unacknowledged PSN on
// timeout (QPAttr.Timeout, RetryCnt times, then RETRY_EXC_ERR), on a
// sequence NAK (sent once per gap), and when an ACK or a later READ
// response shows that a READ or atomic response was lost. Receive-not-ready
// is answered with an RNR NAK and retried after the timer it carries.
//
// The ACK timeout runs only while a transmitted PSN is owed (not yet
// acknowledged, or a READ or atomic whose response is missing), and starts
// when a packet leaves. Each QP has one timer, not one per operation: an
// acknowledgment moves the deadline or ends the wait, and a timer that
// fires before the deadline that holds then schedules itself for it (or
// lapses when nothing is owed), so back-to-back operations make no timers.
// The receive path reads the clock once per received batch for the
// deadlines its acknowledgments move (not once per READ response segment).
// A NIC's receive pipeline never falls behind, so
// its timeout means the peer or the network did not answer; softnic's is
// software and on a busy host an ACK can wait in the device's own socket
// while the timer fires. So a timeout counts against RetryCnt only if the
// receive path has caught up since the previous retransmission: after
// each retransmission on timeout the device sends itself a probe datagram,
// and the next timeout counts only once the probe came back. Nor does a
// timer that fired more than a whole Timeout late count: the host itself
// was stalled, and with it any peer on the same host. At most
// MaxUncountedTimeouts timeouts in a row go uncounted: a WR to a dead peer
// fails after RetryCnt+1 timeouts without progress on a host that keeps
// up, and after at most RetryCnt+1+MaxUncountedTimeouts (24 x Timeout
// with the default RetryCnt 7) on one whose receive path is starved.
//
// The responder executes every request exactly once, in PSN order.
// Duplicates are answered from state: SEND and WRITE are re-ACKed, READ is
// served again (as on InfiniBand, a re-executed READ sees later WRITEs; use
// verbs.Fence where that matters), and an atomic is answered from a replay
// cache of original values.
//
// A request the responder cannot execute — bad rkey, out of bounds,
// missing permission, misaligned atomic, wrong DC key, unknown QP, a READ
// longer than MaxMsgSize or in responses smaller than any requester uses
// (256 bytes) — is NAKed; the requester's QP moves to ERR and its outstanding WRs complete
// with StatusWRFlushErr. Completions carry a verbs.Reason saying why, so an
// upper layer can tell a restarted peer (ReasonDCKey, ReasonNoQP) from a
// bad request. An RC responder moves to ERR too; a DCT, being shared,
// does not.
//
// # What an RNIC refuses, softnic refuses
//
// softnic applies the rules of mlx5 and the kernel's uverbs that the
// layers above must survive on hardware (see verbs/verbstest, group
// Hardware): an MR is registered at its buffer's page offset (MR.IOVA),
// so a peer that reads an unaligned MR as zero-based misses; a DCT has no
// number before RTR; a DCT moves only RESET->INIT->RTR and a DCI cannot
// go RESET->ERR; an error completion's opcode, byte count, immediate and
// source are filled with misleading values (poison); a responder RC QP
// that refuses a request raises EventQPAccessErr or EventQPReqErr, and an
// SRQ-attached one EventQPLastWQE, as it moves to ERR; a CQ overrun raises
// EventCQErr and an armed SRQ limit EventSRQLimit (Device.OnEvent);
// Device.SetPortActive takes the port down and up (EventPortErr,
// EventPortActive); with Config.NoAtomics the device has no atomics and
// refuses them.
//
// # Zero copy
//
// Payloads are sent straight from registered memory (the link gathers
// header and payload slices into one sendmmsg, in GSO runs). On receive,
// a READ response's payload lands directly in the READ's local buffer, by
// the kernel's own socket copy, when that buffer is private: no MR with
// remote access covers it, so nobody but the READ's owner can look at it
// before the READ completes. The link places a datagram before anyone has
// seen its header, on a prediction (link.Predictor); a wrong one leaves
// that datagram's bytes in the predicted memory until the READ's own
// response replaces them, and the engine copies the mispredicted payload
// where it belongs (counted in DeviceStats.Misplaced).
//
// Everything else is received into the link's scratch buffer and copied
// after its header was checked: a WRITE's payload into the target MR
// (counted in DeviceStats.WriteCopied), a SEND's into the receive buffer.
// A WRITE's target is memory peers READ and local programs map; a real
// NIC never puts one packet's bytes where another's belong, and a
// software NIC that cannot see a header before the kernel places the
// bytes can only promise the same by checking first. The copy runs at
// memory speed (tens of GB/s) against a network's few, and an aborted
// WRITE leaves only bytes of that WRITE.
//
// # Threads and locks
//
// The link's receive goroutine runs all packet processing; responses it
// produces leave in one send per receive batch (a long READ's responses in
// sends of at most 1,024 packets, so that what one request queues is
// bounded). Application calls
// (PostSend, PostRecv, Modify) run on the caller's goroutine and send
// directly. Each QP has a mutex; the device's rxMu orders the receive path
// against MR deregistration, QP destruction and error flushes (lock order
// rxMu, qp.mu, then cq/srq/device mutexes). The device predicts where the
// next payloads belong (link.Predictor: the oldest READ in progress into
// private memory), and the link may then hold rxMu while
// blocked receiving into that memory; everything else takes rxMu with
// lockRx, which makes Predict decline and interrupts the blocked receive.
// Completions the receive path
// produces are delivered after the packets it queued have been sent, so
// the application owns a WR's memory again only when the NIC is done with
// it. Device.SyncMemory orders the caller's memory accesses with the NIC's
// for the Go memory model.
package softnic
