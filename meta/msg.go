package meta

import (
	"encoding/binary"
	"fmt"

	"github.com/krfs/krfs/verbs"
)

// Two-sided messages between a node and a meta server, carried in SENDs
// over the node's RC connection. Every message is an 8-byte header and a
// body whose length the kind and status fix exactly:
//
//	0  u8  magic 0x6d ('m')    1  u8  version (1)
//	2  u8  kind (bit 7: reply)  3  u8  status (0 in requests)
//	4  u32 request ID, echoed in the reply
//
// Bodies (little-endian; "record" is a node record, below):
//
//	kind        request                     reply (status OK; other statuses: empty)
//	register    gid u32, lease ms u32,      gid u32, lease ms u32, incarnation u64
//	            record
//	heartbeat   gid u32, incarnation u64    gid u32, lease ms u32
//	deregister  gid u32, incarnation u64    gid u32
//	lookup      gid u32                     gid u32, lease ms left u32, record
//	ping        (empty)                     (empty)
//	bye         (empty)                     (no reply)
//	hello       node public key [32]        nonce [32]
//	auth        signature [64]              (empty)
//
// hello and auth authenticate the connection as a node's key (auth.go);
// a server that does not say it supports them (Bootstrap.NodeKeys) is
// never sent them.
//
// A record is 88 bytes: incarnation u64, IP [16] (IPv4-mapped for IPv4),
// port u16, flags u8 (bit 0: IPv4), DCT number u32, DC key u64, region
// directory rkey u32 and length u32, default region rkey u32 and length
// u64, transport name [16] (NUL-padded printable ASCII), default region
// access u8 (verbs.Access bits), default region mode u32 (permission
// bits, bit 31 set when mode, uid and gid are known; all three zero
// otherwise), uid u32, gid u32. That is message version 3; version 2,
// which the previous release sends, has 76-byte records without the owner
// (parsed as unknown) and is answered in version 2, so a meta service can
// be upgraded before its nodes. A gid of 0 in a registration asks the
// server to assign one, an incarnation of 0 to assign that.
//
// Parsing is strict, so that every accepted message has exactly one
// encoding (parse, append and parse again give the same message and the
// same bytes; the fuzz test checks it): unknown kinds, versions, statuses
// or flags, wrong lengths, a zero gid where one is required, a reply
// status in a request and an unspecified or non-canonical address are
// all malformed.
const (
	msgMagic   = 0x6d
	msgVersion = 3 // what this build sends
	msgHdrLen  = 8
	recordLen  = 88
	// msgVersionNoOwner is the oldest version parsed: its records are
	// recordLenNoOwner bytes, without the default region's owner (which
	// then reads as unknown). A server answers in the version it was asked
	// in, so nodes of the previous release keep working with a newer
	// service.
	msgVersionNoOwner = 2
	recordLenNoOwner  = 76
	// MaxMessage bounds every message; receive buffers are this large.
	MaxMessage = 128

	replyBit = 0x80
)

// msgKind is a message kind; replies have replyBit set.
type msgKind uint8

const (
	kindRegister msgKind = iota + 1
	kindHeartbeat
	kindDeregister
	kindLookup
	kindPing
	kindBye
	kindHello
	kindAuth
)

func (k msgKind) String() string {
	names := [...]string{"?", "register", "heartbeat", "deregister", "lookup", "ping", "bye", "hello", "auth"}
	s := "?"
	if b := k &^ replyBit; int(b) < len(names) {
		s = names[b]
	}
	if k&replyBit != 0 {
		s += "-reply"
	}
	return s
}

// status is a reply's outcome.
type status uint8

const (
	stOK status = iota
	stMalformed
	stInUse
	stNotRegistered
	stNotFound
	stFull
	stLimited   // a per-source limit of the server (limits.go)
	stDenied    // another node's entry, or no node key where one is required (auth.go)
	stNumStatus // first invalid value
)

// err maps a reply status to the package's errors.
func (s status) err() error {
	switch s {
	case stOK:
		return nil
	case stMalformed:
		return ErrMalformed
	case stInUse:
		return ErrGIDInUse
	case stNotRegistered:
		return ErrNotRegistered
	case stNotFound:
		return ErrNotFound
	case stFull:
		return ErrTableFull
	case stLimited:
		return ErrLimited
	case stDenied:
		return ErrDenied
	}
	return fmt.Errorf("meta: reply status %d", uint8(s))
}

// message is a parsed message. Which fields mean something depends on
// kind and status (see the table above); the others are zero.
type message struct {
	kind    msgKind
	status  status
	reqID   uint32
	leaseMs uint32
	node    NodeInfo         // GID always; the rest as the body carries it
	version uint8            // wire version; 0 means msgVersion
	blob    [authSigLen]byte // hello's key or nonce, auth's signature (bodyLen bytes of it)
}

