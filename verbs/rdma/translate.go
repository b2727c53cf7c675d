package rdma

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/krfs/krfs/verbs"
)

// The ibverbs ABI values this package translates to and from. They are
// fixed by rdma-core's <infiniband/verbs.h>; the cgo half of the package
// checks each one against the header at compile time (abi_check.go), so
// the pure-Go translation below is tested in CI without a device and
// cannot drift from the header it will run against.
const (
	// enum ibv_wc_status
	ibvWCSuccess       = 0
	ibvWCLocLenErr     = 1
	ibvWCLocQPOpErr    = 2
	ibvWCLocProtErr    = 4
	ibvWCWRFlushErr    = 5
	ibvWCBadRespErr    = 7
	ibvWCLocAccessErr  = 8
	ibvWCRemInvReqErr  = 9
	ibvWCRemAccessErr  = 10
	ibvWCRemOpErr      = 11
	ibvWCRetryExcErr   = 12
	ibvWCRNRRetryExc   = 13
	ibvWCRemAbortErr   = 16
	ibvWCFatalErr      = 19
	ibvWCRespTimeout   = 20
	ibvWCGeneralErr    = 21
	ibvWCRemInvRdReqEr = 15

	// enum ibv_wc_opcode
	ibvWCSend           = 0
	ibvWCRDMAWrite      = 1
	ibvWCRDMARead       = 2
	ibvWCCompSwap       = 3
	ibvWCFetchAdd       = 4
	ibvWCRecv           = 128
	ibvWCRecvRDMAWithIm = 129

	// enum ibv_wr_opcode
	ibvWRRDMAWrite        = 0
	ibvWRRDMAWriteWithImm = 1
	ibvWRSend             = 2
	ibvWRSendWithImm      = 3
	ibvWRRDMARead         = 4
	ibvWRAtomicCmpAndSwp  = 5
	ibvWRAtomicFetchAdd   = 6

	// enum ibv_send_flags
	ibvSendFence     = 1 << 0
	ibvSendSignaled  = 1 << 1
	ibvSendSolicited = 1 << 2
	ibvSendInline    = 1 << 3

	// enum ibv_access_flags
	ibvAccessLocalWrite   = 1 << 0
	ibvAccessRemoteWrite  = 1 << 1
	ibvAccessRemoteRead   = 1 << 2
	ibvAccessRemoteAtomic = 1 << 3
	ibvAccessZeroBased    = 1 << 5

	// enum ibv_qp_state
	ibvQPSReset = 0
	ibvQPSInit  = 1
	ibvQPSRTR   = 2
	ibvQPSRTS   = 3
	ibvQPSErr   = 6

	// enum ibv_mtu
	ibvMTU256  = 1
	ibvMTU4096 = 5

	// enum ibv_port_state
	ibvPortActive = 4

	// IBV_LINK_LAYER_*
	ibvLinkLayerInfiniBand = 1
	ibvLinkLayerEthernet   = 2

	// enum ibv_gid_type (ibv_query_gid_ex)
	ibvGIDTypeIB     = 0
	ibvGIDTypeRoCEv1 = 1
	ibvGIDTypeRoCEv2 = 2

	// enum ibv_atomic_cap
	ibvAtomicNone = 0
	ibvAtomicHCA  = 1
	ibvAtomicGlob = 2

	// enum ibv_transport_type
	ibvTransportIB    = 0
	ibvTransportIWARP = 1

	// enum ibv_event_type (the ones krfs reports)
	ibvEventCQErr            = 0
	ibvEventQPFatal          = 1
	ibvEventQPReqErr         = 2
	ibvEventQPAccessErr      = 3
	ibvEventDeviceFatal      = 8
	ibvEventPortActive       = 9
	ibvEventPortErr          = 10
	ibvEventSRQErr           = 14
	ibvEventSRQLimitReached  = 15
	ibvEventQPLastWQEReached = 16

	// enum ibv_wc_flags
	ibvWCWithImm = 1 << 1
)

