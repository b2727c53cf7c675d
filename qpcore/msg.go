package qpcore

import (
	"encoding/binary"
)

// Two-sided messaging. A node binds ports and receives messages on them;
// any node sends to (gid, port). Messages travel as SENDs to the
// receiver's DCT (its SRQ holds RecvBuffers posted buffers of
// MsgThreshold bytes plus a header):
//
//   - small (shorter than MsgThreshold): the sender copies header and
//     payload into a registered bounce buffer and SENDs it; the receiver's
//     NIC places it in a posted buffer, and Recv copies it into the
//     caller's buffer and posts the buffer again. Two copies per byte.
//   - large (MsgThreshold or more), zero-copy rendezvous: the sender
//     registers the caller's buffer as a temporary remotely-readable MR and
//     SENDs only a header (RTS: length, rkey, token); Recv READs the
//     message straight into the caller's buffer and SENDs a FIN back; the
//     sender then deregisters the MR and returns. No copy by krfs.
//     If no reader took an announced message within MsgStageAfter, the
//     receiver pulls it into memory of its own (at most MsgStageMax bytes
//     staged at once) so that the sender returns; the reader then gets a
//     copy, counted in MsgLargeCopied.
//
// A receiver that posted no buffer answers with RNR NAKs; the sender's
// DCI retries, then qpcore retries after a backoff until MsgTimeout.
// Messages from one sender to one port arrive in order.
//
// Receive buffers grow on demand. A node posts initialRecvBuffers at
// start, enough to refuse messages to ports it has not bound, and the
// rest of RecvBuffers when its first port is bound. Registered up front,
// the default 64 buffers of 64 KiB made a new process's heap pass the
// garbage collector's first goal (4 MiB) during its start, and the
// collection that followed slowed its first connects and READs 2-5x.
//
// Ports and backpressure. Each port queues at most PortDepth messages;
// a small message waits in its receive buffer until read, so PortDepth
// (below RecvBuffers) is also what one slow reader can hold of the shared
// receive buffers: a full port never stops messages to the others. The
// receiver answers every small message and every RTS with a verdict (a
// FIN carrying the sender's token): queued, no such port, or port full.
// Send returns when the message is queued (small) or pulled (large);
// to an unbound port it fails with ErrNoPort; on a full port it retries
// after a growing back-off until ctx ends, then fails with ErrPortFull
// (EAGAIN). A rendezvous whose sender gave up (timed out and
// deregistered its buffer) is skipped by the reader, counted as dropped.
//
// Header (48 bytes, little endian): magic u16, kind u8, status u8, port
// u32, source gid u32, rkey u32, length u64, token u64, incarnation u64,
// raddr u64. An RTS's rkey and raddr name the message: raddr is the
// remote address of its first byte, its MR's IOVA (the caller's buffer
// need not start on a page boundary, so its MR is not zero-based; see
// verbs.MR.IOVA). The magic changed with raddr: a node of a release
// before it is refused as malformed, never misread.

const (
	msgMagic  = 0x4d4c
	msgHdrLen = 48

	msgData = 1
	msgRTS  = 2
	msgFIN  = 3

	// FIN statuses: the outcome of a rendezvous (finOK, finNoPort,
	// finFailed), or a receiver's verdict on a message that asked for
	// one (finOK: queued; finNoPort; finFull: the port's queue is full).
	finOK     = 0
	finNoPort = 1
	finFailed = 2
	finFull   = 3
)

type msgHdr struct {
	kind, status uint8
	port, src    uint32
	rkey         uint32
	length       uint64
	token        uint64
	inc          uint64
	raddr        uint64 // an RTS's message: the remote address of its first byte
}

func (h *msgHdr) put(b []byte) {
	binary.LittleEndian.PutUint16(b[0:], msgMagic)
	b[2], b[3] = h.kind, h.status
	binary.LittleEndian.PutUint32(b[4:], h.port)
	binary.LittleEndian.PutUint32(b[8:], h.src)
	binary.LittleEndian.PutUint32(b[12:], h.rkey)
	binary.LittleEndian.PutUint64(b[16:], h.length)
	binary.LittleEndian.PutUint64(b[24:], h.token)
	binary.LittleEndian.PutUint64(b[32:], h.inc)
	binary.LittleEndian.PutUint64(b[40:], h.raddr)
}

func parseMsgHdr(b []byte) (msgHdr, bool) {
	if len(b) < msgHdrLen || binary.LittleEndian.Uint16(b) != msgMagic {
		return msgHdr{}, false
	}
	h := msgHdr{kind: b[2], status: b[3], port: binary.LittleEndian.Uint32(b[4:]),
		src: binary.LittleEndian.Uint32(b[8:]), rkey: binary.LittleEndian.Uint32(b[12:]),
		length: binary.LittleEndian.Uint64(b[16:]), token: binary.LittleEndian.Uint64(b[24:]),
		inc: binary.LittleEndian.Uint64(b[32:]), raddr: binary.LittleEndian.Uint64(b[40:])}
	return h, h.kind >= msgData && h.kind <= msgFIN
}
