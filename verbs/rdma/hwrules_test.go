package rdma

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/krfs/krfs/verbs"
)

func TestMRIOVA(t *testing.T) {
	const page = 4096
	// malloc'd memory lands 80, 96 or 112 bytes into a page: the kernel
	// refuses those at IOVA 0 (what the zero-based probe and RegMR did),
	// and accepts them at their page offset.
	for _, off := range []uintptr{0, 80, 96, 112, page - 8} {
		addr := 0x7f0012340000 + off
		if got := kernelAcceptsIOVA(addr, 0, page); got != (off == 0) {
			t.Errorf("a buffer %d bytes into a page at IOVA 0: kernel accepts %v", off, got)
		}
		iova := mrIOVA(addr, page)
		if iova != uint64(off) || !kernelAcceptsIOVA(addr, iova, page) {
			t.Errorf("a buffer %d bytes into a page registers at IOVA %d", off, iova)
		}
	}
	// SGEs of such an MR name IOVA + offset.
	m := mrState{iova: 80}
	if m.localAddr(0) != 80 || m.localAddr(100) != 180 {
		t.Errorf("local addresses of an MR at IOVA 80: %d, %d", m.localAddr(0), m.localAddr(100))
	}
}

func TestDecodeWC(t *testing.T) {
	// The poll array as an earlier completion left it: a successful
	// receive of 512 bytes with an immediate, from QP 77.
	stale := rawWC{opcode: ibvWCRecv, byteLen: 512, imm: 9, flags: ibvWCWithImm, srcQP: 77}
	for _, recv := range []bool{false, true} {
		for _, base := range []rawWC{{}, stale} {
			w := base
			w.wrID, w.status, w.qpNum, w.vendorErr = 5, ibvWCRemAccessErr, 12, 0x88
			wc := decodeWC(&w, recv)
			if wc.ID != 5 || wc.Status != verbs.StatusRemAccessErr || wc.QPN != 12 || wc.VendorErr != 0x88 {
				t.Errorf("error completion (recv %v) decoded as %+v", recv, wc)
			}
			if wc.Op != 0 || wc.ByteLen != 0 || wc.HasImm || wc.Imm != 0 || wc.SrcQPN != 0 {
				t.Errorf("error completion (recv %v) over %+v took undefined fields: %+v", recv, base, wc)
			}
		}
	}
	// Flushed receives keep their receive reason even with a zeroed
	// opcode (IBV_WC_SEND): the half, not the opcode, says receive.
	flushed := rawWC{status: ibvWCLocLenErr}
	if wc := decodeWC(&flushed, true); wc.Reason != verbs.ReasonRecvLen {
		t.Errorf("receive length error decoded with reason %v", wc.Reason)
	}
	ok := rawWC{wrID: 1, opcode: ibvWCRDMAWrite, byteLen: 64}
	if wc := decodeWC(&ok, false); wc.Op != verbs.OpWrite || wc.ByteLen != 64 || wc.SrcQPN != 0 {
		t.Errorf("send completion: %+v", wc)
	}
	rx := rawWC{wrID: 2, opcode: ibvWCRecvRDMAWithIm, byteLen: 8, flags: ibvWCWithImm, imm: 3, srcQP: 44}
	if wc := decodeWC(&rx, true); wc.Op != verbs.OpRecvWriteImm || !wc.HasImm || wc.Imm != 3 || wc.SrcQPN != 44 {
		t.Errorf("receive completion: %+v", wc)
	}
}

