package meta

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"
	"time"

	"github.com/krfs/krfs/verbs"
)

// The node table as it lies in the server's registered memory. Everything
// is little-endian. The table MR starts with a 64-byte header, then the
// slots, EntrySize bytes each:
//
//	offset 0                 64              64+64*1     64+64*(slots+H-1)
//	       | header          | slot 0        | slot 1 ... | end
//
// A gid's home slot is homeSlot(gid); its entry lies in one of the H slots
// [home, home+H) (hopscotch hashing with neighbourhood H). The table has
// H-1 slots of padding past the last home slot so that a neighbourhood
// never wraps: a lookup is one READ of H*EntrySize bytes at
// SlotOffset(home).
//
// Header (written once, before the MR is registered):
//
//	0  u32 magic "KRMT"      4  u16 layout version   6  u16 entry size
//	8  u32 home slots       12  u16 neighbourhood H 14  u16 reserved
//	16 i64 epoch (unix ns of the server clock when the table was made)
//	24 u64 server incarnation (random, new on every server start)
//	32..63 reserved
//
// Entry (one slot):
//
//	0  u32 head version      4  u32 gid            8  u64 incarnation
//	16 [16] IP (As16)       32  u16 port          34  u8  state (0 free, 1 live)
//	35 u8  flags (bit 0: IPv4)                     36  u32 DCT number
//	40 u64 DC key           48  u32 region directory rkey
//	52 u32 region directory length                 56  u32 lease expiry
//	60 u32 default region rkey                     64  u64 default region length
//	72 [16] transport name (NUL-padded)            88  u8 default region access
//	89 [3] reserved (zero)                         92  u32 default region mode
//	96 u32 default region uid                      100 u32 default region gid
//	104 [20] reserved (zero)
//	124 u32 tail version
//
// The lease expiry is in milliseconds since the header's epoch, modulo
// 2^32 (compare with serial-number arithmetic, as for PSNs). The default
// region ("mem") rkey and length let a peer READ that region right after
// the lookup, without first READing the region directory (a hint: a stale
// one fails the data path's rkey or bounds check, which re-reads the
// directory). The default region's mode word holds its permission bits
// (0o7777) and, in bit 31 (ownerKnown), whether mode, uid and gid are
// set at all: an entry written before they existed has zeros there, which
// decode as "owner unknown" (a peer reads the directory), never as mode 0.
const (
	// EntrySize is the size of one table slot: two cache lines.
	EntrySize = 128
	// HeaderSize is the size of the table header; slot 0 follows it.
	HeaderSize = 64

	tableMagic    = 0x544d524b // "KRMT" little-endian
	layoutVersion = 2

	stateFree = 0
	stateLive = 1

	flagIPv4 = 1

	// MaxTransport is the longest transport name (NodeInfo.Transport).
	MaxTransport = 16

	// Entry field offsets.
	offHead      = 0
	offGID       = 4
	offInc       = 8
	offIP        = 16
	offPort      = 32
	offState     = 34
	offFlags     = 35
	offDCTN      = 36
	offDCKey     = 40
	offDirKey    = 48
	offDirLen    = 52
	offExpiry    = 56
	offMemKey    = 60
	offMemLen    = 64
	offTransport = 72
	offMemAccess = 88
	offMemMode   = 92
	offMemUID    = 96
	offMemGID    = 100
	offTail      = 124

	// ownerKnown is set in a stored default-region mode word when mode,
	// uid and gid are known; modeBits are the permission bits stored.
	ownerKnown = 1 << 31
	modeBits   = 0o7777
)

// putOwner encodes the default region's owner fields into a mode word,
// a uid and a gid (all zero when unknown).
func putOwner(mode, uid, gid []byte, n *NodeInfo) {
	var m, u, g uint32
	if n.MemOwnerKnown {
		m, u, g = ownerKnown|n.MemMode&modeBits, n.MemUID, n.MemGID
	}
	binary.LittleEndian.PutUint32(mode, m)
	binary.LittleEndian.PutUint32(uid, u)
	binary.LittleEndian.PutUint32(gid, g)
}

// getOwner decodes what putOwner wrote. A mode word without ownerKnown
// leaves the fields unknown (zero), whatever follows.
func getOwner(mode, uid, gid []byte, n *NodeInfo) {
	m := binary.LittleEndian.Uint32(mode)
	if m&ownerKnown == 0 {
		n.MemOwnerKnown, n.MemMode, n.MemUID, n.MemGID = false, 0, 0, 0
		return
	}
	n.MemOwnerKnown, n.MemMode = true, m&modeBits
	n.MemUID, n.MemGID = binary.LittleEndian.Uint32(uid), binary.LittleEndian.Uint32(gid)
}

// tableGeom is the shape of a table: what a client needs, besides the
// rkey, to READ it.
type tableGeom struct {
	slots int // home slots, a power of two
	nbhd  int // neighbourhood H
	shift uint
}

