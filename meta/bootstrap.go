package meta

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/krfs/krfs/verbs"
)

// DefaultService is the connection-manager service number a meta server
// listens on ("KRMS").
const DefaultService = 0x4b524d53

func init() { verbs.RegisterServiceName(DefaultService, "the krfs meta service") }

// Bootstrap is what a node learns about a meta server when it connects:
// the connection manager's reply carries it as private data. It is
// everything needed to READ the node table, through the RC connection or
// through any DCI (via the server's DCT).
type Bootstrap struct {
	TableRKey    uint32 // rkey of the table MR; remote READ only
	TableLen     uint32 // bytes of the table MR (header and slots)
	Slots        int    // home slots, a power of two
	Neighborhood int    // H: slots one lookup READ covers
	// Epoch is the server clock's time when the table was made; lease
	// expiries in entries count milliseconds from it.
	Epoch time.Time
	// ServerIncarnation is random and new on every server start; a node
	// that sees it change knows the server restarted and registers again.
	ServerIncarnation uint64
	DCTN              uint32 // the server's DCT number
	DCKey             uint64 // the key of the server's DCT
	// IdleTimeout is how long the server keeps a connection without
	// messages; clients send a ping well before.
	IdleTimeout time.Duration
	// Lease is the lease the server grants when a node asks for none.
	Lease time.Duration
	// MapOffset is where the membership map lies in the table MR (past
	// TableLen), or 0 if the server keeps none (an older server): List
	// then READs the whole table.
	MapOffset uint32
	// NodeKeys: the server authenticates node keys (hello and auth
	// messages, auth.go) and binds entries to them. Older servers say
	// nothing (the field was reserved), and are sent neither.
	NodeKeys bool
}

// The reply's private data, little-endian:
//
//	0  u32 magic "KRMS"   4  u16 version    6  u16 entry size
//	8  u32 table rkey    12  u32 table bytes 16 u32 home slots
//	20 u16 H             22  u16 flags      24  i64 epoch (unix ns)
//	32 u64 server incarnation                40  u64 DC key
//	48 u32 DCT number    52  u32 idle timeout ms
//	56 u32 default lease ms                  60  u32 membership map offset (0: none)
//
// Flags: bit 0, the server authenticates node keys (NodeKeys); the other
// bits are zero (reserved).
//
// The request's private data is u32 magic "KRMC", u16 version, u16 zero.
const (
	bootMagic    = 0x534d524b // "KRMS"
	bootReqMagic = 0x434d524b // "KRMC"
	bootVersion  = 1
	bootLen      = 64
	bootReqLen   = 8
)

func (b *Bootstrap) geom() (tableGeom, error) { return newGeom(b.Slots, b.Neighborhood) }

func (b *Bootstrap) marshal() []byte {
	p := make([]byte, bootLen)
	binary.LittleEndian.PutUint32(p[0:], bootMagic)
	binary.LittleEndian.PutUint16(p[4:], bootVersion)
	binary.LittleEndian.PutUint16(p[6:], EntrySize)
	binary.LittleEndian.PutUint32(p[8:], b.TableRKey)
	binary.LittleEndian.PutUint32(p[12:], b.TableLen)
	binary.LittleEndian.PutUint32(p[16:], uint32(b.Slots))
	binary.LittleEndian.PutUint16(p[20:], uint16(b.Neighborhood))
	binary.LittleEndian.PutUint64(p[24:], uint64(b.Epoch.UnixNano()))
	binary.LittleEndian.PutUint64(p[32:], b.ServerIncarnation)
	binary.LittleEndian.PutUint64(p[40:], b.DCKey)
	binary.LittleEndian.PutUint32(p[48:], b.DCTN)
	binary.LittleEndian.PutUint32(p[52:], uint32(b.IdleTimeout/time.Millisecond))
	binary.LittleEndian.PutUint32(p[56:], uint32(b.Lease/time.Millisecond))
	binary.LittleEndian.PutUint32(p[60:], b.MapOffset)
	if b.NodeKeys {
		binary.LittleEndian.PutUint16(p[22:], bootFlagNodeKeys)
	}
	return p
}

func parseBootstrap(p []byte) (Bootstrap, error) {
	var b Bootstrap
	if len(p) != bootLen {
		return b, fmt.Errorf("meta: bootstrap of %d bytes, want %d", len(p), bootLen)
	}
	if m := binary.LittleEndian.Uint32(p[0:]); m != bootMagic {
		return b, fmt.Errorf("meta: bootstrap magic %#x: not a meta server", m)
	}
	if v := binary.LittleEndian.Uint16(p[4:]); v != bootVersion {
		return b, fmt.Errorf("meta: bootstrap version %d, want %d", v, bootVersion)
	}
	if es := binary.LittleEndian.Uint16(p[6:]); es != EntrySize {
		return b, fmt.Errorf("meta: entry size %d, want %d", es, EntrySize)
	}
	b.TableRKey = binary.LittleEndian.Uint32(p[8:])
	b.TableLen = binary.LittleEndian.Uint32(p[12:])
	b.Slots = int(binary.LittleEndian.Uint32(p[16:]))
	b.Neighborhood = int(binary.LittleEndian.Uint16(p[20:]))
	b.Epoch = time.Unix(0, int64(binary.LittleEndian.Uint64(p[24:])))
	b.ServerIncarnation = binary.LittleEndian.Uint64(p[32:])
	b.DCKey = binary.LittleEndian.Uint64(p[40:])
	b.DCTN = binary.LittleEndian.Uint32(p[48:])
	b.IdleTimeout = time.Duration(binary.LittleEndian.Uint32(p[52:])) * time.Millisecond
	b.Lease = time.Duration(binary.LittleEndian.Uint32(p[56:])) * time.Millisecond
	b.NodeKeys = binary.LittleEndian.Uint16(p[22:])&bootFlagNodeKeys != 0
	g, err := b.geom()
	if err != nil {
		return b, err
	}
	if int(b.TableLen) != g.bytes() {
		return b, fmt.Errorf("meta: table of %d bytes does not fit %d slots", b.TableLen, b.Slots)
	}
	// Older servers send 0 here (the field was reserved); a map anywhere
	// else than right after the table is not one this client can read.
	if m := binary.LittleEndian.Uint32(p[60:]); m == uint32(g.mapOffset()) {
		b.MapOffset = m
	}
	return b, nil
}

// bootRequest is the private data of a client's connection request.
func bootRequest() []byte {
	p := make([]byte, bootReqLen)
	binary.LittleEndian.PutUint32(p[0:], bootReqMagic)
	binary.LittleEndian.PutUint16(p[4:], bootVersion)
	return p
}

func checkBootRequest(p []byte) error {
	if len(p) != bootReqLen || binary.LittleEndian.Uint32(p) != bootReqMagic {
		return fmt.Errorf("meta: connection request is not from a meta client")
	}
	if v := binary.LittleEndian.Uint16(p[4:]); v != bootVersion {
		return fmt.Errorf("meta: client speaks version %d, server %d", v, bootVersion)
	}
	return nil
}