func TestQPIndexDCTNumberAfterRTR(t *testing.T) {
	type q struct{ name string }
	var x qpIndex[*q]
	rc, dct := &q{"rc"}, &q{"dct"}
	if err := x.add(0x11, rc); err != nil {
		t.Fatal(err)
	}
	// mlx5dv_create_qp of a DCT returns qp_num 0: it is not indexed.
	if err := x.add(0, dct); err == nil {
		t.Fatal("QP number 0 was indexed")
	}
	if _, ok := x.get(0); ok {
		t.Fatal("number 0 finds a QP")
	}
	// At RTR it gets its number, and completions naming it find it.
	if err := x.add(0x2345, dct); err != nil {
		t.Fatal(err)
	}
	if got, ok := x.get(0x2345); !ok || got != dct {
		t.Fatalf("the DCT's RTR number finds %v", got)
	}
	x.remove(0x2345, rc) // not the QP under that number: kept
	if _, ok := x.get(0x2345); !ok {
		t.Fatal("remove of another QP dropped the DCT")
	}
	if l := x.list(); len(l) != 2 {
		t.Fatalf("list: %v", l)
	}
	x.remove(0x2345, dct)
	if _, ok := x.get(0x2345); ok || x.len() != 1 {
		t.Fatal("remove kept the DCT")
	}
	if all := x.takeAll(); len(all) != 1 || all[0] != rc || x.len() != 0 {
		t.Fatalf("takeAll: %v, then %d left", all, x.len())
	}
}

func TestCheckModify(t *testing.T) {
	cases := []struct {
		typ  verbs.QPType
		from verbs.QPState
		a    verbs.QPAttr
		cap  verbs.AtomicCap
		want error
	}{
		{verbs.DCT, verbs.StateReset, verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead}, verbs.AtomicHCA, nil},
		{verbs.DCT, verbs.StateInit, verbs.QPAttr{State: verbs.StateRTR}, verbs.AtomicHCA, nil},
		{verbs.DCT, verbs.StateRTR, verbs.QPAttr{State: verbs.StateErr}, verbs.AtomicHCA, verbs.ErrTransition},
		{verbs.DCT, verbs.StateRTR, verbs.QPAttr{State: verbs.StateReset}, verbs.AtomicHCA, verbs.ErrTransition},
		{verbs.DCT, verbs.StateRTR, verbs.QPAttr{State: verbs.StateRTS}, verbs.AtomicHCA, verbs.ErrTransition},
		{verbs.DCI, verbs.StateReset, verbs.QPAttr{State: verbs.StateErr}, verbs.AtomicHCA, verbs.ErrTransition},
		{verbs.DCI, verbs.StateErr, verbs.QPAttr{State: verbs.StateReset}, verbs.AtomicHCA, nil},
		{verbs.DCI, verbs.StateRTS, verbs.QPAttr{State: verbs.StateErr}, verbs.AtomicHCA, nil},
		{verbs.RC, verbs.StateReset, verbs.QPAttr{State: verbs.StateErr}, verbs.AtomicHCA, nil},
		{verbs.RC, verbs.StateRTS, verbs.QPAttr{State: verbs.StateRTS, Timeout: 1}, verbs.AtomicHCA, verbs.ErrInvalidArg},
		{verbs.RC, verbs.StateReset, verbs.QPAttr{State: verbs.StateInit, RetryCnt: 8}, verbs.AtomicHCA, verbs.ErrInvalidArg},
		// Remote atomic access without atomics: mlx5 fails it at INIT.
		{verbs.RC, verbs.StateReset, verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteAtomic}, verbs.AtomicNone, verbs.ErrNotSupported},
		{verbs.DCT, verbs.StateReset, verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteAtomic}, verbs.AtomicNone, verbs.ErrNotSupported},
		{verbs.RC, verbs.StateReset, verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead}, verbs.AtomicNone, nil},
		// A path MTU the port cannot carry is refused, not clamped.
		{verbs.RC, verbs.StateInit, verbs.QPAttr{State: verbs.StateRTR, PathMTU: 8192}, verbs.AtomicHCA, verbs.ErrInvalidArg},
		{verbs.RC, verbs.StateInit, verbs.QPAttr{State: verbs.StateRTR, PathMTU: 128}, verbs.AtomicHCA, verbs.ErrInvalidArg},
		{verbs.RC, verbs.StateInit, verbs.QPAttr{State: verbs.StateRTR, PathMTU: 1024}, verbs.AtomicHCA, nil},
	}
	for _, c := range cases {
		a := c.a
		err := checkModify(c.typ, c.from, &a, c.cap, 4096)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%v %v -> %v (%+v, atomics %v): %v, want %v", c.typ, c.from, c.a.State, c.a, c.cap, err, c.want)
		}
	}
}