func newGeom(slots, nbhd int) (tableGeom, error) {
	if slots < 1 || slots > 1<<24 || slots&(slots-1) != 0 {
		return tableGeom{}, fmt.Errorf("meta: table slots %d: want a power of two in [1, 2^24]", slots)
	}
	if nbhd < 1 || nbhd > 64 {
		return tableGeom{}, fmt.Errorf("meta: neighbourhood %d: want 1..64", nbhd)
	}
	return tableGeom{slots: slots, nbhd: nbhd, shift: uint(32 - bits.TrailingZeros(uint(slots)))}, nil
}

// physSlots is the number of slots in memory: home slots plus padding.
func (g tableGeom) physSlots() int { return g.slots + g.nbhd - 1 }

// bytes is the size of the whole table MR.
func (g tableGeom) bytes() int { return HeaderSize + g.physSlots()*EntrySize }

// The membership map follows the table in the same MR (at mapOffset, a
// multiple of 64), so that List reads the live slots instead of the whole
// table:
//
//	0  u64 generation: odd while the server changes which slots are live
//	8  u64 words, one bit per physical slot (bit i%64 of word i/64): set
//	   when slot i holds a live entry
//
// The server writes it, like the slots, with loopback RDMA WRITEs: a write
// group that changes a slot's occupancy first writes generation g+1, then
// its slots, then the changed words, then g+2. A reader that READs the
// generation, the map, the live slots and the generation again, and sees
// the same even value both times, saw no change of occupancy in between
// (a READ lands in address order, and the NIC executes one QP's WRITEs in
// order). Bootstrap.MapOffset tells clients it is there.

// mapOffset is where the membership map starts in the table MR.
func (g tableGeom) mapOffset() int { return g.bytes() }

// mapWords is the number of 64-bit words of the membership bitmap.
func (g tableGeom) mapWords() int { return (g.physSlots() + 63) / 64 }

// mapBytes is the size of the membership map: generation and bitmap.
func (g tableGeom) mapBytes() int { return 8 + 8*g.mapWords() }

// nbhdBytes is the size of one lookup READ.
func (g tableGeom) nbhdBytes() int { return g.nbhd * EntrySize }

// home is gid's home slot: Fibonacci hashing (multiply by 2^32/phi, keep
// the top bits). It spreads consecutive gids evenly, and clients and
// server must agree on it, so it is part of the layout.
func (g tableGeom) home(gid uint32) int {
	if g.shift == 32 {
		return 0
	}
	return int((gid * 0x9e3779b1) >> g.shift)
}

// slotOffset is the offset of slot i in the table MR.
func slotOffset(i int) uint64 { return uint64(HeaderSize + i*EntrySize) }

// tableHeader is the decoded header.
type tableHeader struct {
	geom      tableGeom
	epoch     time.Time
	serverInc uint64
}

func putHeader(b []byte, h tableHeader) {
	clear(b[:HeaderSize])
	binary.LittleEndian.PutUint32(b[0:], tableMagic)
	binary.LittleEndian.PutUint16(b[4:], layoutVersion)
	binary.LittleEndian.PutUint16(b[6:], EntrySize)
	binary.LittleEndian.PutUint32(b[8:], uint32(h.geom.slots))
	binary.LittleEndian.PutUint16(b[12:], uint16(h.geom.nbhd))
	binary.LittleEndian.PutUint64(b[16:], uint64(h.epoch.UnixNano()))
	binary.LittleEndian.PutUint64(b[24:], h.serverInc)
}

