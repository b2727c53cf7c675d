package rdma

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
)

func TestWCStatus(t *testing.T) {
	cases := []struct {
		st   uint32
		recv bool
		want verbs.Status
		why  verbs.Reason
	}{
		{ibvWCSuccess, false, verbs.StatusSuccess, verbs.ReasonNone},
		{ibvWCLocLenErr, true, verbs.StatusLocLenErr, verbs.ReasonRecvLen},
		{ibvWCLocLenErr, false, verbs.StatusLocLenErr, verbs.ReasonNone},
		{ibvWCLocProtErr, false, verbs.StatusLocProtErr, verbs.ReasonNone},
		{ibvWCLocAccessErr, false, verbs.StatusLocProtErr, verbs.ReasonNone},
		{ibvWCWRFlushErr, true, verbs.StatusWRFlushErr, verbs.ReasonNone},
		{ibvWCRemInvReqErr, false, verbs.StatusRemInvReqErr, verbs.ReasonNone},
		{ibvWCRemInvRdReqEr, false, verbs.StatusRemInvReqErr, verbs.ReasonNone},
		{ibvWCRemAccessErr, false, verbs.StatusRemAccessErr, verbs.ReasonNone},
		{ibvWCRetryExcErr, false, verbs.StatusRetryExcErr, verbs.ReasonRemoteDown},
		{ibvWCRespTimeout, false, verbs.StatusRetryExcErr, verbs.ReasonRemoteDown},
		{ibvWCRNRRetryExc, false, verbs.StatusRNRRetryExcErr, verbs.ReasonNone},
		{ibvWCRemOpErr, false, verbs.StatusRemOpErr, verbs.ReasonNone},
		{ibvWCFatalErr, false, verbs.StatusRemOpErr, verbs.ReasonNone},
		{ibvWCGeneralErr, false, verbs.StatusRemOpErr, verbs.ReasonNone},
		{ibvWCRemAbortErr, false, verbs.StatusRemOpErr, verbs.ReasonNone},
	}
	for _, c := range cases {
		st, why := wcStatus(c.st, c.recv)
		if st != c.want || why != c.why {
			t.Errorf("wcStatus(%d, recv %v) = %v, %v; want %v, %v", c.st, c.recv, st, why, c.want, c.why)
		}
	}
}

func TestOpcodesRoundTrip(t *testing.T) {
	// Every send opcode has a WR opcode, and its success completion maps
	// back to it.
	wcOf := map[uint32]uint32{ibvWRRDMARead: ibvWCRDMARead, ibvWRRDMAWrite: ibvWCRDMAWrite, ibvWRRDMAWriteWithImm: ibvWCRDMAWrite,
		ibvWRSend: ibvWCSend, ibvWRSendWithImm: ibvWCSend, ibvWRAtomicCmpAndSwp: ibvWCCompSwap, ibvWRAtomicFetchAdd: ibvWCFetchAdd}
	for _, op := range []verbs.Opcode{verbs.OpRead, verbs.OpWrite, verbs.OpWriteImm, verbs.OpSend, verbs.OpSendImm, verbs.OpCmpSwap, verbs.OpFetchAdd} {
		wr, ok := wrOpcode(op)
		if !ok {
			t.Fatalf("%v has no WR opcode", op)
		}
		imm := op == verbs.OpWriteImm || op == verbs.OpSendImm
		if back := wcOpcode(wcOf[wr], imm); back != op {
			t.Errorf("%v -> WR %d -> WC %d -> %v", op, wr, wcOf[wr], back)
		}
	}
	for _, op := range []verbs.Opcode{verbs.OpRecv, verbs.OpRecvWriteImm, 0, 99} {
		if _, ok := wrOpcode(op); ok {
			t.Errorf("%v is not a send opcode but maps to one", op)
		}
	}
	if wcOpcode(ibvWCRecv, false) != verbs.OpRecv || wcOpcode(ibvWCRecvRDMAWithIm, true) != verbs.OpRecvWriteImm {
		t.Error("receive completion opcodes")
	}
}

