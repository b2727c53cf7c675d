package rdma

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/krfs/krfs/verbs"
)

// The rules RDMA hardware (mlx5, the kernel's uverbs) applies that the
// backend must follow or check before a call reaches the kernel, as pure
// functions so that they are tested without a device.

// mrIOVA is the IOVA a buffer at addr is registered at: its offset in its
// page. The kernel's ib_uverbs_reg_mr refuses (EINVAL) an IOVA that
// differs from the address within the page, so IOVA 0 (a zero-based MR)
// is possible only for a page-aligned buffer; malloc'd and Go memory is
// not page-aligned in general.
func mrIOVA(addr uintptr, page int) uint64 { return uint64(addr % uintptr(page)) }

// kernelAcceptsIOVA is the kernel's rule for ibv_reg_mr_iova: address and
// IOVA agree within the page.
func kernelAcceptsIOVA(addr uintptr, iova uint64, page int) bool {
	return uint64(addr)%uint64(page) == iova%uint64(page)
}

// rawWC is a completion as ibv_poll_cq left it in the poll array (struct
// krfs_wc).
type rawWC struct {
	wrID                                                         uint64
	status, opcode, qpNum, srcQP, byteLen, imm, flags, vendorErr uint32
}

// decodeWC turns a completion polled from a CQ's receive half (recv) or
// send half into a verbs.WC. Of an error completion only wr_id, status,
// qp_num and vendor_err are valid: mlx5_parse_cqe writes nothing else on
// its error path, so the rest of the poll array's entry holds what an
// earlier completion left there. The decoding reads those fields only on
// success, and tells a receive from a send by the CQ half it came from,
// never by the opcode.
func decodeWC(w *rawWC, recv bool) verbs.WC {
	st, why := wcStatus(w.status, recv)
	wc := verbs.WC{ID: w.wrID, Status: st, Reason: why, QPN: w.qpNum}
	if st != verbs.StatusSuccess {
		wc.VendorErr = w.vendorErr
		return wc
	}
	hasImm := w.flags&ibvWCWithImm != 0
	wc.Op = wcOpcode(w.opcode, hasImm)
	wc.ByteLen = w.byteLen
	if hasImm {
		wc.Imm, wc.HasImm = w.imm, true
	}
	if recv {
		wc.SrcQPN = w.srcQP
		if wc.Op != verbs.OpRecvWriteImm {
			wc.Op = verbs.OpRecv
		}
	}
	return wc
}

// qpIndex finds a device's QPs by the number completions and events
// carry. A DCT has no number until RTR (mlx5 assigns it in INIT->RTR;
// rdma-core then sets ibv_qp.qp_num from the kernel's answer), so it is
// added only then; number 0 is never indexed.
type qpIndex[Q comparable] struct{ m map[uint32]Q }

func (x *qpIndex[Q]) add(num uint32, q Q) error {
	if num == 0 {
		return fmt.Errorf("%w: QP number 0", verbs.ErrInvalidArg)
	}
	if x.m == nil {
		x.m = map[uint32]Q{}
	}
	x.m[num] = q
	return nil
}

func (x *qpIndex[Q]) get(num uint32) (Q, bool) {
	q, ok := x.m[num]
	return q, ok
}

// remove drops num if it still names q.
func (x *qpIndex[Q]) remove(num uint32, q Q) {
	if cur, ok := x.m[num]; ok && cur == q {
		delete(x.m, num)
	}
}

func (x *qpIndex[Q]) len() int { return len(x.m) }

// all returns every indexed QP and empties the index.
func (x *qpIndex[Q]) takeAll() []Q {
	out := make([]Q, 0, len(x.m))
	for _, q := range x.m {
		out = append(out, q)
	}
	x.m = nil
	return out
}

// list returns every indexed QP.
func (x *qpIndex[Q]) list() []Q {
	out := make([]Q, 0, len(x.m))
	for _, q := range x.m {
		out = append(out, q)
	}
	return out
}

