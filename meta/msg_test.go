package meta

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// sampleMessages is one well-formed message of every kind and status
// shape; it seeds the fuzz corpus.
func sampleMessages() []message {
	n := testNode(42, 0x1122334455667788)
	v6 := n
	v6.Addr = netip.MustParseAddrPort("[fd00::17]:4791")
	old := n // as a node of the previous release sends it: no owner
	old.MemOwnerKnown, old.MemMode, old.MemUID, old.MemGID = false, 0, 0, 0
	return []message{
		{kind: kindRegister, reqID: 9, leaseMs: 3000, node: old, version: msgVersionNoOwner},
		{kind: kindLookup | replyBit, reqID: 9, leaseMs: 1200, node: old, version: msgVersionNoOwner},
		{kind: kindPing | replyBit, reqID: 9, version: msgVersionNoOwner},
		{kind: kindRegister, reqID: 1, leaseMs: 3000, node: n},
		{kind: kindRegister, reqID: 2, node: NodeInfo{Addr: v6.Addr}}, // assign gid and incarnation
		{kind: kindRegister, reqID: 3, leaseMs: 10, node: v6},
		{kind: kindRegister | replyBit, reqID: 1, leaseMs: 3000, node: NodeInfo{GID: 42, Incarnation: 9}},
		{kind: kindRegister | replyBit, reqID: 1, status: stInUse},
		{kind: kindRegister | replyBit, reqID: 1, status: stFull},
		{kind: kindRegister | replyBit, reqID: 1, status: stMalformed},
		{kind: kindHeartbeat, reqID: 4, node: NodeInfo{GID: 42, Incarnation: 9}},
		{kind: kindHeartbeat | replyBit, reqID: 4, leaseMs: 3000, node: NodeInfo{GID: 42}},
		{kind: kindHeartbeat | replyBit, reqID: 4, status: stNotRegistered},
		{kind: kindDeregister, reqID: 5, node: NodeInfo{GID: 42, Incarnation: 9}},
		{kind: kindDeregister | replyBit, reqID: 5, node: NodeInfo{GID: 42}},
		{kind: kindLookup, reqID: 6, node: NodeInfo{GID: 42}},
		{kind: kindLookup | replyBit, reqID: 6, leaseMs: 1200, node: n},
		{kind: kindLookup | replyBit, reqID: 6, status: stNotFound},
		{kind: kindPing, reqID: 7},
		{kind: kindPing | replyBit, reqID: 7},
		{kind: kindBye, reqID: 8},
		{kind: kindHello, reqID: 10, blob: [authSigLen]byte{1, 2, 3, 31: 32}},
		{kind: kindHello | replyBit, reqID: 10, blob: [authSigLen]byte{9, 31: 9}},
		{kind: kindAuth, reqID: 11, blob: [authSigLen]byte{1, 63: 64}},
		{kind: kindAuth | replyBit, reqID: 11},
		{kind: kindRegister | replyBit, reqID: 1, status: stDenied},
		{kind: kindRegister | replyBit, reqID: 1, status: stLimited},
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		b := m.append(nil)
		if len(b) != m.size() || len(b) > MaxMessage {
			t.Fatalf("%v: %d bytes, size() %d, max %d", m.kind, len(b), m.size(), MaxMessage)
		}
		got, err := parseMessage(b)
		if err != nil {
			t.Fatalf("%v: %v", m.kind, err)
		}
		m.version = m.wireVersion()
		if got != m {
			t.Fatalf("%v: round trip\n got %+v\nwant %+v", m.kind, got, m)
		}
	}
}