func TestFlagsAndAccess(t *testing.T) {
	if got := sendFlags(verbs.Signaled | verbs.Fence | verbs.Inline | verbs.Solicited); got != ibvSendSignaled|ibvSendFence|ibvSendInline|ibvSendSolicited {
		t.Errorf("sendFlags(all) = %#x", got)
	}
	if sendFlags(0) != 0 {
		t.Error("sendFlags(0) != 0")
	}
	if got := accessFlags(verbs.AccessAll); got != ibvAccessLocalWrite|ibvAccessRemoteRead|ibvAccessRemoteWrite|ibvAccessRemoteAtomic {
		t.Errorf("accessFlags(all) = %#x", got)
	}
	if got := accessFlags(verbs.AccessRemoteRead); got != ibvAccessRemoteRead {
		t.Errorf("accessFlags(R) = %#x", got)
	}
	if mrAccessFlags(verbs.AccessRemoteRead)&ibvAccessZeroBased != 0 {
		t.Error("MRs are zero-based by iova 0, not by the memory-window flag")
	}
	for s, want := range map[verbs.QPState]uint32{verbs.StateReset: ibvQPSReset, verbs.StateInit: ibvQPSInit,
		verbs.StateRTR: ibvQPSRTR, verbs.StateRTS: ibvQPSRTS, verbs.StateErr: ibvQPSErr} {
		if qpState(s) != want {
			t.Errorf("qpState(%v) = %d, want %d", s, qpState(s), want)
		}
	}
}

func TestMTU(t *testing.T) {
	for bytes, want := range map[int]uint32{256: 1, 511: 1, 512: 2, 1024: 3, 1500: 3, 2048: 4, 4096: 5, 9000: 5} {
		got, err := mtuEnum(bytes)
		if err != nil || got != want {
			t.Errorf("mtuEnum(%d) = %d, %v; want %d", bytes, got, err, want)
		}
		if mtuBytes(got) > bytes {
			t.Errorf("mtuEnum(%d) picks %d bytes, more than asked", bytes, mtuBytes(got))
		}
	}
	if _, err := mtuEnum(255); err == nil {
		t.Error("mtuEnum(255) succeeded")
	}
	if mtuBytes(0) != 0 || mtuBytes(6) != 0 || mtuBytes(3) != 1024 {
		t.Error("mtuBytes")
	}
}

func TestTimers(t *testing.T) {
	if ackTimeout(0) != 14 {
		t.Errorf("default ACK timeout exponent %d, want 14", ackTimeout(0))
	}
	for _, d := range []time.Duration{time.Microsecond, 100 * time.Microsecond, 67 * time.Millisecond, time.Second, 2 * time.Second} {
		e := ackTimeout(d)
		if ibTimeout(e) < d || (e > 1 && ibTimeout(e-1) >= d) {
			t.Errorf("ackTimeout(%v) = %d (%v): not the smallest exponent covering it", d, e, ibTimeout(e))
		}
	}
	if ackTimeout(time.Hour) != 30 {
		t.Errorf("ackTimeout(1h) = %d, want the cap 30", ackTimeout(time.Hour))
	}
	for c := 2; c < 32; c++ {
		if rnrTimers[c] <= rnrTimers[c-1] {
			t.Fatalf("RNR timer table not increasing at %d", c)
		}
	}
	if rnrTimerCode(0) != 12 || rnrTimerCode(10*time.Microsecond) != 1 || rnrTimerCode(11*time.Microsecond) != 2 ||
		rnrTimerCode(time.Second) != 0 || rnrTimerCode(640*time.Microsecond) != 12 {
		t.Error("rnrTimerCode")
	}
}