func TestAtomicCapAndDefaultAccess(t *testing.T) {
	if atomicCap(ibvAtomicNone) != verbs.AtomicNone || atomicCap(ibvAtomicHCA) != verbs.AtomicHCA || atomicCap(ibvAtomicGlob) != verbs.AtomicGlob {
		t.Error("atomic_cap mapping")
	}
	if defaultAccess(verbs.AtomicNone)&verbs.AccessRemoteAtomic != 0 {
		t.Error("a device without atomics grants remote atomics by default")
	}
	if defaultAccess(verbs.AtomicHCA) != verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic {
		t.Error("a device with atomics grants all remote access by default")
	}
	if err := checkSRQDepth(65536, 32767); !errors.Is(err, verbs.ErrInvalidArg) {
		t.Errorf("SRQ of 65536 on a device with max_srq_wr 32767: %v", err)
	}
	if err := checkSRQDepth(32767, 32767); err != nil {
		t.Errorf("SRQ of max_srq_wr: %v", err)
	}
}

func TestQoS(t *testing.T) {
	if err := (QoS{TrafficClass: 104, SL: 3, HopLimit: 8}).validate(); err != nil {
		t.Fatal(err)
	}
	for _, q := range []QoS{{TrafficClass: 256}, {TrafficClass: -1}, {SL: 16}, {HopLimit: 256}} {
		if err := q.validate(); !errors.Is(err, verbs.ErrInvalidArg) {
			t.Errorf("%+v: %v", q, err)
		}
	}
	if (QoS{}).hopLimit() != 64 || (QoS{HopLimit: 3}).hopLimit() != 3 {
		t.Error("hop limit defaults to 64")
	}
}

func TestCMListenAddr(t *testing.T) {
	gid := GIDFromIP(netip.MustParseAddr("10.1.2.3"))
	cases := []struct {
		cfg  string
		ib   bool
		want string
	}{
		{"", false, "10.1.2.3:4792"},
		{"", true, ":4792"},
		{":7000", false, "10.1.2.3:7000"},
		{"0.0.0.0:7000", false, "10.1.2.3:7000"},
		{"192.168.9.9:7000", false, "192.168.9.9:7000"},
		{"10.1.2.3:0", false, "10.1.2.3:0"},
		{":0", true, ":0"},
	}
	for _, c := range cases {
		got, err := cmListenAddr(c.cfg, gid, c.ib)
		if err != nil || got != c.want {
			t.Errorf("cmListenAddr(%q, ib %v) = %q, %v; want %q", c.cfg, c.ib, got, err, c.want)
		}
	}
	// The old default, 127.0.0.1:4791: RoCEv2's port, which the NIC takes.
	for _, bad := range []string{"127.0.0.1:4791", ":4791", "10.1.2.3:4791", "nonsense", "1.2.3.4:99999"} {
		if _, err := cmListenAddr(bad, gid, false); !errors.Is(err, verbs.ErrInvalidArg) {
			t.Errorf("cmListenAddr(%q): %v, want ErrInvalidArg", bad, err)
		}
	}
	if _, err := cmListenAddr(":4791", gid, false); !strings.Contains(err.Error(), "RoCEv2") {
		t.Errorf("refusing 4791 does not say why: %v", err)
	}
}