// checkModify validates a transition before it reaches the kernel: the
// transition table of the QP type (verbs.ValidTransition: a DCT moves only
// RESET->INIT->RTR, a DCI cannot go RESET->ERR), the retry counts, what
// RTS->RTS cannot change, a path MTU the port cannot carry (256..maxMTU),
// and remote atomic access on a device without atomics (mlx5 fails it
// with EOPNOTSUPP at INIT).
func checkModify(typ verbs.QPType, from verbs.QPState, a *verbs.QPAttr, atomics verbs.AtomicCap, maxMTU int) error {
	if !verbs.ValidTransition(typ, from, a.State) {
		return fmt.Errorf("%w: %v -> %v on a %v QP", verbs.ErrTransition, from, a.State, typ)
	}
	if from == verbs.StateRTS && a.State == verbs.StateRTS && (a.Timeout != 0 || a.RetryCnt != 0 || a.RNRRetry != 0 || a.Mask != 0) {
		return fmt.Errorf("%w: hardware cannot change timeouts or retry counts in RTS (IBA RTS->RTS)", verbs.ErrInvalidArg)
	}
	if a.RetryCnt < 0 || a.RetryCnt > 7 || a.RNRRetry < 0 || a.RNRRetry > 7 {
		return fmt.Errorf("%w: retry counts are 0..7", verbs.ErrInvalidArg)
	}
	if a.PathMTU != 0 && (a.PathMTU < 256 || a.PathMTU > maxMTU) {
		return fmt.Errorf("%w: path MTU %d outside [256, %d]", verbs.ErrInvalidArg, a.PathMTU, maxMTU)
	}
	if a.State == verbs.StateInit && typ != verbs.DCI && a.Access&verbs.AccessRemoteAtomic != 0 && atomics == verbs.AtomicNone {
		return fmt.Errorf("%w: remote atomic access on a device without atomics (atomic_cap NONE)", verbs.ErrNotSupported)
	}
	return nil
}

// atomicCap maps ibv_device_attr.atomic_cap.
func atomicCap(c uint32) verbs.AtomicCap {
	switch c {
	case ibvAtomicHCA:
		return verbs.AtomicHCA
	case ibvAtomicGlob:
		return verbs.AtomicGlob
	}
	return verbs.AtomicNone
}

// defaultAccess is the remote access a passively connected QP grants when
// none was set on it: read and write, and atomics if the device has them.
func defaultAccess(c verbs.AtomicCap) verbs.Access {
	if c == verbs.AtomicNone {
		return verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	}
	return verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
}

// checkSRQDepth refuses an SRQ deeper than the device's max_srq_wr (about
// 32K on mlx5, where the verbs default bound of 65,536 fails in the
// kernel).
func checkSRQDepth(depth, max int) error {
	if depth < 1 || depth > max {
		return fmt.Errorf("%w: SRQ depth %d (1..%d, the device's max_srq_wr)", verbs.ErrInvalidArg, depth, max)
	}
	return nil
}

// QoS is the quality of service of every QP and address handle a device
// makes (their address vectors' GRH and SL).
type QoS struct {
	// TrafficClass is the GRH traffic class: on RoCEv2 the IP header's
	// DS field, DSCP<<2 with the two ECN bits (set by the NIC) zero, so
	// DSCP 26 is 104. PFC fabrics map a DSCP to the lossless priority.
	TrafficClass int
	// SL is the service level (InfiniBand; on RoCE some drivers map it to
	// the VLAN priority). 0..15.
	SL int
	// HopLimit is the GRH hop limit (RoCEv2: the IP TTL); 0 means 64.
	HopLimit int
}

func (q QoS) validate() error {
	switch {
	case q.TrafficClass < 0 || q.TrafficClass > 255:
		return fmt.Errorf("%w: traffic class %d (0..255)", verbs.ErrInvalidArg, q.TrafficClass)
	case q.SL < 0 || q.SL > 15:
		return fmt.Errorf("%w: service level %d (0..15)", verbs.ErrInvalidArg, q.SL)
	case q.HopLimit < 0 || q.HopLimit > 255:
		return fmt.Errorf("%w: hop limit %d (1..255, 0 for 64)", verbs.ErrInvalidArg, q.HopLimit)
	}
	return nil
}

// hopLimit is the hop limit to put in a GRH.
func (q QoS) hopLimit() uint8 {
	if q.HopLimit == 0 {
		return 64
	}
	return uint8(q.HopLimit)
}

// Ports of the connection manager.
const (
	// DefaultCMPort is the connection manager's UDP port when Config.CMAddr
	// names none: a fixed port, so that peers can name a node (and its
	// embedded meta service) by its GID's IP alone.
	DefaultCMPort = 4792
	// RoCEv2Port is the UDP port of RoCEv2. A RoCE NIC takes every
	// datagram to it for itself, so the connection manager never listens
	// there.
	RoCEv2Port = 4791
)

