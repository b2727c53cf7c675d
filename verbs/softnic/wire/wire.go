// Package wire is the softnic packet format: a RoCEv2-like transport header
// carried in UDP datagrams. It is a leaf package: it imports nothing from
// the rest of krfs, holds no state, and every function is safe on garbage
// input.
//
// # Versions
//
// The second byte of every packet is the format version; a receiver reads
// nothing past it in a packet of another version (HeaderLen and Parse fail
// with ErrVersion). Version 1 had a 24-byte CMETH (no cookie) and, with a
// cluster key, a 16-byte per-packet MAC instead of AuthETH, and no
// handshake opcodes: the same opcode numbers and lengths would be misread
// by a version-2 parser, hence the new number. A version-2 node answers a
// version-1 connection request with a version-1 CM_REJ naming the version
// it needs (AppendVersionRefusal), so that an old node's connect fails
// with that reason instead of timing out.
//
// # Packet layout (version 2)
//
// All integers are big-endian. A packet is a base header, the extension
// headers its opcode and flags call for, in the order listed, then payload.
//
//	Base header (BTH analogue), 16 bytes:
//	  0  u8   magic 0x4B ('K')
//	  1  u8   version (2)
//	  2  u8   opcode (Op*)
//	  3  u8   flags (Flag*)
//	  4  u32  destination QPN (24 bits used; a DCT number for DC requests)
//	  8  u32  source QPN (24 bits used)
//	  12 u32  PSN (24 bits used)
//	AuthETH, 28 bytes, if FlagMAC (a cluster key is in use):
//	  0  u32     session index: the receiver's index of the authenticated
//	             session the packet belongs to (0 on handshake packets)
//	  4  u64     counter: the sender's per-session packet counter, never
//	             reused; the receiver accepts each counter once (replay
//	             window); 0 on handshake packets
//	  12 [16]u8  tag: HMAC-SHA256 (first 16 bytes) of the whole packet
//	             with this field zeroed, under the session's key for this
//	             direction (handshake packets: under the handshake key
//	             derived from the cluster key); zero when FlagEnc is set
//	  With FlagEnc the payload is AES-GCM ciphertext followed by its
//	  16-byte tag (nonce: the counter; additional data: the header with
//	  the tag field zeroed).
//	DCETH, 12 bytes, if FlagDC (requests from a DCI):
//	  0  u64  DC key
//	  8  u32  session PSN: first PSN of the DCI's current session with
//	          this target (24 bits); a newer session resets the DCT's
//	          transient state for this initiator
//	RETH, 20 bytes, on READ requests and on the first packet of a WRITE:
//	  0  u64  remote address (offset within the MR)
//	  8  u32  rkey
//	  12 u32  DMA length of the whole message
//	  16 u32  READ only: payload bytes per response packet (the
//	          requester's path MTU); 0 on WRITE
//	AtomicETH, 28 bytes, on CMP_SWAP and FETCH_ADD:
//	  0  u64  remote address
//	  8  u32  rkey
//	  12 u64  swap value (CMP_SWAP) or addend (FETCH_ADD)
//	  20 u64  compare value (CMP_SWAP)
//	ImmDt, 4 bytes, if FlagImm (on the last packet of a message):
//	  0  u32  immediate data
//	AETH, 8 bytes, on ACK, ATOMIC_ACK and READ_RESP packets:
//	  0  u8   syndrome (Syn*)
//	  1  u8   reason (why a NAK was sent; verbs.Reason values)
//	  2  u16  RNR timer in microseconds (RNR NAK)
//	  4  u32  MSN: count of completed messages (24 bits)
//	AtomicAckETH, 8 bytes, on ATOMIC_ACK:
//	  0  u64  original remote value
//	CMETH, 32 bytes, on CM_* packets:
//	  0  u32  service ID
//	  4  u32  QPN of the sender's QP for this connection
//	  8  u32  start PSN of the sender's QP
//	  12 u32  path MTU
//	  16 u64  connection ID chosen by the active side
//	  24 u64  cookie: on CM_REJ with reason CookieReason, the cookie the
//	          passive side asks for; on a CM_REQ, the cookie echoed back
//	  CM payload is private data (at most MaxPrivate bytes).
//	HS_INIT and HS_RESP (session handshake, FlagMAC required) carry their
//	fields in the payload; see verbs/softnic.
//
// For a READ response the PSN of each packet is the request's PSN plus the
// packet's index; a READ of N bytes at path MTU M takes ceil(N/M) PSNs
// (at least one) on both sides. Every other request message takes one PSN
// per packet.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the format version this package writes and accepts (see
// "Versions" in the package doc).
const Version = 2

