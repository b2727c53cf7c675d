package rdma

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/krfs/krfs/verbs"
)

// Errors of opening and listing devices.
var (
	// ErrNotBuilt: this binary was built without the rdma build tag, so
	// it has no libibverbs backend.
	ErrNotBuilt = errors.New("rdma: this krfs was built without RDMA support (go build -tags rdma, needs libibverbs-dev)")
	// ErrNoDevice: libibverbs found no RDMA device (no RNIC, or no
	// kernel driver for it).
	ErrNoDevice = errors.New("rdma: no RDMA device found (libibverbs lists none)")
)

// DeviceInfo describes an RDMA device (an RNIC) for listings.
type DeviceInfo struct {
	Name     string // ibv_get_device_name: mlx5_0, rxe0, ...
	NodeGUID string
	FW       string
	VendorID uint32
	PartID   uint32
	// Err says why the device could not be opened or queried; the rest
	// of the listing goes on without it.
	Err string `json:",omitempty"`
	// Transport is "InfiniBand" (InfiniBand and RoCE) or "iWARP" (siw,
	// iWARP RNICs: krfs cannot use them, they need the iWARP connection
	// manager and have no RoCEv2 GID).
	Transport string
	// DC says whether the device offers the Dynamically Connected
	// transport (mlx5 direct verbs and a DCI that could be created);
	// DCNote says why not.
	DC     bool
	DCNote string
	// IOVA says whether the device registers MRs at the IOVA the verbs
	// contract gives them (their page offset: IOVA 0 for a page, 80 for a
	// buffer 80 bytes into one), probed by registering both.
	IOVA bool
	// Atomic is what the device's atomics guarantee (atomic_cap); NONE
	// on upstream mlx5 unless its firmware answers atomics in host order.
	Atomic verbs.AtomicCap
	// MaxSRQWR and MaxCQE bound SRQ and CQ depths.
	MaxSRQWR, MaxCQE, MaxQPWR int
	Ports                     []PortInfo
}

// unusable says why krfs cannot use the device at all ("" if it can).
func (d *DeviceInfo) unusable() string {
	switch {
	case d.Err != "":
		return d.Err
	case d.Transport == "iWARP":
		return "an iWARP device (siw, iWARP RNICs): krfs needs RoCE or InfiniBand"
	case !d.IOVA:
		return "cannot register MRs at their page offset (ibv_reg_mr_iova): kernel or driver too old"
	}
	return ""
}

// PortInfo describes one port of a device.
type PortInfo struct {
	Num       int
	State     string // ACTIVE, DOWN, ...
	LinkLayer string // InfiniBand or Ethernet (RoCE)
	LID       uint16
	ActiveMTU int
	GIDs      []GIDInfo
}

// GIDInfo is one valid entry of a port's GID table.
type GIDInfo struct {
	Index  int
	GID    GID
	Type   string // IB, RoCEv1, RoCEv2
	NetDev string
}

// Usable reports whether the port can carry krfs traffic: active, with a
// LID (InfiniBand) or a RoCEv2 GID (Ethernet).
func (p PortInfo) Usable() bool { return p.whyUnusable() == "" }

// whyUnusable says why the port cannot carry krfs traffic ("" if it can).
func (p PortInfo) whyUnusable() string {
	if p.State != "ACTIVE" {
		return "not ACTIVE: no link"
	}
	if p.LinkLayer == "InfiniBand" {
		if p.LID == 0 {
			return "no LID: is a subnet manager running?"
		}
		return ""
	}
	if _, ok := p.DefaultGID(); !ok {
		return "no RoCEv2 GID"
	}
	return ""
}

// DefaultGID picks the GID index krfs uses when none is configured: on
// Ethernet the first RoCEv2 GID holding an IPv4-mapped address, else the
// first RoCEv2 GID; on InfiniBand index 0.
func (p PortInfo) DefaultGID() (GIDInfo, bool) {
	var v2 []GIDInfo
	for _, g := range p.GIDs {
		if p.LinkLayer == "InfiniBand" && g.Index == 0 {
			return g, true
		}
		if g.Type == "RoCEv2" {
			v2 = append(v2, g)
		}
	}
	for _, g := range v2 {
		if g.GID.IP().Is4() {
			return g, true
		}
	}
	if len(v2) > 0 {
		return v2[0], true
	}
	return GIDInfo{}, false
}