// cmListenAddr is the address the connection manager binds, from
// Config.CMAddr and the chosen GID: empty means the GID's IP (RoCE) or
// every interface (InfiniBand) at DefaultCMPort; a host left out or
// unspecified (":7000", "0.0.0.0:7000") means the GID's IP on RoCE; port
// 0 picks a free port. Port 4791 is refused: the NIC owns it.
func cmListenAddr(cfg string, gid GID, ib bool) (string, error) {
	host, port := "", strconv.Itoa(DefaultCMPort)
	if cfg != "" {
		h, p, err := net.SplitHostPort(cfg)
		if err != nil {
			return "", fmt.Errorf("%w: connection-manager address %q: %v", verbs.ErrInvalidArg, cfg, err)
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 65535 {
			return "", fmt.Errorf("%w: connection-manager address %q: bad port", verbs.ErrInvalidArg, cfg)
		}
		if n == RoCEv2Port {
			return "", fmt.Errorf("%w: connection-manager address %q: UDP port %d is RoCEv2's, which the NIC takes for itself; pick another port (default %d)",
				verbs.ErrInvalidArg, cfg, RoCEv2Port, DefaultCMPort)
		}
		host, port = h, p
		if a, err := netip.ParseAddr(h); err == nil && a.IsUnspecified() {
			host = ""
		}
	}
	if host == "" && !ib {
		host = gid.IP().String()
	}
	return net.JoinHostPort(host, port), nil
}

// pickPort chooses the device and port cfg asks for. A device that could
// not be opened or cannot register MRs at their page offset, and an iWARP
// device, are skipped when the choice is free and refused, saying why,
// when named. An explicit port must be usable: a DOWN port is refused with
// its state instead of being opened.
func pickPort(devs []DeviceInfo, cfg Config) (*DeviceInfo, PortInfo, error) {
	var why []string
	for i := range devs {
		d := &devs[i]
		if cfg.Device != "" && d.Name != cfg.Device {
			continue
		}
		if bad := d.unusable(); bad != "" {
			why = append(why, d.Name+": "+bad)
			continue
		}
		for _, p := range d.Ports {
			switch {
			case cfg.Port != 0 && p.Num != cfg.Port:
			case p.Usable():
				return d, p, nil
			case cfg.Port != 0:
				why = append(why, fmt.Sprintf("%s port %d is %s (%s)", d.Name, p.Num, p.State, p.whyUnusable()))
			}
		}
	}
	msg := fmt.Sprintf("no usable port matches device %q port %d (see krfs devices)", cfg.Device, cfg.Port)
	if len(why) > 0 {
		msg = fmt.Sprintf("%s: %v", msg, why)
	}
	return nil, PortInfo{}, fmt.Errorf("%w: %s", ErrNoDevice, msg)
}

// invalidatesTarget reports whether a DCI's error completion with status
// st suggests that the target moved (its port or GID changed after a
// restart elsewhere), so that its cached address handle and CM answer
// must be looked up again.
func invalidatesTarget(st verbs.Status) bool { return st == verbs.StatusRetryExcErr }

// eventObject says what an async event names.
type eventObject uint8

const (
	eventNone eventObject = iota
	eventQP
	eventCQ
	eventSRQ
	eventPort
	eventDevice
)

// eventOf maps an ibv_event_type to the verbs event and the object it
// names; events krfs does not report map to 0.
func eventOf(t uint32) (verbs.EventType, eventObject) {
	switch t {
	case ibvEventQPFatal:
		return verbs.EventQPFatal, eventQP
	case ibvEventQPReqErr:
		return verbs.EventQPReqErr, eventQP
	case ibvEventQPAccessErr:
		return verbs.EventQPAccessErr, eventQP
	case ibvEventQPLastWQEReached:
		return verbs.EventQPLastWQE, eventQP
	case ibvEventCQErr:
		return verbs.EventCQErr, eventCQ
	case ibvEventSRQLimitReached:
		return verbs.EventSRQLimit, eventSRQ
	case ibvEventSRQErr:
		return verbs.EventSRQErr, eventSRQ
	case ibvEventPortActive:
		return verbs.EventPortActive, eventPort
	case ibvEventPortErr:
		return verbs.EventPortErr, eventPort
	case ibvEventDeviceFatal:
		return verbs.EventDeviceFatal, eventDevice
	}
	return 0, eventNone
}