// Magic is the first byte of every packet.
const Magic = 0x4B

// Sizes of the header parts.
const (
	BaseLen      = 16
	DCETHLen     = 12
	RETHLen      = 20
	AtomicETHLen = 28
	ImmDtLen     = 4
	AETHLen      = 8
	AtomicAckLen = 8
	CMETHLen     = 32
	MACLen       = 16 // the tag inside AuthETH
	AuthETHLen   = 12 + MACLen
	// MaxHeaderLen bounds every header: read this many bytes and HeaderLen
	// can always decide.
	MaxHeaderLen = BaseLen + AuthETHLen + DCETHLen + AtomicETHLen + ImmDtLen
	// MaxPrivate bounds CM private data.
	MaxPrivate = 192
)

// PSNMask keeps the 24 bits of a PSN.
const PSNMask = 1<<24 - 1

// Opcode is a packet opcode.
type Opcode uint8

const (
	OpSend Opcode = iota + 1
	OpWrite
	OpReadReq
	OpReadResp
	OpCmpSwap
	OpFetchAdd
	OpAck
	OpAtomicAck
	OpCMReq
	OpCMRep
	OpCMRTU
	OpCMRej
	OpHSInit // session handshake initiation (cluster key)
	OpHSResp // session handshake response
	opMax
)

// CookieReason is the private data of a CM_REJ that asks the active side
// to repeat its CM_REQ with the cookie the CM_REJ carries in CMETH.
const CookieReason = "cookie"

var opNames = [...]string{"", "SEND", "WRITE", "READ_REQ", "READ_RESP", "CMP_SWAP", "FETCH_ADD", "ACK", "ATOMIC_ACK", "CM_REQ", "CM_REP", "CM_RTU", "CM_REJ", "HS_INIT", "HS_RESP"}