func TestMessageRejects(t *testing.T) {
	reg := message{kind: kindRegister, reqID: 1, node: testNode(5, 7)}
	good := reg.append(nil)
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":           {},
		"short header":    good[:7],
		"bad magic":       mut(func(b []byte) []byte { b[0] = 'x'; return b }),
		"bad version":     mut(func(b []byte) []byte { b[1] = 9; return b }),
		"unknown kind":    mut(func(b []byte) []byte { b[2] = 0x33; return b }),
		"status in req":   mut(func(b []byte) []byte { b[3] = 1; return b }),
		"truncated body":  good[:len(good)-1],
		"trailing byte":   append(bytes.Clone(good), 0),
		"bad flags":       mut(func(b []byte) []byte { b[8+8+26] |= 0x80; return b }),
		"v4 not mapped":   mut(func(b []byte) []byte { b[8+8+8+10] = 0; return b }),
		"unspecified ip":  (&message{kind: kindRegister, node: NodeInfo{Addr: netip.MustParseAddrPort("0.0.0.0:1")}}).append(nil),
		"heartbeat gid 0": (&message{kind: kindHeartbeat, node: NodeInfo{Incarnation: 1}}).append(nil),
		"heartbeat inc 0": (&message{kind: kindHeartbeat, node: NodeInfo{GID: 1}}).append(nil),
		"lookup gid 0":    (&message{kind: kindLookup}).append(nil),
		"bye reply":       {msgMagic, msgVersion, byte(kindBye | replyBit), 0, 0, 0, 0, 0},
		"bad status":      {msgMagic, msgVersion, byte(kindPing | replyBit), byte(stNumStatus), 0, 0, 0, 0},
		// The owner fields (record offset 76 after gid and lease): an
		// owner without the known bit, and mode bits beyond 0o7777.
		"owner unflagged": mut(func(b []byte) []byte { b[8+8+76+3] = 0; return b }),
		"mode high bits":  mut(func(b []byte) []byte { b[8+8+76+2] |= 1; return b }),
		"version 2":       mut(func(b []byte) []byte { b[1] = 2; return b }),
	}
	for name, b := range cases {
		if m, err := parseMessage(b); err == nil {
			t.Errorf("%s: parsed as %+v", name, m)
		} else if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v does not wrap ErrMalformed", name, err)
		}
	}
}

// TestMessageVersionNoOwner: a message of the previous version (records
// without the default region's owner) parses, with the owner unknown, and
// is encoded back in that version; a record of one version's length under
// the other's header is refused.
func TestMessageVersionNoOwner(t *testing.T) {
	n := testNode(42, 0x1122334455667789)
	if !n.MemOwnerKnown {
		t.Fatal("test node without an owner")
	}
	m := message{kind: kindRegister, reqID: 1, leaseMs: 3000, node: n, version: msgVersionNoOwner}
	b := m.append(nil)
	if len(b) != msgHdrLen+8+recordLenNoOwner || b[1] != msgVersionNoOwner {
		t.Fatalf("version 2 register: %d bytes, version %d", len(b), b[1])
	}
	got, err := parseMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.node.MemOwnerKnown || got.node.MemMode != 0 || got.version != msgVersionNoOwner {
		t.Fatalf("version 2 parsed as %+v", got)
	}
	want := n
	want.MemOwnerKnown, want.MemMode, want.MemUID, want.MemGID = false, 0, 0, 0
	if got.node != want {
		t.Fatalf("version 2 record: got %+v want %+v", got.node, want)
	}
	if _, _, v, ok := parseMsgHeader(b); !ok || v != msgVersionNoOwner {
		t.Fatalf("header: version %d ok %v", v, ok)
	}
	// The same bytes under the other version's header are the wrong length.
	b[1] = msgVersion
	if _, err := parseMessage(b); !errors.Is(err, ErrMalformed) {
		t.Fatalf("version 3 header on a version 2 record: %v", err)
	}
	cur := (&message{kind: kindRegister, node: n}).append(nil)
	cur[1] = msgVersionNoOwner
	if _, err := parseMessage(cur); !errors.Is(err, ErrMalformed) {
		t.Fatalf("version 2 header on a version 3 record: %v", err)
	}
}

// FuzzMessage checks that parsing never panics and that every accepted
// message has exactly one encoding: parse -> append gives the input back,
// and parsing that gives the same message.
func FuzzMessage(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(m.append(nil))
	}
	f.Add([]byte{})
	f.Add([]byte{msgMagic, msgVersion, 0xff, 0xff, 1, 2, 3, 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMessage(b)
		parseMsgHeader(b)
		if err != nil {
			return
		}
		out := m.append(nil)
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, out)
		}
		m2, err := parseMessage(out)
		if err != nil || m2 != m {
			t.Fatalf("second parse: %+v, %v; first %+v", m2, err, m)
		}
		if m.size() != len(b) {
			t.Fatalf("size %d, encoded %d", m.size(), len(b))
		}
	})
}

func FuzzBootstrap(f *testing.F) {
	b := Bootstrap{TableRKey: 7, Slots: 64, Neighborhood: 8, ServerIncarnation: 3, DCTN: 9, DCKey: 1 << 40}
	g, _ := b.geom()
	b.TableLen = uint32(g.bytes())
	f.Add(b.marshal())
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := parseBootstrap(p)
		if err != nil {
			return
		}
		if _, err := b.geom(); err != nil {
			t.Fatalf("accepted a bootstrap with bad geometry: %v", err)
		}
		b2, err := parseBootstrap(b.marshal())
		if err != nil || b2.TableRKey != b.TableRKey || b2.Slots != b.Slots || b2.DCKey != b.DCKey || !b2.Epoch.Equal(b.Epoch) {
			t.Fatalf("bootstrap round trip: %+v %v, want %+v", b2, err, b)
		}
	})
}