func parseHeader(b []byte) (tableHeader, error) {
	if len(b) < HeaderSize {
		return tableHeader{}, fmt.Errorf("meta: table header: %d bytes", len(b))
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != tableMagic {
		return tableHeader{}, fmt.Errorf("meta: table header: bad magic %#x", m)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != layoutVersion {
		return tableHeader{}, fmt.Errorf("meta: table layout version %d, want %d", v, layoutVersion)
	}
	if es := binary.LittleEndian.Uint16(b[6:]); es != EntrySize {
		return tableHeader{}, fmt.Errorf("meta: table entry size %d, want %d", es, EntrySize)
	}
	g, err := newGeom(int(binary.LittleEndian.Uint32(b[8:])), int(binary.LittleEndian.Uint16(b[12:])))
	if err != nil {
		return tableHeader{}, err
	}
	return tableHeader{
		geom:      g,
		epoch:     time.Unix(0, int64(binary.LittleEndian.Uint64(b[16:]))),
		serverInc: binary.LittleEndian.Uint64(b[24:]),
	}, nil
}

// entry is one decoded table slot.
type entry struct {
	node    NodeInfo
	live    bool
	expiry  uint32 // ms since the table epoch, mod 2^32
	version uint32
}

// putEntryBody writes the fields of e between the two versions,
// b[4:124] of a slot; a free entry is all zeros.
func putEntryBody(b []byte, e *entry) {
	clear(b[offGID:offTail])
	if !e.live {
		return
	}
	n := &e.node
	binary.LittleEndian.PutUint32(b[offGID:], n.GID)
	binary.LittleEndian.PutUint64(b[offInc:], n.Incarnation)
	b[offFlags] = putAddr(b[offIP:offIP+16], b[offPort:offPort+2], n.Addr)
	b[offState] = stateLive
	binary.LittleEndian.PutUint32(b[offDCTN:], n.DCTN)
	binary.LittleEndian.PutUint64(b[offDCKey:], n.DCKey)
	binary.LittleEndian.PutUint32(b[offDirKey:], n.DirRKey)
	binary.LittleEndian.PutUint32(b[offDirLen:], n.DirLen)
	binary.LittleEndian.PutUint32(b[offExpiry:], e.expiry)
	binary.LittleEndian.PutUint32(b[offMemKey:], n.MemRKey)
	binary.LittleEndian.PutUint64(b[offMemLen:], n.MemLen)
	copy(b[offTransport:offTransport+MaxTransport], n.Transport)
	b[offMemAccess] = byte(n.MemAccess)
	putOwner(b[offMemMode:], b[offMemUID:], b[offMemGID:], n)
}

// putEntry writes a whole, consistent slot with the given version (even).
// Tests use it; the server writes slots piecewise (see Server.writeSlot).
func putEntry(b []byte, e *entry, version uint32) {
	binary.LittleEndian.PutUint32(b[offHead:], version)
	putEntryBody(b, e)
	binary.LittleEndian.PutUint32(b[offTail:], version)
}

// decodeEntry decodes one slot. ok is false for a torn slot: versions that
// differ or are odd (a write in progress). A client never uses a torn
// slot; it reads again.
func decodeEntry(b []byte) (e entry, ok bool) {
	head := binary.LittleEndian.Uint32(b[offHead:])
	tail := binary.LittleEndian.Uint32(b[offTail:])
	if head != tail || head&1 != 0 {
		return entry{}, false
	}
	e.version = head
	switch b[offState] {
	case stateFree:
		return e, true
	case stateLive:
	default:
		// Not a state any server writes: treat as torn, read again.
		return entry{}, false
	}
	e.live = true
	n := &e.node
	n.GID = binary.LittleEndian.Uint32(b[offGID:])
	n.Incarnation = binary.LittleEndian.Uint64(b[offInc:])
	n.Addr = getAddr(b[offIP:offIP+16], b[offPort:offPort+2], b[offFlags])
	n.DCTN = binary.LittleEndian.Uint32(b[offDCTN:])
	n.DCKey = binary.LittleEndian.Uint64(b[offDCKey:])
	n.DirRKey = binary.LittleEndian.Uint32(b[offDirKey:])
	n.DirLen = binary.LittleEndian.Uint32(b[offDirLen:])
	e.expiry = binary.LittleEndian.Uint32(b[offExpiry:])
	n.MemRKey = binary.LittleEndian.Uint32(b[offMemKey:])
	n.MemLen = binary.LittleEndian.Uint64(b[offMemLen:])
	n.Transport = getTransport(b[offTransport : offTransport+MaxTransport])
	n.MemAccess = verbs.Access(b[offMemAccess])
	getOwner(b[offMemMode:], b[offMemUID:], b[offMemGID:], n)
	return e, true
}

// getTransport decodes a NUL-padded transport name.
func getTransport(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// validTransport reports whether t can be stored: at most MaxTransport
// printable ASCII bytes.
func validTransport(t string) bool {
	if len(t) > MaxTransport {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return false
		}
	}
	return true
}

// putAddr encodes an address as 16 IP bytes and a port, returning the
// flags byte. IPv4 addresses are stored IPv4-mapped with flagIPv4 set;
// zones are dropped.
func putAddr(ip, port []byte, a netip.AddrPort) (flags byte) {
	addr := a.Addr()
	if addr.Is4() {
		flags = flagIPv4
	}
	if addr.IsValid() {
		b := addr.As16()
		copy(ip, b[:])
	} else {
		clear(ip[:16])
	}
	binary.LittleEndian.PutUint16(port, a.Port())
	return flags
}

func getAddr(ip, port []byte, flags byte) netip.AddrPort {
	a := netip.AddrFrom16([16]byte(ip[:16]))
	if flags&flagIPv4 != 0 {
		a = a.Unmap()
	}
	return netip.AddrPortFrom(a, binary.LittleEndian.Uint16(port))
}

// validAddr reports whether a can be stored and round-trips: a specified
// IP without a zone.
func validAddr(a netip.AddrPort) bool {
	ip := a.Addr()
	return ip.IsValid() && !ip.IsUnspecified() && ip.Zone() == ""
}

// expiryMillis encodes an expiry time relative to the table epoch.
func expiryMillis(epoch, t time.Time) uint32 {
	return uint32(t.Sub(epoch) / time.Millisecond)
}