// wcStatus maps an ibv_wc_status to the verbs status and the reason the
// hardware lets us infer. ibv_wc has no reason field: a remote access
// error does not say whether the rkey, the bounds or the permission was
// wrong, so such completions carry ReasonNone (conformance suites run
// with InexactReasons on this backend). Retry exhaustion does mean that
// the peer did not answer.
func wcStatus(st uint32, recv bool) (verbs.Status, verbs.Reason) {
	switch st {
	case ibvWCSuccess:
		return verbs.StatusSuccess, verbs.ReasonNone
	case ibvWCLocLenErr:
		if recv {
			return verbs.StatusLocLenErr, verbs.ReasonRecvLen
		}
		return verbs.StatusLocLenErr, verbs.ReasonNone
	case ibvWCLocProtErr, ibvWCLocAccessErr:
		return verbs.StatusLocProtErr, verbs.ReasonNone
	case ibvWCWRFlushErr:
		return verbs.StatusWRFlushErr, verbs.ReasonNone
	case ibvWCRemInvReqErr, ibvWCRemInvRdReqEr:
		return verbs.StatusRemInvReqErr, verbs.ReasonNone
	case ibvWCRemAccessErr:
		return verbs.StatusRemAccessErr, verbs.ReasonNone
	case ibvWCRetryExcErr, ibvWCRespTimeout:
		return verbs.StatusRetryExcErr, verbs.ReasonRemoteDown
	case ibvWCRNRRetryExc:
		return verbs.StatusRNRRetryExcErr, verbs.ReasonNone
	}
	// REM_OP_ERR, BAD_RESP, LOC_QP_OP, FATAL, GENERAL and the rest: the
	// operation failed at one end for a reason verbs has no name for.
	return verbs.StatusRemOpErr, verbs.ReasonNone
}

// wcOpcode maps an ibv_wc_opcode of a successful completion.
func wcOpcode(op uint32, hasImm bool) verbs.Opcode {
	switch op {
	case ibvWCSend:
		if hasImm {
			return verbs.OpSendImm
		}
		return verbs.OpSend
	case ibvWCRDMAWrite:
		if hasImm {
			return verbs.OpWriteImm
		}
		return verbs.OpWrite
	case ibvWCRDMARead:
		return verbs.OpRead
	case ibvWCCompSwap:
		return verbs.OpCmpSwap
	case ibvWCFetchAdd:
		return verbs.OpFetchAdd
	case ibvWCRecv:
		return verbs.OpRecv
	case ibvWCRecvRDMAWithIm:
		return verbs.OpRecvWriteImm
	}
	return 0
}

// wrOpcode maps a send opcode to its ibv_wr_opcode.
func wrOpcode(op verbs.Opcode) (uint32, bool) {
	switch op {
	case verbs.OpRead:
		return ibvWRRDMARead, true
	case verbs.OpWrite:
		return ibvWRRDMAWrite, true
	case verbs.OpWriteImm:
		return ibvWRRDMAWriteWithImm, true
	case verbs.OpSend:
		return ibvWRSend, true
	case verbs.OpSendImm:
		return ibvWRSendWithImm, true
	case verbs.OpCmpSwap:
		return ibvWRAtomicCmpAndSwp, true
	case verbs.OpFetchAdd:
		return ibvWRAtomicFetchAdd, true
	}
	return 0, false
}

// sendFlags maps verbs send flags to ibv_send_flags.
func sendFlags(f verbs.SendFlags) uint32 {
	var r uint32
	if f&verbs.Signaled != 0 {
		r |= ibvSendSignaled
	}
	if f&verbs.Fence != 0 {
		r |= ibvSendFence
	}
	if f&verbs.Inline != 0 {
		r |= ibvSendInline
	}
	if f&verbs.Solicited != 0 {
		r |= ibvSendSolicited
	}
	return r
}

// accessFlags maps verbs access flags to ibv_access_flags.
func accessFlags(a verbs.Access) uint32 {
	var r uint32
	if a&verbs.AccessLocalWrite != 0 {
		r |= ibvAccessLocalWrite
	}
	if a&verbs.AccessRemoteRead != 0 {
		r |= ibvAccessRemoteRead
	}
	if a&verbs.AccessRemoteWrite != 0 {
		r |= ibvAccessRemoteWrite
	}
	if a&verbs.AccessRemoteAtomic != 0 {
		r |= ibvAccessRemoteAtomic
	}
	return r
}

// mrAccessFlags are the flags an MR is registered with. Its addressing
// comes from the IOVA it is registered at (ibv_reg_mr_iova, mrIOVA), not
// from IBV_ACCESS_ZERO_BASED (a memory-window bind flag).
func mrAccessFlags(a verbs.Access) uint32 { return accessFlags(a) }

// qpState maps verbs QP states to ibv_qp_state and back.
func qpState(s verbs.QPState) uint32 {
	switch s {
	case verbs.StateInit:
		return ibvQPSInit
	case verbs.StateRTR:
		return ibvQPSRTR
	case verbs.StateRTS:
		return ibvQPSRTS
	case verbs.StateErr:
		return ibvQPSErr
	}
	return ibvQPSReset
}

// mtuEnum maps a path MTU in bytes to enum ibv_mtu: the largest IB MTU
// not above bytes (256..4096).
func mtuEnum(bytes int) (uint32, error) {
	if bytes < 256 {
		return 0, fmt.Errorf("%w: path MTU %d below 256", verbs.ErrInvalidArg, bytes)
	}
	e := uint32(ibvMTU256)
	for b := 512; b <= bytes && e < ibvMTU4096; b *= 2 {
		e++
	}
	return e, nil
}