func TestGID(t *testing.T) {
	ip4 := netip.MustParseAddr("10.1.2.3")
	g := GIDFromIP(ip4)
	if g.String() != "::ffff:10.1.2.3" || g.IP() != ip4 || g.IsZero() {
		t.Errorf("GIDFromIP(%v) = %v (IP %v)", ip4, g, g.IP())
	}
	ip6 := netip.MustParseAddr("fe80::1")
	if GIDFromIP(ip6).IP() != ip6 {
		t.Error("IPv6 GID round trip")
	}
	if !(GID{}).IsZero() {
		t.Error("zero GID")
	}
	if gidTypeName(ibvGIDTypeRoCEv2) != "RoCEv2" || linkLayerName(ibvLinkLayerEthernet) != "Ethernet" ||
		linkLayerName(0) != "InfiniBand" || portStateName(ibvPortActive) != "ACTIVE" {
		t.Error("names")
	}
}

func TestDefaultGIDAndUsable(t *testing.T) {
	v4 := GIDFromIP(netip.MustParseAddr("192.168.0.7"))
	v6 := GIDFromIP(netip.MustParseAddr("fe80::7"))
	p := PortInfo{Num: 1, State: "ACTIVE", LinkLayer: "Ethernet", GIDs: []GIDInfo{
		{Index: 0, GID: v6, Type: "RoCEv1"}, {Index: 1, GID: v6, Type: "RoCEv2"}, {Index: 2, GID: v4, Type: "RoCEv1"}, {Index: 3, GID: v4, Type: "RoCEv2"}}}
	if g, ok := p.DefaultGID(); !ok || g.Index != 3 {
		t.Errorf("DefaultGID = %+v, %v; want the IPv4 RoCEv2 entry 3", g, ok)
	}
	if !p.Usable() {
		t.Error("an active RoCE port with a RoCEv2 GID is usable")
	}
	p.GIDs = p.GIDs[:1]
	if _, ok := p.DefaultGID(); ok || p.Usable() {
		t.Error("a RoCE port with only RoCEv1 GIDs is not usable")
	}
	ib := PortInfo{State: "ACTIVE", LinkLayer: "InfiniBand", LID: 0, GIDs: []GIDInfo{{Index: 0, Type: "IB"}}}
	if ib.Usable() {
		t.Error("an IB port without a LID (no subnet manager) is not usable")
	}
	ib.LID = 5
	if !ib.Usable() {
		t.Error("an active IB port with a LID is usable")
	}
	ib.State = "DOWN"
	if ib.Usable() {
		t.Error("a down port is not usable")
	}
}

func TestDescribe(t *testing.T) {
	out := Describe([]DeviceInfo{{Name: "rxe0", Transport: "InfiniBand", DCNote: "not an mlx5 device", IOVA: true, Atomic: verbs.AtomicNone,
		MaxSRQWR: 32767, MaxCQE: 1 << 22, Ports: []PortInfo{{Num: 1, State: "ACTIVE",
			LinkLayer: "Ethernet", ActiveMTU: 1024, GIDs: []GIDInfo{{Index: 1, GID: GIDFromIP(netip.MustParseAddr("10.0.0.1")), Type: "RoCEv2"}}},
			{Num: 2, State: "DOWN", LinkLayer: "Ethernet"}}},
		{Name: "mlx5_9", Err: "ibv_open_device: permission denied"},
		{Name: "siw0", Transport: "iWARP", IOVA: true}})
	for _, want := range []string{"rxe0", "DC: no (not an mlx5 device)", "RC-only", "port 1  ACTIVE  Ethernet", "RoCEv2 (10.0.0.1)",
		"atomics: none: krfs refuses atomic operations", "max SRQ 32767", "port 2  DOWN  Ethernet  lid 0  mtu 0  not usable: not ACTIVE",
		"mlx5_9  NOT USABLE: ibv_open_device: permission denied", "siw0", "NOT USABLE: an iWARP device"} {
		if !strings.Contains(out, want) {
			t.Errorf("Describe output lacks %q:\n%s", want, out)
		}
	}
}
