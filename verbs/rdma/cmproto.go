package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The connection manager's messages travel in UDP datagrams between the
// CM sockets of two devices (Device.Addr). Layout, big endian:
//
//	0  magic "KRCM"          4
//	4  version (1)           1
//	5  kind                  1
//	6  private length        2
//	8  connection ID         8
//	16 service               4
//	20 QPN                   4
//	24 start PSN             4
//	28 path MTU (bytes)      4
//	32 GID                   16
//	48 LID                   2
//	50 port number           1
//	51 reserved              1
//	52 private data          0..MaxPrivate
const (
	cmMagic     = "KRCM"
	cmVersion   = 1
	cmHeaderLen = 52
	// MaxPrivate is the most private data a connection request or reply
	// carries (InfiniBand CM allows 92 and 196 bytes).
	MaxPrivate = 196
)

// cmKind is a CM message kind.
type cmKind uint8

const (
	cmReq   cmKind = iota + 1 // connect: the active QP's QPN, PSN, MTU, GID, LID
	cmRep                     // accepted: the passive QP's
	cmRej                     // refused: private data says why
	cmRTU                     // ready to use: the passive side forgets the handshake
	cmAddrQ                   // address query: which GID and LID answer at this CM address?
	cmAddrR                   // address reply
)

func (k cmKind) String() string {
	switch k {
	case cmReq:
		return "REQ"
	case cmRep:
		return "REP"
	case cmRej:
		return "REJ"
	case cmRTU:
		return "RTU"
	case cmAddrQ:
		return "ADDR_QUERY"
	case cmAddrR:
		return "ADDR_REPLY"
	}
	return fmt.Sprintf("cmKind(%d)", uint8(k))
}

// cmMsg is a decoded CM message.
type cmMsg struct {
	Kind    cmKind
	ConnID  uint64
	Service uint32
	QPN     uint32
	PSN     uint32
	MTU     uint32
	GID     GID
	LID     uint16
	Port    uint8
	Private []byte
}

var errCMMalformed = errors.New("rdma: malformed CM message")

// appendCM encodes m after b.
func appendCM(b []byte, m *cmMsg) ([]byte, error) {
	if len(m.Private) > MaxPrivate {
		return b, fmt.Errorf("rdma: %d bytes of CM private data, max %d", len(m.Private), MaxPrivate)
	}
	b = append(b, cmMagic...)
	b = append(b, cmVersion, byte(m.Kind))
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Private)))
	b = binary.BigEndian.AppendUint64(b, m.ConnID)
	b = binary.BigEndian.AppendUint32(b, m.Service)
	b = binary.BigEndian.AppendUint32(b, m.QPN)
	b = binary.BigEndian.AppendUint32(b, m.PSN)
	b = binary.BigEndian.AppendUint32(b, m.MTU)
	b = append(b, m.GID[:]...)
	b = binary.BigEndian.AppendUint16(b, m.LID)
	b = append(b, m.Port, 0)
	return append(b, m.Private...), nil
}

// parseCM decodes a datagram. Private aliases b.
func parseCM(b []byte) (cmMsg, error) {
	var m cmMsg
	if len(b) < cmHeaderLen || string(b[:4]) != cmMagic {
		return m, errCMMalformed
	}
	if b[4] != cmVersion {
		return m, fmt.Errorf("%w: version %d", errCMMalformed, b[4])
	}
	m.Kind = cmKind(b[5])
	if m.Kind < cmReq || m.Kind > cmAddrR {
		return m, fmt.Errorf("%w: kind %d", errCMMalformed, b[5])
	}
	plen := int(binary.BigEndian.Uint16(b[6:]))
	if plen > MaxPrivate || len(b) != cmHeaderLen+plen {
		return m, fmt.Errorf("%w: private length %d in a %d-byte datagram", errCMMalformed, plen, len(b))
	}
	m.ConnID = binary.BigEndian.Uint64(b[8:])
	m.Service = binary.BigEndian.Uint32(b[16:])
	m.QPN = binary.BigEndian.Uint32(b[20:])
	m.PSN = binary.BigEndian.Uint32(b[24:])
	m.MTU = binary.BigEndian.Uint32(b[28:])
	copy(m.GID[:], b[32:48])
	m.LID = binary.BigEndian.Uint16(b[48:])
	m.Port = b[50]
	if plen > 0 {
		m.Private = b[cmHeaderLen:]
	}
	return m, nil
}