// mtuBytes maps enum ibv_mtu to bytes (0 for an unknown value).
func mtuBytes(e uint32) int {
	if e < ibvMTU256 || e > ibvMTU4096 {
		return 0
	}
	return 256 << (e - ibvMTU256)
}

// ackTimeout maps a local ACK timeout to the IB timeout exponent t
// (4.096 us * 2^t): the smallest t whose timeout is at least d, within
// 1..30. Zero means the default, 14 (67 ms).
func ackTimeout(d time.Duration) uint8 {
	if d <= 0 {
		return 14
	}
	for t := uint8(1); t <= 30; t++ {
		if ibTimeout(t) >= d {
			return t
		}
	}
	return 30
}

// ibTimeout is the duration of IB timeout exponent t.
func ibTimeout(t uint8) time.Duration { return time.Duration(4096<<t) * time.Nanosecond }

// rnrTimers are the delays of the IB minimum RNR NAK timer codes 0..31
// (IBA table 45); code 0 is 655.36 ms.
var rnrTimers = [32]time.Duration{
	655360 * time.Microsecond, 10 * time.Microsecond, 20 * time.Microsecond, 30 * time.Microsecond,
	40 * time.Microsecond, 60 * time.Microsecond, 80 * time.Microsecond, 120 * time.Microsecond,
	160 * time.Microsecond, 240 * time.Microsecond, 320 * time.Microsecond, 480 * time.Microsecond,
	640 * time.Microsecond, 960 * time.Microsecond, 1280 * time.Microsecond, 1920 * time.Microsecond,
	2560 * time.Microsecond, 3840 * time.Microsecond, 5120 * time.Microsecond, 7680 * time.Microsecond,
	10240 * time.Microsecond, 15360 * time.Microsecond, 20480 * time.Microsecond, 30720 * time.Microsecond,
	40960 * time.Microsecond, 61440 * time.Microsecond, 81920 * time.Microsecond, 122880 * time.Microsecond,
	163840 * time.Microsecond, 245760 * time.Microsecond, 327680 * time.Microsecond, 491520 * time.Microsecond,
}

// rnrTimerCode maps a minimum RNR timer to the smallest IB code whose
// delay is at least d. Zero means the default, 12 (0.64 ms).
func rnrTimerCode(d time.Duration) uint8 {
	if d <= 0 {
		return 12
	}
	for c := 1; c < 32; c++ {
		if rnrTimers[c] >= d {
			return uint8(c)
		}
	}
	return 0 // the longest, 655 ms
}

// GID is a 128-bit InfiniBand global identifier; for RoCE it is the IPv6
// (or IPv4-mapped) address of the port's interface.
type GID [16]byte

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// IsZero reports whether g is unset.
func (g GID) IsZero() bool { return g == GID{} }

// IP is the address a RoCE GID stands for (IPv4 for an IPv4-mapped GID).
func (g GID) IP() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// GIDFromIP is the RoCE GID of an IP address: IPv4 addresses map to
// ::ffff:a.b.c.d, as rdma_cm and the kernel's RoCE GID table do.
func GIDFromIP(ip netip.Addr) GID { return GID(ip.As16()) }

// gidTypeName names an ibv_gid_type.
func gidTypeName(t uint32) string {
	switch t {
	case ibvGIDTypeIB:
		return "IB"
	case ibvGIDTypeRoCEv1:
		return "RoCEv1"
	case ibvGIDTypeRoCEv2:
		return "RoCEv2"
	}
	return fmt.Sprintf("type%d", t)
}

// linkLayerName names an IBV_LINK_LAYER value.
func linkLayerName(l uint8) string {
	switch l {
	case ibvLinkLayerInfiniBand, 0: // 0 (unspecified) is InfiniBand
		return "InfiniBand"
	case ibvLinkLayerEthernet:
		return "Ethernet"
	}
	return fmt.Sprintf("link%d", l)
}

// transportName names an ibv_transport_type as DeviceInfo.Transport does.
func transportName(t uint32) string {
	switch t {
	case ibvTransportIB:
		return "InfiniBand"
	case ibvTransportIWARP:
		return "iWARP"
	}
	return fmt.Sprintf("transport%d", t)
}

// portStateName names an ibv_port_state.
func portStateName(s uint32) string {
	switch s {
	case 1:
		return "DOWN"
	case 2:
		return "INIT"
	case 3:
		return "ARMED"
	case ibvPortActive:
		return "ACTIVE"
	case 5:
		return "ACTIVE_DEFER"
	}
	return "NOP"
}
