package wire

import (
	"bytes"
	"errors"
	"testing"
)

// seedHeaders are one header of every shape the engine sends.
func seedHeaders() []Header {
	return []Header{
		{Op: OpSend, Flags: FlagFirst | FlagLast | FlagAckReq, DestQP: 7, SrcQP: 9, PSN: PSNMask},
		{Op: OpSend, Flags: FlagLast | FlagImm | FlagSolicited, DestQP: 7, SrcQP: 9, PSN: 1, Imm: 0xdeadbeef},
		{Op: OpWrite, Flags: FlagFirst, DestQP: 1, SrcQP: 2, PSN: 3, VA: 1 << 40, RKey: 0x1234, DMALen: 1 << 20},
		{Op: OpWrite, Flags: FlagFirst | FlagLast | FlagImm | FlagDC, DestQP: 1, SrcQP: 2, PSN: 3, DCKey: 99, SessionPSN: 3, VA: 8, RKey: 5, DMALen: 8, Imm: 4},
		{Op: OpReadReq, Flags: FlagFirst | FlagLast, DestQP: 1, SrcQP: 2, PSN: 4, VA: 64, RKey: 5, DMALen: 1 << 20, RespMTU: 4096},
		{Op: OpReadResp, Flags: FlagFirst, DestQP: 1, SrcQP: 2, PSN: 4, Syndrome: SynAck, MSN: 77},
		{Op: OpCmpSwap, Flags: FlagFirst | FlagLast | FlagAckReq | FlagDC, DestQP: 1, SrcQP: 2, PSN: 4, DCKey: 1, SessionPSN: 2, VA: 16, RKey: 5, Swap: 1, Cmp: 2},
		{Op: OpFetchAdd, Flags: FlagFirst | FlagLast | FlagAckReq, DestQP: 1, SrcQP: 2, PSN: 4, VA: 16, RKey: 5, Swap: 1},
		{Op: OpAck, DestQP: 1, SrcQP: 2, PSN: 4, Syndrome: SynRNR, Reason: 3, RNRTimer: 200, MSN: 5},
		{Op: OpAtomicAck, DestQP: 1, SrcQP: 2, PSN: 4, Syndrome: SynAck, MSN: 5, Orig: 1<<64 - 1},
		{Op: OpCMReq, Service: 1, CMQPN: 2, CMPSN: 3, CMMTU: 4096, ConnID: 1<<63 + 5},
		{Op: OpCMRej, Service: 1, ConnID: 7},
		{Op: OpReadReq, Flags: FlagFirst | FlagLast | FlagDC | FlagMAC, DestQP: 1, SrcQP: 2, PSN: 4, MAC: [16]byte{1, 2, 3}, DCKey: 5, SessionPSN: 4, VA: 64, RKey: 5, DMALen: 8, RespMTU: 4096},
		{Op: OpAck, Flags: FlagMAC, DestQP: 1, SrcQP: 2, PSN: 4, MAC: [16]byte{15: 9}, Syndrome: SynAck, MSN: 5},
		{Op: OpWrite, Flags: FlagFirst | FlagMAC | FlagEnc, DestQP: 1, SrcQP: 2, PSN: 4, AuthIndex: 77, AuthCounter: 1<<63 + 1, VA: 8, RKey: 5, DMALen: 8},
		{Op: OpCMReq, Flags: FlagMAC, AuthIndex: 3, AuthCounter: 9, Service: 1, CMQPN: 2, CMPSN: 3, CMMTU: 4096, ConnID: 5, Cookie: 1<<64 - 2},
		{Op: OpHSInit, Flags: FlagMAC},
		{Op: OpHSResp, Flags: FlagMAC, MAC: [16]byte{1}},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, h := range seedHeaders() {
		b := h.Append(nil)
		if len(b) != h.Len() {
			t.Errorf("%v: Append wrote %d bytes, Len says %d", h.Op, len(b), h.Len())
		}
		n, err := HeaderLen(b)
		if err != nil || n != len(b) {
			t.Errorf("%v: HeaderLen = %d, %v; want %d", h.Op, n, err, len(b))
		}
		got, n, err := Parse(append(b, 1, 2, 3))
		if err != nil {
			t.Fatalf("%v: Parse: %v", h.Op, err)
		}
		if n != len(b) || got != h {
			t.Errorf("%v: round trip: got %+v (n=%d), want %+v (n=%d)", h.Op, got, n, h, len(b))
		}
	}
}

func TestParseRejects(t *testing.T) {
	good := (&Header{Op: OpAck, Syndrome: SynAck}).Append(nil)
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrShort},
		{"short base", good[:BaseLen-1], ErrShort},
		{"short ext", good[:BaseLen+2], ErrShort},
		{"magic", append([]byte{0}, good[1:]...), ErrMagic},
		{"version", append([]byte{Magic, 9}, good[2:]...), ErrVersion},
		{"opcode", append([]byte{Magic, Version, 0}, good[3:]...), ErrOpcode},
		{"opcode high", append([]byte{Magic, Version, byte(opMax)}, good[3:]...), ErrOpcode},
		{"flags", append([]byte{Magic, Version, byte(OpAck), 0x80}, good[4:]...), ErrFlags},
		{"DC on ACK", append([]byte{Magic, Version, byte(OpAck), byte(FlagDC)}, make([]byte, 40)...), ErrFlags},
		{"QPN wide", func() []byte { b := bytes.Clone(good); b[4] = 1; return b }(), ErrField},
		{"syndrome", func() []byte { b := bytes.Clone(good); b[BaseLen] = 99; return b }(), ErrField},
		{"WRITE first without MTU is fine", (&Header{Op: OpWrite, Flags: FlagFirst}).Append(nil), nil},
	}
	// A READ request with RespMTU 0 can only be made by hand.
	rr := (&Header{Op: OpReadReq, RespMTU: 1}).Append(nil)
	rr[BaseLen+16+3] = 0
	cases = append(cases, struct {
		name string
		b    []byte
		want error
	}{"READ MTU 0", rr, ErrField})
	for _, c := range cases {
		_, _, err := Parse(c.b)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Parse error %v, want %v", c.name, err, c.want)
		}
	}
}