// wireVersion is the version m is encoded in.
func (m *message) wireVersion() uint8 {
	if m.version == 0 {
		return msgVersion
	}
	return m.version
}

// knownVersion reports whether v is a version this build parses.
func knownVersion(v byte) bool { return v == msgVersion || v == msgVersionNoOwner }

// recordLenOf is the length of a node record in version v.
func recordLenOf(v uint8) int {
	if v == msgVersionNoOwner {
		return recordLenNoOwner
	}
	return recordLen
}

// bodyLen is the exact body length of a message of kind k with status
// st in version v, or -1 if the combination does not exist.
func bodyLen(k msgKind, st status, v uint8) int {
	reply := k&replyBit != 0
	if base := k &^ replyBit; base < kindRegister || base > kindAuth {
		return -1
	}
	if !reply && st != stOK {
		return -1
	}
	if reply && st != stOK {
		if k&^replyBit == kindBye || st >= stNumStatus {
			return -1
		}
		return 0
	}
	switch k {
	case kindRegister:
		return 8 + recordLenOf(v)
	case kindRegister | replyBit:
		return 16
	case kindHeartbeat, kindDeregister:
		return 12
	case kindHeartbeat | replyBit:
		return 8
	case kindDeregister | replyBit:
		return 4
	case kindLookup:
		return 4
	case kindLookup | replyBit:
		return 8 + recordLenOf(v)
	case kindPing, kindPing | replyBit, kindBye:
		return 0
	case kindHello, kindHello | replyBit:
		return authKeyLen
	case kindAuth:
		return authSigLen
	case kindAuth | replyBit:
		return 0
	}
	return -1
}

// hasGID reports whether the body starts with a gid.
func (m *message) hasGID() bool {
	base := m.kind &^ replyBit
	return m.status == stOK && base != kindPing && m.kind != kindBye && base != kindHello && base != kindAuth
}

// size is the encoded length of m.
func (m *message) size() int { return msgHdrLen + bodyLen(m.kind, m.status, m.wireVersion()) }

// parseHeader reads the header alone, so that the server can answer a
// message with a bad body with stMalformed.
func parseMsgHeader(b []byte) (kind msgKind, reqID uint32, version uint8, ok bool) {
	if len(b) < msgHdrLen || b[0] != msgMagic || !knownVersion(b[1]) {
		return 0, 0, 0, false
	}
	return msgKind(b[2]), binary.LittleEndian.Uint32(b[4:]), b[1], true
}

