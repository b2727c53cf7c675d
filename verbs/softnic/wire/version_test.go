package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// v1CMReq is a version-1 CM_REQ as a version-1 node sent it: base header,
// a 24-byte CMETH (no cookie), private data.
func v1CMReq(flags byte, service uint32, connID uint64, private []byte) []byte {
	be := binary.BigEndian
	b := []byte{Magic, 1, byte(OpCMReq), flags}
	b = be.AppendUint32(b, 0)
	b = be.AppendUint32(b, 77) // source QPN
	b = be.AppendUint32(b, 0)
	b = be.AppendUint32(b, service)
	b = be.AppendUint32(b, 77)
	b = be.AppendUint32(b, 1000)
	b = be.AppendUint32(b, 4096)
	b = be.AppendUint64(b, connID)
	return append(b, private...)
}

// TestOldVersionRefused: a version-1 packet is refused before any field
// past the version byte is read, and a version-1 connection request gets
// a version-1 CM_REJ that a version-1 parser matches to its request
// (service and connection ID) and reports with its reason.
func TestOldVersionRefused(t *testing.T) {
	req := v1CMReq(0, 0x4b524d53, 0x1122334455667788, []byte("meta hello"))
	if _, _, err := Parse(req); !errors.Is(err, ErrVersion) {
		t.Fatalf("Parse of a version-1 packet: %v, want ErrVersion", err)
	}
	if _, err := HeaderLen(req); !errors.Is(err, ErrVersion) {
		t.Fatalf("HeaderLen of a version-1 packet: %v, want ErrVersion", err)
	}
	if v, ok := PacketVersion(req); !ok || v != 1 {
		t.Fatalf("PacketVersion = %d %v", v, ok)
	}

	rej, ok := AppendVersionRefusal([]byte("prefix"), req)
	if !ok || !bytes.HasPrefix(rej, []byte("prefix")) {
		t.Fatalf("no refusal for a version-1 CM_REQ (%v)", ok)
	}
	rej = rej[len("prefix"):]
	// Decode it as version 1 did: base header, 24-byte CMETH, private.
	be := binary.BigEndian
	if len(rej) < BaseLen+v1CMETHLen || rej[0] != Magic || rej[1] != 1 || Opcode(rej[2]) != OpCMRej || rej[3] != 0 {
		t.Fatalf("refusal is not a version-1 CM_REJ: % x", rej)
	}
	cm := rej[BaseLen:]
	if be.Uint32(cm) != 0x4b524d53 || be.Uint64(cm[16:]) != 0x1122334455667788 {
		t.Fatalf("refusal names service %#x conn %#x", be.Uint32(cm), be.Uint64(cm[16:]))
	}
	if got := string(rej[BaseLen+v1CMETHLen:]); got != VersionRefusalReason || got != "softnic wire v2" {
		t.Fatalf("reason %q", got)
	}
	if len(rej) > len(req)+len(VersionRefusalReason) {
		t.Fatalf("refusal of %d bytes to a request of %d: an amplifier", len(rej), len(req))
	}
	// The refusal is no packet of this version either.
	if _, _, err := Parse(rej); !errors.Is(err, ErrVersion) {
		t.Fatalf("Parse of the refusal: %v", err)
	}

	for name, pkt := range map[string][]byte{
		"v1 CM_REQ with a MAC": v1CMReq(v1FlagMAC, 1, 2, nil),
		"v1 CM_REP":            append([]byte{Magic, 1, byte(OpCMRep)}, req[3:]...),
		"v1 READ":              append([]byte{Magic, 1, byte(OpReadReq)}, req[3:]...),
		"v3 CM_REQ":            append([]byte{Magic, 3}, req[2:]...),
		"v1 short":             req[:BaseLen+v1CMETHLen-1],
		"current CM_REQ":       (&Header{Op: OpCMReq, Service: 1, ConnID: 2}).Append(nil),
		"no magic":             append([]byte{0, 1}, req[2:]...),
	} {
		if b, ok := AppendVersionRefusal(nil, pkt); ok || len(b) != 0 {
			t.Errorf("%s: refusal %q", name, b)
		}
	}
}