func TestAppendPanicsOnInvalid(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Append of a header with a 25-bit PSN did not panic")
		}
	}()
	h := Header{Op: OpAck, PSN: 1 << 24}
	h.Append(nil)
}

func TestPSNWrap(t *testing.T) {
	top := PSN(PSNMask)
	if top.Add(1) != 0 || top.Add(2) != 1 {
		t.Fatalf("Add does not wrap: %d %d", top.Add(1), top.Add(2))
	}
	if d := PSN(1).Sub(top); d != 2 {
		t.Fatalf("1 - (2^24-1) = %d, want 2", d)
	}
	if d := top.Sub(1); d != -2 {
		t.Fatalf("(2^24-1) - 1 = %d, want -2", d)
	}
	if !top.Less(0) || PSN(0).Less(top) {
		t.Fatal("2^24-1 must come before 0 across the wrap")
	}
	if !PSN(5).LessEq(5) || PSN(6).LessEq(5) {
		t.Fatal("LessEq wrong")
	}
	if d := PSN(1 << 23).Sub(0); d != 1<<23 {
		t.Fatalf("half-range distance = %d", d)
	}
}

// FuzzParse: Parse never panics; whatever it accepts re-encodes to the
// same header bytes and parses again to the same header.
func FuzzParse(f *testing.F) {
	for _, h := range seedHeaders() {
		f.Add(h.Append(nil))
		f.Add(append(h.Append(nil), "payload"...))
	}
	f.Add([]byte{})
	f.Add([]byte{Magic, Version})
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := HeaderLen(b); err == nil && (n < BaseLen || n > MaxHeaderLen) {
			t.Fatalf("HeaderLen %d outside [%d, %d]", n, BaseLen, MaxHeaderLen)
		}
		h, n, err := Parse(b)
		if err != nil {
			return
		}
		if n != h.Len() || n > len(b) {
			t.Fatalf("Parse length %d, Len %d, input %d", n, h.Len(), len(b))
		}
		enc := h.Append(nil)
		if !bytes.Equal(enc, b[:n]) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", b[:n], enc)
		}
		h2, n2, err := Parse(enc)
		if err != nil || n2 != n || h2 != h {
			t.Fatalf("second parse: %+v %d %v, want %+v %d", h2, n2, err, h, n)
		}
	})
}

// TestAuthFlagsRules: FlagEnc and the handshake opcodes need an AuthETH;
// SetAuth and MACField address its fields in place.
func TestAuthFlagsRules(t *testing.T) {
	for _, h := range []Header{{Op: OpHSInit}, {Op: OpAck, Flags: FlagEnc}} {
		b := (&Header{Op: OpAck}).Append(nil)
		b[2], b[3] = byte(h.Op), byte(h.Flags)
		if _, _, err := Parse(append(b, make([]byte, 64)...)); err == nil {
			t.Errorf("%v flags %v parsed without an AuthETH", h.Op, h.Flags)
		}
	}
	h := Header{Op: OpAck, Flags: FlagMAC, Syndrome: SynAck}
	b := h.Append(nil)
	if !SetAuth(b, 0xAABBCCDD, 1<<40+7) {
		t.Fatal("SetAuth refused a header with AuthETH")
	}
	copy(MACField(b), "0123456789abcdef")
	got, _, err := Parse(b)
	if err != nil || got.AuthIndex != 0xAABBCCDD || got.AuthCounter != 1<<40+7 || string(got.MAC[:]) != "0123456789abcdef" {
		t.Fatalf("AuthETH round trip: %+v %v", got, err)
	}
	if SetAuth((&Header{Op: OpAck}).Append(nil), 1, 1) || MACField((&Header{Op: OpAck}).Append(nil)) != nil {
		t.Fatal("AuthETH accessors on a header without one")
	}
}

// TestHeaderLenRejectsBadShape: a flag combination no sender writes is
// refused by HeaderLen itself, so the length it returns stays within
// MaxHeaderLen. (The fuzzer found a CM_REQ with MAC, DC and an immediate:
// 92 bytes, past the 88 a receiver reads to decide.)
func TestHeaderLenRejectsBadShape(t *testing.T) {
	b := make([]byte, 128)
	b[0], b[1] = Magic, Version
	b[2] = byte(OpCMReq)
	b[3] = byte(FlagMAC | FlagDC | FlagImm | FlagFirst | FlagLast)
	if n, err := HeaderLen(b); !errors.Is(err, ErrFlags) {
		t.Fatalf("HeaderLen of a CM_REQ with DC and immediate flags = %d, %v; want ErrFlags", n, err)
	}
	// Every opcode with every flag byte: accepted lengths stay in bounds
	// and agree with Parse's verdict on the shape.
	for op := 0; op < 256; op++ {
		for fl := 0; fl < 256; fl++ {
			b[2], b[3] = byte(op), byte(fl)
			n, err := HeaderLen(b)
			if err != nil {
				continue
			}
			if n < BaseLen || n > MaxHeaderLen {
				t.Fatalf("op %d flags %#x: HeaderLen %d outside [%d, %d]", op, fl, n, BaseLen, MaxHeaderLen)
			}
		}
	}
}