// parseMessage parses one message; b must be exactly the message.
func parseMessage(b []byte) (message, error) {
	var m message
	if len(b) < msgHdrLen {
		return m, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != msgMagic || !knownVersion(b[1]) {
		return m, fmt.Errorf("%w: magic %#x version %d", ErrMalformed, b[0], b[1])
	}
	m.kind, m.status, m.version = msgKind(b[2]), status(b[3]), b[1]
	m.reqID = binary.LittleEndian.Uint32(b[4:])
	n := bodyLen(m.kind, m.status, m.version)
	if n < 0 {
		return message{}, fmt.Errorf("%w: kind %v status %d", ErrMalformed, m.kind, b[3])
	}
	if len(b) != msgHdrLen+n {
		return message{}, fmt.Errorf("%w: %v of %d bytes, want %d", ErrMalformed, m.kind, len(b), msgHdrLen+n)
	}
	p := b[msgHdrLen:]
	if m.hasGID() {
		m.node.GID = binary.LittleEndian.Uint32(p)
		p = p[4:]
		if m.node.GID == 0 && m.kind != kindRegister {
			return message{}, fmt.Errorf("%w: %v for gid 0", ErrMalformed, m.kind)
		}
	}
	if m.status != stOK {
		return m, nil
	}
	switch m.kind {
	case kindRegister, kindLookup | replyBit:
		m.leaseMs = binary.LittleEndian.Uint32(p)
		if err := getRecord(p[4:], &m.node, m.version); err != nil {
			return message{}, err
		}
	case kindRegister | replyBit:
		m.leaseMs = binary.LittleEndian.Uint32(p)
		m.node.Incarnation = binary.LittleEndian.Uint64(p[4:])
		if m.node.Incarnation == 0 {
			return message{}, fmt.Errorf("%w: registered with incarnation 0", ErrMalformed)
		}
	case kindHeartbeat, kindDeregister:
		m.node.Incarnation = binary.LittleEndian.Uint64(p)
		if m.node.Incarnation == 0 {
			return message{}, fmt.Errorf("%w: %v for incarnation 0", ErrMalformed, m.kind)
		}
	case kindHeartbeat | replyBit:
		m.leaseMs = binary.LittleEndian.Uint32(p)
	case kindHello, kindHello | replyBit, kindAuth:
		copy(m.blob[:], p)
	}
	return m, nil
}

// appendMessage appends m's encoding to b. m must be well formed (as
// parseMessage would return it).
func (m *message) append(b []byte) []byte {
	v := m.wireVersion()
	n := bodyLen(m.kind, m.status, v)
	if n < 0 {
		panic(fmt.Sprintf("meta: encoding invalid message %v status %d", m.kind, m.status))
	}
	off := len(b)
	b = append(b, make([]byte, msgHdrLen+n)...)
	h := b[off:]
	h[0], h[1], h[2], h[3] = msgMagic, v, byte(m.kind), byte(m.status)
	binary.LittleEndian.PutUint32(h[4:], m.reqID)
	p := h[msgHdrLen:]
	if m.hasGID() {
		binary.LittleEndian.PutUint32(p, m.node.GID)
		p = p[4:]
	}
	if m.status != stOK {
		return b
	}
	switch m.kind {
	case kindRegister, kindLookup | replyBit:
		binary.LittleEndian.PutUint32(p, m.leaseMs)
		putRecord(p[4:], &m.node, v)
	case kindRegister | replyBit:
		binary.LittleEndian.PutUint32(p, m.leaseMs)
		binary.LittleEndian.PutUint64(p[4:], m.node.Incarnation)
	case kindHeartbeat, kindDeregister:
		binary.LittleEndian.PutUint64(p, m.node.Incarnation)
	case kindHeartbeat | replyBit:
		binary.LittleEndian.PutUint32(p, m.leaseMs)
	case kindHello, kindHello | replyBit, kindAuth:
		copy(p, m.blob[:])
	}
	return b
}

func putRecord(p []byte, n *NodeInfo, v uint8) {
	binary.LittleEndian.PutUint64(p[0:], n.Incarnation)
	p[26] = putAddr(p[8:24], p[24:26], n.Addr)
	binary.LittleEndian.PutUint32(p[27:], n.DCTN)
	binary.LittleEndian.PutUint64(p[31:], n.DCKey)
	binary.LittleEndian.PutUint32(p[39:], n.DirRKey)
	binary.LittleEndian.PutUint32(p[43:], n.DirLen)
	binary.LittleEndian.PutUint32(p[47:], n.MemRKey)
	binary.LittleEndian.PutUint64(p[51:], n.MemLen)
	clear(p[59:75])
	copy(p[59:75], n.Transport)
	p[75] = byte(n.MemAccess)
	if v != msgVersionNoOwner {
		putOwner(p[76:], p[80:], p[84:], n)
	}
}

func getRecord(p []byte, n *NodeInfo, v uint8) error {
	flags := p[26]
	if flags&^flagIPv4 != 0 {
		return fmt.Errorf("%w: record flags %#x", ErrMalformed, flags)
	}
	ip := [16]byte(p[8:24])
	mapped := ip[10] == 0xff && ip[11] == 0xff && [10]byte(ip[:10]) == [10]byte{}
	if flags&flagIPv4 != 0 && !mapped {
		return fmt.Errorf("%w: IPv4 flag on a non-mapped address", ErrMalformed)
	}
	n.Incarnation = binary.LittleEndian.Uint64(p[0:])
	n.Addr = getAddr(p[8:24], p[24:26], flags)
	if !validAddr(n.Addr) {
		return fmt.Errorf("%w: node address %v", ErrMalformed, n.Addr)
	}
	n.DCTN = binary.LittleEndian.Uint32(p[27:])
	n.DCKey = binary.LittleEndian.Uint64(p[31:])
	n.DirRKey = binary.LittleEndian.Uint32(p[39:])
	n.DirLen = binary.LittleEndian.Uint32(p[43:])
	n.MemRKey = binary.LittleEndian.Uint32(p[47:])
	n.MemLen = binary.LittleEndian.Uint64(p[51:])
	n.Transport = getTransport(p[59:75])
	n.MemAccess = verbs.Access(p[75])
	if n.MemAccess&^verbs.AccessAll != 0 {
		return fmt.Errorf("%w: default region access %#x", ErrMalformed, p[75])
	}
	if !validTransport(n.Transport) || paddedTransport(n.Transport) != string(p[59:75]) {
		return fmt.Errorf("%w: transport name %q", ErrMalformed, p[59:75])
	}
	if v == msgVersionNoOwner {
		n.MemOwnerKnown, n.MemMode, n.MemUID, n.MemGID = false, 0, 0, 0
		return nil
	}
	getOwner(p[76:], p[80:], p[84:], n)
	var canon [12]byte
	putOwner(canon[0:], canon[4:], canon[8:], n)
	if canon != [12]byte(p[76:88]) {
		return fmt.Errorf("%w: default region owner %x", ErrMalformed, p[76:88])
	}
	return nil
}

// paddedTransport is the canonical NUL-padded encoding of t, for strict
// parsing (one encoding per message).
func paddedTransport(t string) string {
	var b [MaxTransport]byte
	copy(b[:], t)
	return string(b[:])
}
