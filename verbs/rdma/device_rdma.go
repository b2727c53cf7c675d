//go:build rdma && linux && cgo

package rdma

/*
#cgo LDFLAGS: -libverbs -lmlx5
#include "ibv.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/internal/eventq"
)

// Built reports whether this binary has the libibverbs backend.
const Built = true

// Devices lists the RDMA devices libibverbs sees, their ports, GIDs and
// whether they offer DC. No device is not an error: the list is empty. A
// device that cannot be opened or queried is listed with its error
// (DeviceInfo.Err), not allowed to hide the others.
func Devices() ([]DeviceInfo, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		if errors.Is(err, syscall.ENOSYS) {
			return nil, nil // the kernel has no RDMA support: no devices
		}
		return nil, fmt.Errorf("rdma: ibv_get_device_list: %v", err)
	}
	defer C.ibv_free_device_list(list)
	var out []DeviceInfo
	for _, dev := range unsafe.Slice(list, int(n)) {
		info, err := describe(dev)
		if err != nil {
			info.Err = err.Error()
		}
		out = append(out, info)
	}
	return out, nil
}

func describe(dev *C.struct_ibv_device) (DeviceInfo, error) {
	info := DeviceInfo{Name: C.GoString(C.ibv_get_device_name(dev)), Transport: transportName(uint32(dev.transport_type))}
	ctx, err := C.ibv_open_device(dev)
	if ctx == nil {
		return info, fmt.Errorf("rdma: ibv_open_device(%s): %v", info.Name, err)
	}
	defer C.ibv_close_device(ctx)
	var da C.struct_ibv_device_attr
	if rc := C.ibv_query_device(ctx, &da); rc != 0 {
		return info, fmt.Errorf("rdma: ibv_query_device(%s): %v", info.Name, syscall.Errno(rc))
	}
	info.FW = C.GoString(&da.fw_ver[0])
	guid := uint64(C.ibv_get_device_guid(dev))
	info.NodeGUID = fmt.Sprintf("%016x", beSwap64(guid))
	info.VendorID, info.PartID = uint32(da.vendor_id), uint32(da.vendor_part_id)
	info.Atomic = atomicCap(uint32(da.atomic_cap))
	info.MaxSRQWR, info.MaxCQE, info.MaxQPWR = int(da.max_srq_wr), int(da.max_cqe), int(da.max_qp_wr)
	for p := 1; p <= int(da.phys_port_cnt); p++ {
		pi, err := queryPort(ctx, p)
		if err != nil {
			return info, fmt.Errorf("rdma: %s port %d: %w", info.Name, p, err)
		}
		info.Ports = append(info.Ports, pi)
	}
	info.DC, info.DCNote, info.IOVA = probe(ctx)
	return info, nil
}

func beSwap64(v uint64) uint64 {
	var r uint64
	for range 8 {
		r = r<<8 | v&0xff
		v >>= 8
	}
	return r
}

func queryPort(ctx *C.struct_ibv_context, port int) (PortInfo, error) {
	var pa C.struct_ibv_port_attr
	if rc := C.krfs_query_port(ctx, C.uint8_t(port), &pa); rc != 0 {
		return PortInfo{}, fmt.Errorf("ibv_query_port: %v", syscall.Errno(rc))
	}
	pi := PortInfo{Num: port, State: portStateName(uint32(pa.state)), LinkLayer: linkLayerName(uint8(pa.link_layer)),
		LID: uint16(pa.lid), ActiveMTU: mtuBytes(uint32(pa.active_mtu))}
	for i := 0; i < int(pa.gid_tbl_len); i++ {
		var gid GID
		var typ, ifindex C.uint32_t
		if C.krfs_query_gid(ctx, C.uint32_t(port), C.uint32_t(i), (*C.uint8_t)(unsafe.Pointer(&gid[0])), &typ, &ifindex) != 0 {
			continue // an empty GID table entry
		}
		if gid.IsZero() {
			continue
		}
		g := GIDInfo{Index: i, GID: gid, Type: gidTypeName(uint32(typ))}
		if ifi, err := net.InterfaceByIndex(int(ifindex)); err == nil && ifindex != 0 {
			g.NetDev = ifi.Name
		}
		pi.GIDs = append(pi.GIDs, g)
	}
	return pi, nil
}

// probe checks for DC (a DCI without atomics can be created) and for MR
// registration as RegMR does it (a page at IOVA 0, a buffer 80 bytes into
// a page at IOVA 80; remote write access needs local write).
func probe(ctx *C.struct_ibv_context) (dc bool, note string, iova bool) {
	pd := C.ibv_alloc_pd(ctx)
	if pd == nil {
		return false, "cannot allocate a protection domain", false
	}
	defer C.ibv_dealloc_pd(pd)
	iova = C.krfs_probe_mr(pd, C.int(accessFlags(verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite))) == 0
	cq := C.ibv_create_cq(ctx, 1, nil, nil, 0)
	if cq == nil {
		return false, "cannot create a CQ", iova
	}
	defer C.ibv_destroy_cq(cq)
	switch rc := C.krfs_probe_dc(ctx, pd, cq); rc {
	case 0:
		return true, "", iova
	case -1:
		return false, "not an mlx5 device", iova
	case C.EOPNOTSUPP:
		return false, "mlx5 refused a DCI (EOPNOTSUPP): no DC in this device or firmware (ConnectX-4 Lx has none)", iova
	default:
		return false, fmt.Sprintf("mlx5 refused a DCI: %v", syscall.Errno(rc)), iova
	}
}

// Device is an RDMA device port opened for krfs. It implements
// verbs.Device.
type Device struct {
	ctx      *C.struct_ibv_context
	name     string
	port     uint8
	gidIndex int
	gid      GID
	lid      uint16
	ib       bool // InfiniBand link layer (else RoCE)
	mtu      int
	dc       bool
	dcNote   string
	attr     verbs.DeviceAttr
	qos      QoS
	cm       *cmConn
	events   eventq.Queue
	evWake   int           // eventfd that stops the async event goroutine
	evDone   chan struct{} // closed when it stopped

	mu     sync.RWMutex // guards the fields below
	closed bool
	qps    qpIndex[*qp] // by number: a DCT only from RTR on
	pds    []*pd
	cqs    []*cq
	mrs    int
	mrB    uint64
}

var _ verbs.Device = (*Device)(nil)

// Open opens a device port. With no device it fails at once with
// ErrNoDevice.
func Open(cfg Config) (*Device, error) {
	if err := cfg.QoS.validate(); err != nil {
		return nil, err
	}
	devs, err := Devices()
	if err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		return nil, ErrNoDevice
	}
	pick, port, err := pickPort(devs, cfg)
	if err != nil {
		return nil, err
	}
	var gi GIDInfo
	if cfg.GIDIndex < 0 {
		var ok bool
		if gi, ok = port.DefaultGID(); !ok && port.LinkLayer != "InfiniBand" {
			return nil, fmt.Errorf("rdma: %s port %d has no RoCEv2 GID", pick.Name, port.Num)
		}
	} else {
		found := false
		for _, g := range port.GIDs {
			if g.Index == cfg.GIDIndex {
				gi, found = g, true
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: %s port %d has no GID at index %d", verbs.ErrInvalidArg, pick.Name, port.Num, cfg.GIDIndex)
		}
	}
	ib := port.LinkLayer == "InfiniBand"
	addr, err := cmListenAddr(cfg.CMAddr, gi.GID, ib)
	if err != nil {
		return nil, err
	}
	ctx, err := openByName(pick.Name)
	if err != nil {
		return nil, err
	}
	d := &Device{ctx: ctx, name: pick.Name, port: uint8(port.Num), gidIndex: gi.Index, gid: gi.GID, lid: port.LID,
		ib: ib, mtu: port.ActiveMTU, dc: pick.DC, dcNote: pick.DCNote, qos: cfg.QoS,
		attr: verbs.DeviceAttr{Atomic: pick.Atomic, MaxSRQWR: pick.MaxSRQWR, MaxCQE: pick.MaxCQE, MaxQPWR: pick.MaxQPWR}}
	if d.mtu == 0 {
		d.mtu = 1024
	}
	if d.cm, err = listenCM(d, addr); err != nil {
		C.ibv_close_device(ctx)
		return nil, err
	}
	if err := d.startEvents(); err != nil {
		d.cm.close()
		C.ibv_close_device(ctx)
		return nil, err
	}
	return d, nil
}

func openByName(name string) (*C.struct_ibv_context, error) {
	var n C.int
	list := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, ErrNoDevice
	}
	defer C.ibv_free_device_list(list)
	for _, dev := range unsafe.Slice(list, int(n)) {
		if C.GoString(C.ibv_get_device_name(dev)) == name {
			ctx, err := C.ibv_open_device(dev)
			if ctx == nil {
				return nil, fmt.Errorf("rdma: ibv_open_device(%s): %v", name, err)
			}
			return ctx, nil
		}
	}
	return nil, fmt.Errorf("%w: %s disappeared", ErrNoDevice, name)
}

// Caps describes what the opened port offers.
func (d *Device) Caps() Caps {
	ll := "Ethernet"
	if d.ib {
		ll = "InfiniBand"
	}
	return Caps{Name: d.name, Port: int(d.port), GIDIndex: d.gidIndex, GID: d.gid, LID: d.lid, LinkLayer: ll,
		MTU: d.mtu, DC: d.dc, DCNote: d.dcNote, Atomic: d.attr.Atomic, QoS: d.qos}
}

// Attr implements verbs.Device: what ibv_query_device reported.
func (d *Device) Attr() verbs.DeviceAttr { return d.attr }

// OnEvent implements verbs.Device.
func (d *Device) OnEvent(fn func(verbs.Event)) (cancel func()) { return d.events.Subscribe(fn) }

// startEvents starts the goroutine that reads the context's asynchronous
// events (its async fd, made non-blocking, and an eventfd to stop it).
func (d *Device) startEvents() error {
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("rdma: eventfd: %w", err)
	}
	if err := unix.SetNonblock(int(d.ctx.async_fd), true); err != nil {
		unix.Close(wake)
		return fmt.Errorf("rdma: async event fd: %w", err)
	}
	d.evWake, d.evDone = wake, make(chan struct{})
	go d.readEvents()
	return nil
}

// readEvents turns the context's asynchronous events into verbs events:
// a QP, CQ or SRQ event names the object of this device it is about; a
// QP error moves the QP's state to ERR, as the NIC did.
func (d *Device) readEvents() {
	defer close(d.evDone)
	fds := []unix.PollFd{{Fd: int32(d.ctx.async_fd), Events: unix.POLLIN}, {Fd: int32(d.evWake), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		var raw C.struct_krfs_event
		for C.krfs_get_event(d.ctx, &raw) == 0 {
			if ev, ok := d.event(&raw); ok {
				d.events.Raise(ev)
			}
		}
	}
}

// event maps a raw async event to a verbs event about this device's
// objects (false for one krfs does not report, or whose object is gone).
func (d *Device) event(raw *C.struct_krfs_event) (verbs.Event, bool) {
	typ, obj := eventOf(uint32(raw._type))
	ev := verbs.Event{Type: typ}
	switch obj {
	case eventQP:
		q := d.qpByNum(uint32(raw.qp_num))
		if q == nil {
			return ev, false
		}
		if typ.IsQPError() {
			q.mu.Lock()
			q.state = verbs.StateErr
			q.mu.Unlock()
		}
		ev.QP = q
	case eventCQ:
		c := d.cqByAddr(uint64(raw.cq))
		if c == nil {
			return ev, false
		}
		ev.CQ = c
	case eventSRQ:
		s := d.srqByAddr(uint64(raw.srq))
		if s == nil {
			return ev, false
		}
		ev.SRQ = s
	case eventPort:
		if uint8(raw.port) != d.port {
			return ev, false
		}
		ev.Port = int(raw.port)
	case eventDevice:
	default:
		return ev, false
	}
	return ev, true
}

// cqByAddr finds the CQ one of whose halves is at addr.
func (d *Device) cqByAddr(addr uint64) *cq {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, c := range d.cqs {
		if uint64(uintptr(unsafe.Pointer(c.send))) == addr || uint64(uintptr(unsafe.Pointer(c.recv))) == addr {
			return c
		}
	}
	return nil
}

// srqByAddr finds the SRQ at addr.
func (d *Device) srqByAddr(addr uint64) *srq {
	d.mu.RLock()
	pds := d.pds
	d.mu.RUnlock()
	for _, p := range pds {
		p.mu.Lock()
		for _, s := range p.srqs {
			if uint64(uintptr(unsafe.Pointer(s.srq))) == addr {
				p.mu.Unlock()
				return s
			}
		}
		p.mu.Unlock()
	}
	return nil
}

// Addr is the device's connection-manager address.
func (d *Device) Addr() netip.AddrPort { return d.cm.addr }

// MaxMTU is the port's active MTU.
func (d *Device) MaxMTU() int { return d.mtu }

func (d *Device) localPort() (GID, uint16, uint8) { return d.gid, d.lid, d.port }
func (d *Device) maxMTU() int                     { return d.mtu }

func (d *Device) ListenRC(service uint32, accept verbs.AcceptFunc) error {
	return d.cm.listen(service, accept)
}

func (d *Device) StopListenRC(service uint32) error { return d.cm.stopListen(service) }

func (d *Device) ConnectRC(ctx context.Context, q verbs.QP, remote netip.AddrPort, service uint32, p verbs.ConnParams) ([]byte, error) {
	return d.cm.connect(ctx, q, remote, service, p)
}

func (d *Device) ownRC(vq verbs.QP) error {
	q, ok := vq.(*qp)
	if !ok || q.pd.dev != d || q.typ != verbs.RC {
		return fmt.Errorf("%w: the connection manager needs an RC QP of this device", verbs.ErrInvalidArg)
	}
	if s := q.State(); s != verbs.StateReset {
		return fmt.Errorf("%w: connecting a QP in %v, want RESET", verbs.ErrQPState, s)
	}
	return nil
}

func (d *Device) bringUp(vq verbs.QP, peer endpoint, sqPSN uint32, p verbs.ConnParams) error {
	q := vq.(*qp)
	access := p.Access
	if access == 0 {
		q.mu.Lock()
		access = q.access
		q.mu.Unlock()
		if access == 0 {
			access = defaultAccess(d.attr.Atomic)
		}
	}
	steps := []verbs.QPAttr{
		{State: verbs.StateInit, Access: access},
		{State: verbs.StateRTR, RemoteAddr: peer.Addr, RemoteQPN: peer.QPN, RQPSN: peer.PSN, PathMTU: peer.MTU},
		{State: verbs.StateRTS, SQPSN: sqPSN, Timeout: p.Timeout, RetryCnt: p.RetryCnt, RNRRetry: p.RNRRetry},
	}
	for _, a := range steps {
		if err := q.modify(a, &peer); err != nil {
			_ = q.Modify(verbs.QPAttr{State: verbs.StateReset})
			return err
		}
	}
	return nil
}

func (d *Device) AllocPD() (verbs.PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	p, err := C.ibv_alloc_pd(d.ctx)
	if p == nil {
		return nil, fmt.Errorf("rdma: ibv_alloc_pd: %v", err)
	}
	x := &pd{dev: d, pd: p, ahs: map[netip.AddrPort]*C.struct_ibv_ah{}}
	d.pds = append(d.pds, x)
	return x, nil
}

func (d *Device) Stats() verbs.DeviceStats {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return verbs.DeviceStats{QPs: d.qps.len(), MRs: d.mrs, MRBytes: d.mrB}
}

func (d *Device) QPs() []verbs.QPInfo {
	d.mu.RLock()
	qs := d.qps.list()
	d.mu.RUnlock()
	out := make([]verbs.QPInfo, 0, len(qs))
	for _, q := range qs {
		out = append(out, q.Info())
	}
	return out
}

// Close destroys every object of the device and closes it.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	qs := d.qps.takeAll()
	pds, cqs := d.pds, d.cqs
	d.mu.Unlock()
	err := d.cm.close()
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(d.evWake, one[:])
	<-d.evDone
	unix.Close(d.evWake)
	d.events.Close()
	for _, q := range qs {
		q.destroy()
	}
	for _, p := range pds {
		p.close()
	}
	for _, c := range cqs {
		_ = c.Destroy()
	}
	for _, p := range pds {
		C.ibv_dealloc_pd(p.pd)
	}
	C.ibv_close_device(d.ctx)
	return err
}

func (d *Device) qpByNum(n uint32) *qp {
	d.mu.RLock()
	defer d.mu.RUnlock()
	q, _ := d.qps.get(n)
	return q
}

// pd is a protection domain with its MRs, SRQs and address handles.
type pd struct {
	dev *Device
	pd  *C.struct_ibv_pd

	mu      sync.Mutex // guards the fields below
	mrs     map[*mr]struct{}
	srqs    []*srq
	ahs     map[netip.AddrPort]*C.struct_ibv_ah
	retired []*C.struct_ibv_ah // invalidated, destroyed at close (posted WRs may still name them)
}

func (p *pd) Device() verbs.Device { return p.dev }

func (p *pd) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for m := range p.mrs {
		m.deregLocked()
	}
	for _, s := range p.srqs {
		s.destroy()
	}
	for _, ah := range p.ahs {
		C.ibv_destroy_ah(ah)
	}
	for _, ah := range p.retired {
		C.ibv_destroy_ah(ah)
	}
	p.ahs, p.retired = nil, nil
}

// forgetTarget drops the address handle and the CM's answer for a DC
// target whose WR failed with a retry error: the peer may have come back
// on another port or GID, so the next WR to it resolves it again.
func (p *pd) forgetTarget(addr netip.AddrPort) {
	p.mu.Lock()
	if ah := p.ahs[addr]; ah != nil {
		delete(p.ahs, addr)
		p.retired = append(p.retired, ah)
	}
	p.mu.Unlock()
	p.dev.cm.forget(addr)
}

// ah returns the address handle for a DC target's CM address, resolving
// its GID and LID on first use (a round trip to its CM, at most 1 s).
func (p *pd) ah(addr netip.AddrPort) (*C.struct_ibv_ah, error) {
	p.mu.Lock()
	ah := p.ahs[addr]
	p.mu.Unlock()
	if ah != nil {
		return ah, nil
	}
	e, err := p.dev.cm.resolve(context.Background(), addr)
	if err != nil {
		return nil, err
	}
	m := p.dev.avFor(e)
	ah, cerr := C.krfs_create_ah(p.pd, &m)
	if ah == nil {
		return nil, fmt.Errorf("rdma: ibv_create_ah for %v (gid %v lid %d): %v", addr, e.GID, e.LID, cerr)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.ahs[addr]; old != nil {
		C.ibv_destroy_ah(ah)
		return old, nil
	}
	p.ahs[addr] = ah
	return ah, nil
}

// avFor fills the address vector fields of a krfs_mod for a peer port.
func (d *Device) avFor(e endpoint) C.struct_krfs_mod {
	var m C.struct_krfs_mod
	m.port = C.uint8_t(d.port)
	m.dlid = C.uint16_t(e.LID)
	d.setQoS(&m)
	if !d.ib { // RoCE: routed by GID (RoCEv2: UDP/IP)
		m.is_global = 1
		m.sgid_index = C.uint8_t(d.gidIndex)
		for i, b := range e.GID {
			m.dgid[i] = C.uint8_t(b)
		}
	}
	return m
}

// setQoS puts the device's traffic class, service level and hop limit
// into an address vector.
func (d *Device) setQoS(m *C.struct_krfs_mod) {
	m.traffic_class = C.uint8_t(d.qos.TrafficClass)
	m.sl = C.uint8_t(d.qos.SL)
	m.hop_limit = C.uint8_t(d.qos.hopLimit())
}

// mr is a memory region over pinned Go memory, registered at its page
// offset (mrIOVA).
type mr struct {
	st     mrState
	p      *pd
	mr     *C.struct_ibv_mr
	pinner runtime.Pinner
}

func (m *mr) state() *mrState      { return &m.st }
func (m *mr) Buf() []byte          { return m.st.buf }
func (m *mr) IOVA() uint64         { return m.st.iova }
func (m *mr) LKey() uint32         { return m.st.lkey }
func (m *mr) RKey() uint32         { return m.st.rkey }
func (m *mr) Access() verbs.Access { return m.st.access }
func (m *mr) PD() verbs.PD         { return m.p }

func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("%w: empty buffer", verbs.ErrLength)
	}
	if access&^verbs.AccessAll != 0 {
		return nil, fmt.Errorf("%w: unknown access flags %#x", verbs.ErrInvalidArg, uint8(access))
	}
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write or atomic access requires local write", verbs.ErrInvalidArg)
	}
	addr := uintptr(unsafe.Pointer(&buf[0]))
	m := &mr{p: p, st: mrState{buf: buf, iova: mrIOVA(addr, verbs.PageSize), access: access, pd: p}}
	// The NIC keeps the address: pin the memory for the MR's lifetime.
	m.pinner.Pin(&buf[0])
	cm, err := C.krfs_reg_mr(p.pd, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), C.uint64_t(m.st.iova), C.int(mrAccessFlags(access)))
	if cm == nil {
		m.pinner.Unpin()
		return nil, fmt.Errorf("rdma: ibv_reg_mr_iova(%d bytes, iova %d): %v", len(buf), m.st.iova, err)
	}
	m.mr = cm
	m.st.lkey, m.st.rkey = uint32(cm.lkey), uint32(cm.rkey)
	p.mu.Lock()
	if p.mrs == nil {
		p.mrs = map[*mr]struct{}{}
	}
	p.mrs[m] = struct{}{}
	p.mu.Unlock()
	p.dev.mu.Lock()
	p.dev.mrs++
	p.dev.mrB += uint64(len(buf))
	p.dev.mu.Unlock()
	return m, nil
}

func (m *mr) Dereg() error {
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	if m.st.dead.Load() {
		return fmt.Errorf("%w: MR rkey %#x", verbs.ErrMRDead, m.st.rkey)
	}
	m.deregLocked()
	delete(m.p.mrs, m)
	return nil
}

func (m *mr) deregLocked() {
	if m.st.dead.Swap(true) {
		return
	}
	C.ibv_dereg_mr(m.mr)
	m.pinner.Unpin()
	d := m.p.dev
	d.mu.Lock()
	d.mrs--
	d.mrB -= uint64(len(m.st.buf))
	d.mu.Unlock()
}

// cq is a completion queue: two NIC CQs, one for send completions and one
// for receive completions, sharing a completion channel. An error
// completion has no valid opcode (mlx5 writes only wr_id, status, qp_num
// and vendor_err on the error path), so the half it came from is what says
// whether it completes a send or a receive. A goroutine waits on the
// channel's file descriptor (poll(2), not a blocked C call) and signals
// Notify; Poll and Wait read both halves.
type cq struct {
	dev   *Device
	send  *C.struct_ibv_cq // send completions of the QPs using this CQ as send CQ
	recv  *C.struct_ibv_cq // receive completions of the QPs using it as receive CQ
	ch    *C.struct_ibv_comp_channel
	wake  int // eventfd that stops the event goroutine
	note  chan struct{}
	done  chan struct{}
	depth int

	mu      sync.Mutex // guards the fields below
	pending []verbs.WC // polled from the NIC, not yet returned
	raw     []C.struct_krfs_wc
	dead    bool
}

func (d *Device) CreateCQ(depth int) (verbs.CQ, error) {
	if depth < 1 || depth > d.attr.MaxCQE {
		return nil, fmt.Errorf("%w: CQ depth %d (1..%d, the device's max_cqe)", verbs.ErrInvalidArg, depth, d.attr.MaxCQE)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	ch, err := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		return nil, fmt.Errorf("rdma: ibv_create_comp_channel: %v", err)
	}
	x := &cq{dev: d, ch: ch, note: make(chan struct{}, 1), done: make(chan struct{}), depth: depth, raw: make([]C.struct_krfs_wc, 64)}
	fail := func(err error) (verbs.CQ, error) {
		if x.send != nil {
			C.ibv_destroy_cq(x.send)
		}
		if x.recv != nil {
			C.ibv_destroy_cq(x.recv)
		}
		C.ibv_destroy_comp_channel(ch)
		return nil, err
	}
	if x.send, err = C.ibv_create_cq(d.ctx, C.int(depth), nil, ch, 0); x.send == nil {
		return fail(fmt.Errorf("rdma: ibv_create_cq(%d): %v", depth, err))
	}
	if x.recv, err = C.ibv_create_cq(d.ctx, C.int(depth), nil, ch, 0); x.recv == nil {
		return fail(fmt.Errorf("rdma: ibv_create_cq(%d): %v", depth, err))
	}
	wake, err2 := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err2 == nil {
		if err2 = unix.SetNonblock(int(ch.fd), true); err2 != nil {
			unix.Close(wake)
		}
	}
	if err2 != nil {
		return fail(fmt.Errorf("rdma: completion channel: %w", err2))
	}
	x.wake = wake
	C.krfs_req_notify(x.send)
	C.krfs_req_notify(x.recv)
	go x.events()
	d.cqs = append(d.cqs, x)
	return x, nil
}

// events turns completion-channel events into Notify signals.
func (c *cq) events() {
	defer close(c.done)
	fds := []unix.PollFd{{Fd: int32(c.ch.fd), Events: unix.POLLIN}, {Fd: int32(c.wake), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents == 0 {
			continue
		}
		var evCQ *C.struct_ibv_cq
		var evCtx unsafe.Pointer
		for C.ibv_get_cq_event(c.ch, &evCQ, &evCtx) == 0 {
			C.ibv_ack_cq_events(evCQ, 1)
			C.krfs_req_notify(evCQ)
		}
		// Re-armed: anything that arrived before is found by the next
		// Poll, which the signal prompts.
		c.signal()
	}
}

func (c *cq) signal() {
	select {
	case c.note <- struct{}{}:
	default:
	}
}

// fillLocked moves NIC completions of both halves into pending.
func (c *cq) fillLocked() {
	c.fillHalfLocked(c.recv, true)
	c.fillHalfLocked(c.send, false)
}

func (c *cq) fillHalfLocked(half *C.struct_ibv_cq, recv bool) {
	for {
		n := int(C.krfs_poll(half, &c.raw[0], C.int(len(c.raw))))
		if n <= 0 {
			return
		}
		for i := range n {
			w := &c.raw[i]
			raw := rawWC{wrID: uint64(w.wr_id), status: uint32(w.status), opcode: uint32(w.opcode), qpNum: uint32(w.qp_num),
				srcQP: uint32(w.src_qp), byteLen: uint32(w.byte_len), imm: uint32(w.imm), flags: uint32(w.wc_flags), vendorErr: uint32(w.vendor_err)}
			c.pending = append(c.pending, c.dev.translate(&raw, recv))
		}
		if n < len(c.raw) {
			return
		}
	}
}

func (c *cq) Poll(out []verbs.WC) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return 0
	}
	if len(c.pending) < len(out) {
		c.fillLocked()
	}
	k := copy(out, c.pending)
	c.pending = c.pending[:copy(c.pending, c.pending[k:])]
	if len(c.pending) > 0 {
		c.signal()
	}
	return k
}

func (c *cq) Wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			return verbs.ErrDestroyed
		}
		c.fillLocked()
		n := len(c.pending)
		c.mu.Unlock()
		if n > 0 {
			return nil
		}
		select {
		case <-c.note:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *cq) Notify() <-chan struct{} { return c.note }

func (c *cq) Destroy() error {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return fmt.Errorf("%w: CQ", verbs.ErrDestroyed)
	}
	c.dead = true
	c.mu.Unlock()
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(c.wake, one[:])
	<-c.done
	unix.Close(c.wake)
	c.signal()
	rc1, rc2 := C.ibv_destroy_cq(c.send), C.ibv_destroy_cq(c.recv)
	if rc1 != 0 || rc2 != 0 {
		return fmt.Errorf("rdma: ibv_destroy_cq: %v, %v (QPs still use it)", syscall.Errno(rc1), syscall.Errno(rc2))
	}
	C.ibv_destroy_comp_channel(c.ch)
	return nil
}

// translate turns a NIC completion from a CQ's receive half (recv) or send
// half into a verbs.WC (decodeWC), retiring send WRs, draining the SRQ's
// count and following the QP into ERR. Only the fields an error completion
// defines are read for one.
func (d *Device) translate(w *rawWC, recv bool) verbs.WC {
	wc := decodeWC(w, recv)
	q := d.qpByNum(wc.QPN)
	if q == nil {
		return wc
	}
	q.mu.Lock()
	if recv && q.srq != nil {
		q.srq.posted.Add(-1)
	}
	current := true // false for a completion from before the QP's last RESET
	var forget netip.AddrPort
	switch {
	case recv:
		if q.typ == verbs.RC && wc.Status == verbs.StatusSuccess {
			wc.SrcAddr, wc.SrcQPN = q.remote, q.remoteQPN
		}
		// A DCT receive names the DCI's QPN; the NIC does not report the
		// sender's address, so SrcAddr stays zero on hardware.
	default:
		// A successful send completion carries the opcode the WR was
		// posted with (WRITE_WITH_IMM completes as a WRITE).
		var p posted
		if p, current = q.sq.complete(wc.ID); current && wc.Status == verbs.StatusSuccess {
			wc.Op = p.op
		}
		if current && q.typ == verbs.DCI && p.target.IsValid() && invalidatesTarget(wc.Status) {
			forget = p.target
		}
	}
	if current && wc.Status != verbs.StatusSuccess && q.typ != verbs.DCT {
		// The NIC moved the QP to ERR (a DCT, being shared, stays up).
		q.state = verbs.StateErr
	}
	q.mu.Unlock()
	if forget.IsValid() {
		q.pd.forgetTarget(forget) // takes pd.mu and the CM's lock: not under q.mu
	}
	return wc
}

// srq is a shared receive queue.
type srq struct {
	p      *pd
	srq    *C.struct_ibv_srq
	depth  int
	posted atomic.Int64
	dead   atomic.Bool
}

func (p *pd) CreateSRQ(depth int) (verbs.SRQ, error) {
	if err := checkSRQDepth(depth, p.dev.attr.MaxSRQWR); err != nil {
		return nil, err
	}
	var a C.struct_ibv_srq_init_attr
	a.attr.max_wr = C.uint32_t(depth)
	a.attr.max_sge = 1
	s, err := C.ibv_create_srq(p.pd, &a)
	if s == nil {
		return nil, fmt.Errorf("rdma: ibv_create_srq(%d): %v", depth, err)
	}
	x := &srq{p: p, srq: s, depth: depth}
	p.mu.Lock()
	p.srqs = append(p.srqs, x)
	p.mu.Unlock()
	return x, nil
}

func (s *srq) PostRecv(wrs []verbs.RecvWR) error {
	if s.dead.Load() {
		return &verbs.PostError{Index: 0, Err: verbs.ErrDestroyed}
	}
	n, err := postRecv(nil, s.srq, s.p, wrs, s.depth-int(s.posted.Load()))
	s.posted.Add(int64(n))
	return err
}

// Posted counts receives posted and not yet consumed as far as this side
// knows: receives the NIC consumed are subtracted when their completions
// are polled (Device.translate).
func (s *srq) Posted() int { return int(s.posted.Load()) }

// ArmLimit implements verbs.SRQ (ibv_modify_srq with IBV_SRQ_LIMIT).
func (s *srq) ArmLimit(limit int) error {
	if s.dead.Load() {
		return fmt.Errorf("%w: SRQ", verbs.ErrDestroyed)
	}
	if limit < 0 || limit > s.depth {
		return fmt.Errorf("%w: SRQ limit %d (0..%d)", verbs.ErrInvalidArg, limit, s.depth)
	}
	if rc := C.krfs_arm_srq(s.srq, C.uint32_t(limit)); rc != 0 {
		return fmt.Errorf("rdma: ibv_modify_srq(limit %d): %v", limit, syscall.Errno(rc))
	}
	return nil
}

func (s *srq) Destroy() error {
	if s.dead.Swap(true) {
		return fmt.Errorf("%w: SRQ", verbs.ErrDestroyed)
	}
	if rc := C.ibv_destroy_srq(s.srq); rc != 0 {
		return fmt.Errorf("rdma: ibv_destroy_srq: %v", syscall.Errno(rc))
	}
	return nil
}

func (s *srq) destroy() {
	if !s.dead.Swap(true) {
		C.ibv_destroy_srq(s.srq)
	}
}

// postRecv validates and posts receive WRs on a QP or an SRQ with room
// for free more; it returns how many were posted.
func postRecv(q *C.struct_ibv_qp, s *C.struct_ibv_srq, p *pd, wrs []verbs.RecvWR, free int) (int, error) {
	raw := make([]C.struct_krfs_recv, 0, len(wrs))
	var perr error
	for i := range wrs {
		if i >= free {
			perr = &verbs.PostError{Index: i, Err: verbs.ErrQueueFull}
			break
		}
		if err := checkRecv(&wrs[i], p); err != nil {
			perr = &verbs.PostError{Index: i, Err: err}
			break
		}
		m := wrs[i].Local.MR.(mrStater).state()
		raw = append(raw, C.struct_krfs_recv{wr_id: C.uint64_t(wrs[i].ID), laddr: C.uint64_t(m.localAddr(wrs[i].Local.Offset)),
			length: C.uint32_t(wrs[i].Local.Length), lkey: C.uint32_t(m.lkey)})
	}
	if len(raw) == 0 {
		return 0, perr
	}
	var bad C.int
	if rc := C.krfs_post_recv(q, s, &raw[0], C.int(len(raw)), &bad); rc != 0 {
		return int(bad), &verbs.PostError{Index: int(bad), Err: fmt.Errorf("rdma: ibv_post_recv: %v", syscall.Errno(rc))}
	}
	return len(raw), perr
}

// qp is an RC QP, a DCI or a DCT.
type qp struct {
	pd   *pd
	qp   *C.struct_ibv_qp
	typ  verbs.QPType
	caps verbs.QPCaps
	scq  *cq
	rcq  *cq
	srq  *srq

	mu        sync.Mutex // guards the fields below
	qpn       uint32     // a DCT's is 0 until RTR
	state     verbs.QPState
	dead      bool
	access    verbs.Access // kept across RESET, like softnic
	remote    netip.AddrPort
	remoteQPN uint32
	sqPSN     uint32
	rqPSN     uint32
	attr      verbs.QPAttr // timeouts and retry counts in force
	sq        *sendTrack
	raw       []C.struct_krfs_wr
}

func (p *pd) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	d := p.dev
	scq, _ := cfg.SendCQ.(*cq)
	rcq, _ := cfg.RecvCQ.(*cq)
	s, _ := cfg.SRQ.(*srq)
	caps := cfg.Caps
	if caps.MaxSendWR == 0 {
		caps.MaxSendWR = 128
	}
	if caps.MaxRecvWR == 0 {
		caps.MaxRecvWR = 128
	}
	if caps.MaxRdAtomic == 0 {
		caps.MaxRdAtomic = 16
	}
	var cqp *C.struct_ibv_qp
	var err error
	switch cfg.Type {
	case verbs.RC:
		if scq == nil || rcq == nil || scq.dev != d || rcq.dev != d {
			return nil, fmt.Errorf("%w: RC QP needs send and receive CQs of this device", verbs.ErrInvalidArg)
		}
		var cs *C.struct_ibv_srq
		if s != nil {
			if s.p != p {
				return nil, fmt.Errorf("%w: SRQ of another protection domain", verbs.ErrWrongPD)
			}
			cs = s.srq
		}
		cqp, err = C.krfs_create_rc(p.pd, scq.send, rcq.recv, cs, C.uint32_t(caps.MaxSendWR), C.uint32_t(caps.MaxRecvWR), C.uint32_t(caps.MaxInline))
	case verbs.DCI, verbs.DCT:
		if !d.dc {
			return nil, fmt.Errorf("%w: %s has no DC transport (%s); run RC-only", verbs.ErrInvalidArg, d.name, d.dcNote)
		}
		if cfg.Type == verbs.DCI {
			if scq == nil || scq.dev != d {
				return nil, fmt.Errorf("%w: DCI needs a send CQ of this device", verbs.ErrInvalidArg)
			}
			atomics := C.int(0)
			if d.attr.Atomic != verbs.AtomicNone {
				atomics = 1
			}
			cqp, err = C.krfs_create_dc(d.ctx, p.pd, scq.send, scq.recv, nil, 0, 0, C.uint32_t(caps.MaxSendWR), C.uint32_t(caps.MaxInline), atomics)
		} else {
			if rcq == nil || rcq.dev != d || s == nil {
				return nil, fmt.Errorf("%w: a DCT needs a receive CQ of this device and an SRQ", verbs.ErrInvalidArg)
			}
			cqp, err = C.krfs_create_dc(d.ctx, p.pd, rcq.send, rcq.recv, s.srq, 1, C.uint64_t(cfg.DCKey), 0, 0, 0)
		}
	default:
		return nil, fmt.Errorf("%w: QP type %v", verbs.ErrInvalidArg, cfg.Type)
	}
	if cqp == nil {
		return nil, fmt.Errorf("rdma: creating a %v QP: %v", cfg.Type, err)
	}
	q := &qp{pd: p, qp: cqp, typ: cfg.Type, caps: caps, scq: scq, rcq: rcq, srq: s,
		sq: newSendTrack(caps.MaxSendWR), attr: verbs.QPAttr{RetryCnt: 7, RNRRetry: 7}}
	if cfg.Type != verbs.DCT {
		// A DCT has no number yet: mlx5 assigns it at RTR (modify).
		q.qpn = uint32(cqp.qp_num)
		d.mu.Lock()
		err = d.qps.add(q.qpn, q)
		d.mu.Unlock()
		if err != nil {
			C.ibv_destroy_qp(cqp)
			return nil, err
		}
	}
	return q, nil
}

// QPN implements verbs.QP: 0 for a DCT before RTR.
func (q *qp) QPN() uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.qpn
}

func (q *qp) Type() verbs.QPType { return q.typ }
func (q *qp) SendQueueFree() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.typ == verbs.DCT {
		return 0
	}
	return q.sq.free()
}

func (q *qp) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) Info() verbs.QPInfo {
	q.mu.Lock()
	defer q.mu.Unlock()
	return verbs.QPInfo{QPN: q.qpn, Type: q.typ, State: q.state, Remote: q.remote, RemoteQPN: q.remoteQPN,
		SQPSN: q.sqPSN, RQPSN: q.rqPSN, Outstand: len(q.sq.ring) - q.sq.free()}
}

// Modify moves the QP; for an RC QP's RTR the remote CM address is
// resolved to its GID and LID (a round trip on first use).
func (q *qp) Modify(a verbs.QPAttr) error { return q.modify(a, nil) }

func (q *qp) modify(a verbs.QPAttr, peer *endpoint) error {
	d := q.pd.dev
	if a.State == verbs.StateRTR && q.typ == verbs.RC && peer == nil {
		if !a.RemoteAddr.IsValid() || a.RemoteQPN == 0 {
			return fmt.Errorf("%w: RTR of an RC QP needs the remote address and QPN", verbs.ErrInvalidArg)
		}
		e, err := d.cm.resolve(context.Background(), a.RemoteAddr)
		if err != nil {
			return err
		}
		peer = &e
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return verbs.ErrDestroyed
	}
	from := q.state
	access := q.access
	if a.Access != 0 {
		access = a.Access
	}
	// Invalid transitions (a DCT's to ERR, a DCI's RESET->ERR, ...) and
	// atomic access without atomics never reach the kernel.
	chk := a
	chk.Access = access
	if err := checkModify(q.typ, from, &chk, d.attr.Atomic, d.mtu); err != nil {
		return fmt.Errorf("%w (%v QP %d)", err, q.typ, q.qpn)
	}
	// Timeouts and retry counts take effect at RTS. Like softnic, a QP
	// keeps what it was given across transitions and RESET (meta sets
	// its RNR retry count in INIT before the connection manager brings
	// the QP up); counts start at 7 (RNR retry 7 is "infinite", as in IB).
	at := q.attr
	if a.Timeout != 0 {
		at.Timeout = a.Timeout
	}
	if a.RetryCnt != 0 || a.Mask&verbs.AttrRetryCnt != 0 {
		at.RetryCnt = a.RetryCnt
	}
	if a.RNRRetry != 0 || a.Mask&verbs.AttrRNRRetry != 0 {
		at.RNRRetry = a.RNRRetry
	}
	if a.MinRNRTimer != 0 {
		at.MinRNRTimer = a.MinRNRTimer
	}
	if a.PathMTU != 0 {
		at.PathMTU = a.PathMTU
	}
	m := C.struct_krfs_mod{qp_type: C.int(q.typ), state: C.int(qpState(a.State)), from: C.int(qpState(from)),
		access: C.uint32_t(accessFlags(access)), port: C.uint8_t(d.port)}
	switch a.State {
	case verbs.StateRTR:
		mtu := at.PathMTU
		if mtu == 0 || mtu > d.mtu {
			mtu = d.mtu
		}
		e, err := mtuEnum(mtu)
		if err != nil {
			return err
		}
		m.mtu = C.uint32_t(e)
		m.min_rnr_timer = C.uint8_t(rnrTimerCode(at.MinRNRTimer))
		m.max_rd_atomic = C.uint8_t(min(q.caps.MaxRdAtomic, 16))
		d.setQoS(&m)
		if peer != nil {
			av := d.avFor(*peer)
			m.dlid, m.is_global, m.sgid_index, m.dgid = av.dlid, av.is_global, av.sgid_index, av.dgid
			m.dest_qpn = C.uint32_t(a.RemoteQPN)
			m.rq_psn = C.uint32_t(a.RQPSN & 0xffffff)
		} else if !d.ib {
			// A DCI or DCT on RoCE: the AV names only the local GID.
			m.is_global, m.sgid_index = 1, C.uint8_t(d.gidIndex)
			for i, b := range d.gid {
				m.dgid[i] = C.uint8_t(b)
			}
		}
	case verbs.StateRTS:
		m.timeout = C.uint8_t(ackTimeout(at.Timeout))
		m.retry_cnt = C.uint8_t(at.RetryCnt)
		m.rnr_retry = C.uint8_t(at.RNRRetry)
		m.sq_psn = C.uint32_t(a.SQPSN & 0xffffff)
		m.max_rd_atomic = C.uint8_t(min(q.caps.MaxRdAtomic, 16))
	}
	if rc := C.krfs_modify(q.qp, &m); rc != 0 {
		err := error(syscall.Errno(rc))
		if rc == C.EOPNOTSUPP {
			// mlx5 without DC atomics refuses a DCT's remote atomic access.
			err = fmt.Errorf("%w: %v", verbs.ErrNotSupported, err)
		}
		return fmt.Errorf("rdma: ibv_modify_qp %v -> %v on %v QP %d: %w", from, a.State, q.typ, q.qpn, err)
	}
	if q.typ == verbs.DCT && a.State == verbs.StateRTR {
		// The DCT's number exists now (rdma-core set qp_num from the
		// kernel's answer to INIT->RTR): completions and events name it.
		q.qpn = uint32(q.qp.qp_num)
		d.mu.Lock()
		err := d.qps.add(q.qpn, q)
		d.mu.Unlock()
		if err != nil {
			return fmt.Errorf("rdma: the DCT has no number after RTR: %w", err)
		}
	}
	q.state, q.attr = a.State, at
	if a.Access != 0 {
		q.access = a.Access
	}
	switch a.State {
	case verbs.StateReset:
		q.sq.reset()
		q.remote, q.remoteQPN = netip.AddrPort{}, 0
	case verbs.StateRTR:
		if peer != nil {
			q.remote, q.remoteQPN, q.rqPSN = peer.Addr, a.RemoteQPN, a.RQPSN
		}
	case verbs.StateRTS:
		if from == verbs.StateRTR {
			q.sqPSN = a.SQPSN
		}
	}
	return nil
}

func (q *qp) PostSend(wrs []verbs.SendWR) error {
	// DC targets are resolved before the QP lock: a first contact asks
	// the target's CM for its GID and LID.
	var ahs []*C.struct_ibv_ah
	if q.typ == verbs.DCI {
		ahs = make([]*C.struct_ibv_ah, len(wrs))
		for i := range wrs {
			if wrs[i].Target == nil {
				break
			}
			ah, err := q.pd.ah(wrs[i].Target.Addr)
			if err != nil {
				// Post what comes before the unresolvable target.
				return q.postLocked(wrs[:i], ahs, &verbs.PostError{Index: i, Err: err})
			}
			ahs[i] = ah
		}
	}
	return q.postLocked(wrs, ahs, nil)
}

func (q *qp) postLocked(wrs []verbs.SendWR, ahs []*C.struct_ibv_ah, tail error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return &verbs.PostError{Index: 0, Err: verbs.ErrDestroyed}
	}
	q.raw = q.raw[:0]
	perr := tail
	for i := range wrs {
		wr := &wrs[i]
		var err error
		switch {
		case q.state != verbs.StateRTS && q.state != verbs.StateErr:
			err = fmt.Errorf("%w: post send in %v", verbs.ErrQPState, q.state)
		case q.sq.free() <= len(q.raw):
			err = fmt.Errorf("%w: %d WRs outstanding", verbs.ErrQueueFull, q.caps.MaxSendWR)
		default:
			err = checkSend(wr, q.typ, q.caps, q.pd, q.pd.dev.attr.Atomic)
		}
		if err != nil {
			perr = &verbs.PostError{Index: i, Err: err}
			break
		}
		op, _ := wrOpcode(wr.Op)
		r := C.struct_krfs_wr{wr_id: C.uint64_t(wr.ID), opcode: C.uint32_t(op), flags: C.uint32_t(sendFlags(wr.Flags)),
			raddr: C.uint64_t(wr.RemoteAddr), rkey: C.uint32_t(wr.RKey), compare_add: C.uint64_t(wr.CompareAdd),
			swap: C.uint64_t(wr.Swap), imm: C.uint32_t(wr.Imm)}
		if wr.Flags&verbs.Inline != 0 {
			if len(wr.InlineData) > 0 {
				r.laddr = C.uint64_t(uintptr(unsafe.Pointer(&wr.InlineData[0])))
			}
			r.length = C.uint32_t(len(wr.InlineData))
		} else if wr.Local.MR != nil {
			m := wr.Local.MR.(mrStater).state()
			r.laddr, r.length, r.lkey = C.uint64_t(m.localAddr(wr.Local.Offset)), C.uint32_t(wr.Local.Length), C.uint32_t(m.lkey)
		}
		if q.typ == verbs.DCI {
			r.ah = C.uint64_t(uintptr(unsafe.Pointer(ahs[i])))
			r.dctn, r.dc_key = C.uint32_t(wr.Target.DCTN), C.uint64_t(wr.Target.DCKey)
		}
		q.raw = append(q.raw, r)
	}
	if len(q.raw) == 0 {
		return perr
	}
	var pinner runtime.Pinner
	defer pinner.Unpin()
	for i := range wrs[:len(q.raw)] {
		if wrs[i].Flags&verbs.Inline != 0 && len(wrs[i].InlineData) > 0 {
			pinner.Pin(&wrs[i].InlineData[0])
		}
	}
	n := len(q.raw)
	var rc C.int
	if q.typ == verbs.DCI {
		if rc = C.krfs_post_dci(q.qp, &q.raw[0], C.int(len(q.raw))); rc != 0 {
			n = 0 // ibv_wr_complete posts all or nothing
		}
	} else {
		var bad C.int
		if rc = C.krfs_post_rc(q.qp, &q.raw[0], C.int(len(q.raw)), &bad); rc != 0 {
			n = int(bad)
		}
	}
	for i := range n {
		p := posted{id: wrs[i].ID, op: wrs[i].Op, signaled: wrs[i].Flags&verbs.Signaled != 0}
		if wrs[i].Target != nil {
			p.target = wrs[i].Target.Addr
		}
		q.sq.push(p)
	}
	if rc != 0 {
		return &verbs.PostError{Index: n, Err: fmt.Errorf("rdma: post send: %v", syscall.Errno(rc))}
	}
	return perr
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.dead:
		return &verbs.PostError{Index: 0, Err: verbs.ErrDestroyed}
	case q.typ != verbs.RC || q.srq != nil:
		return &verbs.PostError{Index: 0, Err: fmt.Errorf("%w: %v QP receives through its SRQ", verbs.ErrOpcode, q.typ)}
	case q.state == verbs.StateReset:
		return &verbs.PostError{Index: 0, Err: fmt.Errorf("%w: post receive in RESET", verbs.ErrQPState)}
	}
	// The receive queue's fill level is the NIC's to know: a full queue
	// fails in ibv_post_recv (ENOMEM) and is reported at its index.
	_, err := postRecv(q.qp, nil, q.pd, wrs, len(wrs))
	return err
}

func (q *qp) Destroy() error {
	q.mu.Lock()
	if q.dead {
		q.mu.Unlock()
		return fmt.Errorf("%w: QP %d", verbs.ErrDestroyed, q.qpn)
	}
	num := q.qpn
	q.mu.Unlock()
	d := q.pd.dev
	d.mu.Lock()
	d.qps.remove(num, q)
	d.mu.Unlock()
	return q.destroy()
}

func (q *qp) destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return nil
	}
	q.dead = true
	if rc := C.ibv_destroy_qp(q.qp); rc != 0 {
		return fmt.Errorf("rdma: ibv_destroy_qp: %v", syscall.Errno(rc))
	}
	return nil
}
