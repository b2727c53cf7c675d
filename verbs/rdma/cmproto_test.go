package rdma

import (
	"bytes"
	"testing"
)

func TestCMRoundTrip(t *testing.T) {
	m := cmMsg{Kind: cmReq, ConnID: 0x1122334455667788, Service: 7, QPN: 0xabcdef, PSN: 0x123456, MTU: 4096,
		GID: GID{0xfe, 0x80, 15: 1}, LID: 0x1234, Port: 2, Private: []byte("hello")}
	b, err := appendCM(nil, &m)
	if err != nil || len(b) != cmHeaderLen+5 {
		t.Fatalf("appendCM: %d bytes, %v", len(b), err)
	}
	got, err := parseCM(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Kind != m.Kind || got.ConnID != m.ConnID || got.Service != m.Service || got.QPN != m.QPN || got.PSN != m.PSN ||
		got.MTU != m.MTU || got.GID != m.GID || got.LID != m.LID || got.Port != m.Port || !bytes.Equal(got.Private, m.Private) {
		t.Fatalf("round trip: %+v, want %+v", got, m)
	}
	if _, err := appendCM(nil, &cmMsg{Kind: cmRej, Private: make([]byte, MaxPrivate+1)}); err == nil {
		t.Fatal("oversized private data encoded")
	}
	for _, bad := range [][]byte{nil, b[:cmHeaderLen-1], append([]byte("XXXX"), b[4:]...), b[:len(b)-1], append(b, 0)} {
		if _, err := parseCM(bad); err == nil {
			t.Errorf("parseCM accepted %d malformed bytes", len(bad))
		}
	}
	v := bytes.Clone(b)
	v[4] = 2
	if _, err := parseCM(v); err == nil {
		t.Error("parseCM accepted version 2")
	}
	v = bytes.Clone(b)
	v[5] = 0
	if _, err := parseCM(v); err == nil {
		t.Error("parseCM accepted kind 0")
	}
}

func FuzzCM(f *testing.F) {
	for _, m := range []cmMsg{{Kind: cmReq, Private: []byte("x")}, {Kind: cmAddrR, GID: GID{1}}, {Kind: cmRTU, ConnID: 9}} {
		b, _ := appendCM(nil, &m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseCM(b)
		if err != nil {
			return
		}
		again, err := appendCM(nil, &m)
		if err != nil {
			t.Fatalf("a parsed message does not encode: %v", err)
		}
		// The reserved byte is not kept; everything else round-trips.
		want := bytes.Clone(b)
		want[51] = 0
		if !bytes.Equal(again, want) {
			t.Fatalf("round trip changed the message:\n% x\n% x", b, again)
		}
	})
}