func TestPickPort(t *testing.T) {
	v2 := []GIDInfo{{Index: 3, GID: GIDFromIP(netip.MustParseAddr("10.0.0.1")), Type: "RoCEv2"}}
	devs := []DeviceInfo{
		{Name: "mlx5_0", Err: "ibv_query_device: input/output error"},
		{Name: "siw0", Transport: "iWARP", IOVA: true, Ports: []PortInfo{{Num: 1, State: "ACTIVE", LinkLayer: "Ethernet", GIDs: v2}}},
		{Name: "mlx5_1", Transport: "InfiniBand", IOVA: true, Ports: []PortInfo{
			{Num: 1, State: "DOWN", LinkLayer: "Ethernet", GIDs: v2},
			{Num: 2, State: "ACTIVE", LinkLayer: "Ethernet", GIDs: v2}}},
	}
	d, p, err := pickPort(devs, Config{GIDIndex: -1})
	if err != nil || d.Name != "mlx5_1" || p.Num != 2 {
		t.Fatalf("free choice: %v port %d, %v; want mlx5_1 port 2 (skipping the broken and the iWARP device)", d, p.Num, err)
	}
	// An explicit port that is DOWN is refused, saying so, instead of
	// being opened.
	_, _, err = pickPort(devs, Config{Device: "mlx5_1", Port: 1, GIDIndex: -1})
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "port 1 is DOWN") {
		t.Fatalf("a DOWN port asked for: %v", err)
	}
	if _, _, err = pickPort(devs, Config{Device: "siw0", GIDIndex: -1}); err == nil || !strings.Contains(err.Error(), "iWARP") {
		t.Fatalf("siw asked for: %v", err)
	}
	if _, _, err = pickPort(devs, Config{Device: "mlx5_0", GIDIndex: -1}); err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("a device that failed to open asked for: %v", err)
	}
}

func TestEventOf(t *testing.T) {
	cases := map[uint32]struct {
		ev  verbs.EventType
		obj eventObject
	}{
		ibvEventQPFatal:          {verbs.EventQPFatal, eventQP},
		ibvEventQPReqErr:         {verbs.EventQPReqErr, eventQP},
		ibvEventQPAccessErr:      {verbs.EventQPAccessErr, eventQP},
		ibvEventQPLastWQEReached: {verbs.EventQPLastWQE, eventQP},
		ibvEventCQErr:            {verbs.EventCQErr, eventCQ},
		ibvEventSRQLimitReached:  {verbs.EventSRQLimit, eventSRQ},
		ibvEventSRQErr:           {verbs.EventSRQErr, eventSRQ},
		ibvEventPortActive:       {verbs.EventPortActive, eventPort},
		ibvEventPortErr:          {verbs.EventPortErr, eventPort},
		ibvEventDeviceFatal:      {verbs.EventDeviceFatal, eventDevice},
		4:                        {0, eventNone}, // COMM_EST: not reported
	}
	for raw, want := range cases {
		if ev, obj := eventOf(raw); ev != want.ev || obj != want.obj {
			t.Errorf("eventOf(%d) = %v, %v; want %v, %v", raw, ev, obj, want.ev, want.obj)
		}
		if want.obj == eventQP && !want.ev.IsQPError() {
			t.Errorf("%v does not count as a QP error", want.ev)
		}
	}
}

func TestTransportName(t *testing.T) {
	if transportName(ibvTransportIB) != "InfiniBand" || transportName(ibvTransportIWARP) != "iWARP" {
		t.Error("transport names")
	}
}

func TestInvalidatesTarget(t *testing.T) {
	if !invalidatesTarget(verbs.StatusRetryExcErr) || invalidatesTarget(verbs.StatusRemAccessErr) || invalidatesTarget(verbs.StatusWRFlushErr) {
		t.Error("only a retry error says the target may have moved")
	}
}

func TestPlan(t *testing.T) {
	v2 := []GIDInfo{{Index: 3, GID: GIDFromIP(netip.MustParseAddr("10.0.0.1")), Type: "RoCEv2"}}
	devs := []DeviceInfo{{Name: "mlx5_0", Transport: "InfiniBand", IOVA: true, DC: true, Atomic: verbs.AtomicHCA,
		Ports: []PortInfo{{Num: 1, State: "ACTIVE", LinkLayer: "Ethernet", GIDs: v2}}}}
	got, err := Plan(devs, Config{GIDIndex: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"mlx5_0 port 1", "DC", "GID 3", "10.0.0.1:4792", "atomics HCA"} {
		if !strings.Contains(got, want) {
			t.Errorf("Plan %q lacks %q", got, want)
		}
	}
	if _, err := Plan(devs, Config{GIDIndex: -1, CMAddr: "10.0.0.1:4791"}); err == nil {
		t.Error("Plan accepted the RoCEv2 port for the connection manager")
	}
	if _, err := Plan(devs, Config{GIDIndex: 7}); err == nil {
		t.Error("Plan accepted a missing GID index")
	}
}