// Config selects what Open opens.
type Config struct {
	// Device is the device name (mlx5_0); empty means the first device
	// with a usable port.
	Device string
	// Port is the port number; 0 means the first usable port.
	Port int
	// GIDIndex is the GID table index; -1 means DefaultGID.
	GIDIndex int
	// CMAddr is the UDP address of the device's connection manager, which
	// is also the device's verbs address. Empty means the GID's IP (RoCE)
	// or all interfaces (InfiniBand) at DefaultCMPort; a missing or
	// unspecified host means the GID's IP; port 0 picks a free port; port
	// 4791 (RoCEv2's) is refused.
	CMAddr string
	// QoS is the traffic class, service level and hop limit of every QP
	// and address handle.
	QoS QoS
}

// Describe formats devices for `krfs devices`.
func Describe(devs []DeviceInfo) string {
	var b strings.Builder
	for _, d := range devs {
		if d.Err != "" {
			fmt.Fprintf(&b, "%s  NOT USABLE: %s\n", d.Name, d.Err)
			continue
		}
		fmt.Fprintf(&b, "%s  guid %s  fw %s  vendor %#x part %d\n", d.Name, d.NodeGUID, d.FW, d.VendorID, d.PartID)
		if bad := d.unusable(); bad != "" {
			fmt.Fprintf(&b, "  NOT USABLE: %s\n", bad)
		}
		if d.DC {
			b.WriteString("  DC: yes (mlx5 DCI/DCT)\n")
		} else {
			fmt.Fprintf(&b, "  DC: no (%s): krfs runs RC-only on this device\n", d.DCNote)
		}
		atom := ""
		if d.Atomic == verbs.AtomicNone {
			atom = ": krfs refuses atomic operations on this device"
		}
		fmt.Fprintf(&b, "  atomics: %v%s  max SRQ %d  max CQ %d\n", d.Atomic, atom, d.MaxSRQWR, d.MaxCQE)
		for _, p := range d.Ports {
			usable := "usable"
			if why := p.whyUnusable(); why != "" {
				usable = "not usable: " + why
			}
			fmt.Fprintf(&b, "  port %d  %s  %s  lid %d  mtu %d  %s\n", p.Num, p.State, p.LinkLayer, p.LID, p.ActiveMTU, usable)
			for _, g := range p.GIDs {
				ip := ""
				if p.LinkLayer == "Ethernet" {
					ip = " (" + g.GID.IP().String() + ")"
				}
				fmt.Fprintf(&b, "    gid %d  %s  %s%s %s\n", g.Index, netip.AddrFrom16(g.GID).String(), g.Type, ip, g.NetDev)
			}
		}
	}
	return b.String()
}

// Caps describes an opened device port.
type Caps struct {
	Name      string
	Port      int
	GIDIndex  int
	GID       GID
	LID       uint16
	LinkLayer string
	MTU       int
	// DC says whether DCIs and DCTs can be created; without DC, qpcore
	// must run RC-only. DCNote says why not.
	DC     bool
	DCNote string
	Atomic verbs.AtomicCap
	QoS    QoS
}

// Plan says what Open would open for cfg among devs, in one line for
// `krfs devices`: the device, port and GID, and the address its
// connection manager (the node's address for peers) would bind; or why
// nothing is usable.
func Plan(devs []DeviceInfo, cfg Config) (string, error) {
	d, p, err := pickPort(devs, cfg)
	if err != nil {
		return "", err
	}
	g, ok := p.DefaultGID()
	if cfg.GIDIndex >= 0 {
		ok = false
		for _, x := range p.GIDs {
			if x.Index == cfg.GIDIndex {
				g, ok = x, true
			}
		}
	}
	ib := p.LinkLayer == "InfiniBand"
	if !ok && !ib {
		return "", fmt.Errorf("%w: %s port %d has no GID at index %d", ErrNoDevice, d.Name, p.Num, cfg.GIDIndex)
	}
	addr, err := cmListenAddr(cfg.CMAddr, g.GID, ib)
	if err != nil {
		return "", err
	}
	dc := "DC"
	if !d.DC {
		dc = "RC only"
	}
	return fmt.Sprintf("%s port %d (%s, %s), GID %d %v, connection manager on %s, atomics %v",
		d.Name, p.Num, p.LinkLayer, dc, g.Index, g.GID, addr, d.Atomic), nil
}