func (o Opcode) String() string {
	if o > 0 && o < opMax {
		return opNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// IsRequest reports whether o travels requester -> responder and takes a PSN.
func (o Opcode) IsRequest() bool {
	return o == OpSend || o == OpWrite || o == OpReadReq || o == OpCmpSwap || o == OpFetchAdd
}

// IsCM reports whether o is a connection-manager packet.
func (o Opcode) IsCM() bool { return o >= OpCMReq && o <= OpCMRej }

// IsHandshake reports whether o is a session-handshake packet.
func (o Opcode) IsHandshake() bool { return o == OpHSInit || o == OpHSResp }

// Flags are base-header flags.
type Flags uint8

const (
	FlagFirst     Flags = 1 << iota // first packet of a message
	FlagLast                        // last packet of a message
	FlagAckReq                      // responder must acknowledge this PSN
	FlagImm                         // ImmDt present (last packet)
	FlagDC                          // DCETH present
	FlagSolicited                   // solicited event
	FlagMAC                         // AuthETH present
	FlagEnc                         // payload is AES-GCM ciphertext and tag (needs FlagMAC)
	flagsAll      = FlagFirst | FlagLast | FlagAckReq | FlagImm | FlagDC | FlagSolicited | FlagMAC | FlagEnc
)

// Syndrome is the AETH syndrome.
type Syndrome uint8

const (
	SynAck       Syndrome = iota // positive acknowledgement
	SynRNR                       // receiver not ready; retry after the RNR timer
	SynNAKSeq                    // PSN sequence error: resend from the PSN in the header
	SynNAKInv                    // invalid request (misaligned atomic, DC key, unknown QP, opcode)
	SynNAKAccess                 // remote access error (rkey, bounds, permission)
	SynNAKOp                     // remote operational error (receive too small)
	synMax
)

var synNames = [...]string{"ACK", "RNR_NAK", "NAK_SEQ", "NAK_INV_REQ", "NAK_REM_ACCESS", "NAK_REM_OP"}

func (s Syndrome) String() string {
	if s < synMax {
		return synNames[s]
	}
	return fmt.Sprintf("Syndrome(%d)", uint8(s))
}

// Errors from Parse.
var (
	ErrShort   = errors.New("wire: packet too short")
	ErrMagic   = errors.New("wire: bad magic")
	ErrVersion = errors.New("wire: unsupported version")
	ErrOpcode  = errors.New("wire: unknown opcode")
	ErrFlags   = errors.New("wire: flags invalid for opcode")
	ErrField   = errors.New("wire: field out of range")
)

// Header is a decoded packet header. Which fields are meaningful depends
// on Op and Flags (see the package doc).
type Header struct {
	Op     Opcode
	Flags  Flags
	DestQP uint32
	SrcQP  uint32
	PSN    uint32

	// AuthETH
	AuthIndex   uint32
	AuthCounter uint64
	MAC         [MACLen]byte

	// DCETH
	DCKey      uint64
	SessionPSN uint32

	// RETH / AtomicETH
	VA      uint64
	RKey    uint32
	DMALen  uint32
	RespMTU uint32 // READ: payload per response packet
	Swap    uint64 // swap value or addend
	Cmp     uint64

	Imm uint32

	// AETH
	Syndrome Syndrome
	Reason   uint8
	RNRTimer uint16 // microseconds
	MSN      uint32

	// AtomicAckETH
	Orig uint64

	// CMETH
	Service uint32
	CMQPN   uint32
	CMPSN   uint32
	CMMTU   uint32
	ConnID  uint64
	Cookie  uint64
}

func (h *Header) hasDCETH() bool { return h.Flags&FlagDC != 0 }
func (h *Header) hasRETH() bool {
	return h.Op == OpReadReq || (h.Op == OpWrite && h.Flags&FlagFirst != 0)
}
func (h *Header) hasAtomicETH() bool { return h.Op == OpCmpSwap || h.Op == OpFetchAdd }
func (h *Header) hasImm() bool       { return h.Flags&FlagImm != 0 }
func (h *Header) hasAETH() bool {
	return h.Op == OpAck || h.Op == OpAtomicAck || h.Op == OpReadResp
}
func (h *Header) hasCMETH() bool { return h.Op.IsCM() }

// Len is the encoded length of the header.
func (h *Header) Len() int {
	n := BaseLen
	if h.Flags&FlagMAC != 0 {
		n += AuthETHLen
	}
	if h.hasDCETH() {
		n += DCETHLen
	}
	if h.hasRETH() {
		n += RETHLen
	}
	if h.hasAtomicETH() {
		n += AtomicETHLen
	}
	if h.hasImm() {
		n += ImmDtLen
	}
	if h.hasAETH() {
		n += AETHLen
	}
	if h.Op == OpAtomicAck {
		n += AtomicAckLen
	}
	if h.hasCMETH() {
		n += CMETHLen
	}
	return n
}

// validateShape checks the opcode and the combination of opcode and
// flags: everything the header's length depends on.
func (h *Header) validateShape() error {
	if h.Op == 0 || h.Op >= opMax {
		return ErrOpcode
	}
	if h.Flags&^flagsAll != 0 {
		return ErrFlags
	}
	if h.Flags&FlagDC != 0 && !h.Op.IsRequest() {
		return ErrFlags
	}
	if h.Flags&FlagEnc != 0 && h.Flags&FlagMAC == 0 || h.Op.IsHandshake() && h.Flags&FlagMAC == 0 {
		return ErrFlags
	}
	if h.Flags&FlagImm != 0 && (h.Op != OpSend && h.Op != OpWrite || h.Flags&FlagLast == 0) {
		return ErrFlags
	}
	return nil
}

// validate checks the shape (validateShape) and the field values.
func (h *Header) validate() error {
	if err := h.validateShape(); err != nil {
		return err
	}
	if h.DestQP > PSNMask || h.SrcQP > PSNMask || h.PSN > PSNMask || h.SessionPSN > PSNMask || h.MSN > PSNMask {
		return ErrField
	}
	if h.hasAETH() && h.Syndrome >= synMax {
		return ErrField
	}
	if h.Op == OpReadReq && h.RespMTU == 0 {
		return ErrField
	}
	if h.Op == OpWrite && h.hasRETH() && h.RespMTU != 0 {
		return ErrField
	}
	return nil
}

// MACField returns the tag bytes of the AuthETH inside an encoded header,
// or nil if the header has none.
func MACField(hdr []byte) []byte {
	if len(hdr) < BaseLen+AuthETHLen || Flags(hdr[3])&FlagMAC == 0 {
		return nil
	}
	return hdr[BaseLen+12 : BaseLen+AuthETHLen]
}

// SetAuth writes the session index and counter of the AuthETH of an
// encoded header in place (the sender fills them in when it signs). It
// reports false if the header has no AuthETH.
func SetAuth(hdr []byte, index uint32, counter uint64) bool {
	if len(hdr) < BaseLen+AuthETHLen || Flags(hdr[3])&FlagMAC == 0 {
		return false
	}
	binary.BigEndian.PutUint32(hdr[BaseLen:], index)
	binary.BigEndian.PutUint64(hdr[BaseLen+4:], counter)
	return true
}

// HeaderLen returns the length of the header at the start of b, reading
// only the base header. It fails if b is not a well-formed base header
// (magic, version, opcode and a valid combination of flags); a length it
// returns is never more than MaxHeaderLen.
func HeaderLen(b []byte) (int, error) {
	if len(b) < BaseLen {
		return 0, ErrShort
	}
	if b[0] != Magic {
		return 0, ErrMagic
	}
	if b[1] != Version {
		return 0, ErrVersion
	}
	// The shape is checked here, not only in Parse: a flag combination no
	// sender writes (an immediate on a CM packet, say) would otherwise
	// give a length past MaxHeaderLen to a caller that reads that many.
	h := Header{Op: Opcode(b[2]), Flags: Flags(b[3])}
	if err := h.validateShape(); err != nil {
		return 0, err
	}
	return h.Len(), nil
}

// Parse decodes the header at the start of b and returns it with the
// header's length; the payload is b[n:].
func Parse(b []byte) (h Header, n int, err error) {
	n, err = HeaderLen(b)
	if err != nil {
		return h, 0, err
	}
	if len(b) < n {
		return h, 0, ErrShort
	}
	be := binary.BigEndian
	h.Op = Opcode(b[2])
	h.Flags = Flags(b[3])
	h.DestQP = be.Uint32(b[4:])
	h.SrcQP = be.Uint32(b[8:])
	h.PSN = be.Uint32(b[12:])
	p := b[BaseLen:n]
	if h.Flags&FlagMAC != 0 {
		h.AuthIndex = be.Uint32(p)
		h.AuthCounter = be.Uint64(p[4:])
		copy(h.MAC[:], p[12:])
		p = p[AuthETHLen:]
	}
	if h.hasDCETH() {
		h.DCKey = be.Uint64(p)
		h.SessionPSN = be.Uint32(p[8:])
		p = p[DCETHLen:]
	}
	if h.hasRETH() {
		h.VA = be.Uint64(p)
		h.RKey = be.Uint32(p[8:])
		h.DMALen = be.Uint32(p[12:])
		h.RespMTU = be.Uint32(p[16:])
		p = p[RETHLen:]
	}
	if h.hasAtomicETH() {
		h.VA = be.Uint64(p)
		h.RKey = be.Uint32(p[8:])
		h.Swap = be.Uint64(p[12:])
		h.Cmp = be.Uint64(p[20:])
		p = p[AtomicETHLen:]
	}
	if h.hasImm() {
		h.Imm = be.Uint32(p)
		p = p[ImmDtLen:]
	}
	if h.hasAETH() {
		h.Syndrome = Syndrome(p[0])
		h.Reason = p[1]
		h.RNRTimer = be.Uint16(p[2:])
		h.MSN = be.Uint32(p[4:])
		p = p[AETHLen:]
	}
	if h.Op == OpAtomicAck {
		h.Orig = be.Uint64(p)
		p = p[AtomicAckLen:]
	}
	if h.hasCMETH() {
		h.Service = be.Uint32(p)
		h.CMQPN = be.Uint32(p[4:])
		h.CMPSN = be.Uint32(p[8:])
		h.CMMTU = be.Uint32(p[12:])
		h.ConnID = be.Uint64(p[16:])
		h.Cookie = be.Uint64(p[24:])
	}
	if err := h.validate(); err != nil {
		return Header{}, 0, err
	}
	if h.hasCMETH() && len(b)-n > MaxPrivate {
		return Header{}, 0, ErrField
	}
	return h, n, nil
}

// Append encodes h after b and returns the extended slice. It panics if h
// is not valid (a programming error in the caller).
func (h *Header) Append(b []byte) []byte {
	if err := h.validate(); err != nil {
		panic(fmt.Sprintf("wire: encoding invalid header %+v: %v", *h, err))
	}
	be := binary.BigEndian
	b = append(b, Magic, Version, byte(h.Op), byte(h.Flags))
	b = be.AppendUint32(b, h.DestQP)
	b = be.AppendUint32(b, h.SrcQP)
	b = be.AppendUint32(b, h.PSN)
	if h.Flags&FlagMAC != 0 {
		b = be.AppendUint32(b, h.AuthIndex)
		b = be.AppendUint64(b, h.AuthCounter)
		b = append(b, h.MAC[:]...)
	}
	if h.hasDCETH() {
		b = be.AppendUint64(b, h.DCKey)
		b = be.AppendUint32(b, h.SessionPSN)
	}
	if h.hasRETH() {
		b = be.AppendUint64(b, h.VA)
		b = be.AppendUint32(b, h.RKey)
		b = be.AppendUint32(b, h.DMALen)
		b = be.AppendUint32(b, h.RespMTU)
	}
	if h.hasAtomicETH() {
		b = be.AppendUint64(b, h.VA)
		b = be.AppendUint32(b, h.RKey)
		b = be.AppendUint64(b, h.Swap)
		b = be.AppendUint64(b, h.Cmp)
	}
	if h.hasImm() {
		b = be.AppendUint32(b, h.Imm)
	}
	if h.hasAETH() {
		b = append(b, byte(h.Syndrome), h.Reason)
		b = be.AppendUint16(b, h.RNRTimer)
		b = be.AppendUint32(b, h.MSN)
	}
	if h.Op == OpAtomicAck {
		b = be.AppendUint64(b, h.Orig)
	}
	if h.hasCMETH() {
		b = be.AppendUint32(b, h.Service)
		b = be.AppendUint32(b, h.CMQPN)
		b = be.AppendUint32(b, h.CMPSN)
		b = be.AppendUint32(b, h.CMMTU)
		b = be.AppendUint64(b, h.ConnID)
		b = be.AppendUint64(b, h.Cookie)
	}
	return b
}

// PacketVersion returns the version byte of a softnic packet (false if b
// is too short or does not start with Magic).
func PacketVersion(b []byte) (uint8, bool) {
	if len(b) < 2 || b[0] != Magic {
		return 0, false
	}
	return b[1], true
}

// Version 1's layout, as far as a refusal needs it.
const (
	v1CMETHLen = 24
	v1FlagMAC  = 1 << 6
)

// VersionRefusalReason is the private data of a refusal: what an old
// node's failed connect reports.
var VersionRefusalReason = fmt.Sprintf("softnic wire v%d", Version)

// AppendVersionRefusal appends to b the answer to pkt if pkt is a
// connection request of an older version this package knows (version 1,
// without a MAC): a CM_REJ in that version's format for the same service
// and connection ID, whose private data is VersionRefusalReason. It
// reports false, appending nothing, for anything else: other opcodes and
// versions get no answer, nor does a request with a MAC (the refusal could
// not carry one its sender accepts). The refusal is at most
// len(VersionRefusalReason) bytes longer than the request, so forged
// requests cannot use it to amplify traffic.
func AppendVersionRefusal(b, pkt []byte) ([]byte, bool) {
	if v, ok := PacketVersion(pkt); !ok || v != 1 || len(pkt) < BaseLen+v1CMETHLen ||
		Opcode(pkt[2]) != OpCMReq || pkt[3]&v1FlagMAC != 0 {
		return b, false
	}
	be := binary.BigEndian
	cm := pkt[BaseLen:]
	b = append(b, Magic, 1, byte(OpCMRej), 0)
	b = be.AppendUint32(b, 0) // QPNs and PSN: version 1's CM_REJ had none
	b = be.AppendUint32(b, 0)
	b = be.AppendUint32(b, 0)
	b = be.AppendUint32(b, be.Uint32(cm)) // service
	b = be.AppendUint32(b, 0)             // QPN
	b = be.AppendUint32(b, 0)             // PSN
	b = be.AppendUint32(b, 0)             // MTU
	b = be.AppendUint64(b, be.Uint64(cm[16:]))
	return append(b, VersionRefusalReason...), true
}
