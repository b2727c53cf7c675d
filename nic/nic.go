// Package nic opens the verbs device a krfs node runs on: the software NIC
// (verbs/softnic, RDMA over UDP) or an RDMA NIC through libibverbs
// (verbs/rdma, in binaries built with the rdma tag).
//
//	o, err := nic.Open(nic.Options{Backend: nic.Auto, Listen: "10.0.0.1:7000", GIDIndex: -1})
//	if err != nil { ... }
//	log.Printf("using %s: %s", o.Backend, o.Reason)
//	defer o.Dev.Close()
//
// # Choosing
//
//   - softnic: always available; Listen is its UDP address (empty:
//     DefaultListen, else 127.0.0.1:0).
//   - rdma: the RNIC named by Device, Port and GIDIndex (defaults: the
//     first usable port, its RoCEv2 IPv4 GID or IB GID 0). Listen is the
//     address of the backend's connection manager, the device's address
//     for peers: empty means the GID's IP at rdma.DefaultCMPort (4792);
//     UDP port 4791 is RoCEv2's and refused. TrafficClass, SL and
//     HopLimit set the QoS of its QPs. Fails at once, with a message
//     saying why, when the binary has no rdma support or the machine has
//     no usable RNIC.
//   - auto: rdma when a usable RNIC exists, else softnic; Opened.Reason
//     says which and why, for the log.
//
// # Transports do not mix
//
// A softnic node speaks a UDP protocol of its own; an rdma node speaks
// RoCE or InfiniBand. They cannot reach each other, so a node publishes
// its Opened.Transport and checks a peer's with Reachable before
// connecting.
package nic

import (
	"errors"
	"fmt"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/rdma"
	"github.com/krfs/krfs/verbs/softnic"
)

// Backend names a verbs backend.
type Backend string

const (
	Auto    Backend = "auto"
	Softnic Backend = "softnic"
	RDMA    Backend = "rdma"
)

// ParseBackend parses a --backend value.
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(s); b {
	case Auto, Softnic, RDMA:
		return b, nil
	case "":
		return Auto, nil
	}
	return "", fmt.Errorf("unknown backend %q: want auto, softnic or rdma", s)
}

// Options say which device to open.
type Options struct {
	Backend Backend
	// Listen is softnic's UDP address ("host:port"), or the rdma
	// backend's connection-manager address (empty: the GID's IP at
	// rdma.DefaultCMPort).
	Listen string
	// DefaultListen is softnic's address when Listen is empty (empty:
	// 127.0.0.1:0, a free port). The rdma backend ignores it: a softnic
	// default such as 127.0.0.1:4791 is unreachable for peers and 4791
	// is RoCEv2's own port.
	DefaultListen string
	// ClusterKey authenticates softnic packets (see softnic.Config).
	ClusterKey []byte
	// Encrypt also encrypts softnic payloads (AES-256-GCM); it needs a
	// ClusterKey.
	Encrypt bool
	// Device, Port and GIDIndex select an RNIC port (rdma; auto when it
	// picks rdma). Empty, 0 and -1 choose defaults.
	Device   string
	Port     int
	GIDIndex int
	// TrafficClass, SL and HopLimit are the rdma backend's QoS (see
	// rdma.QoS); softnic ignores them.
	TrafficClass, SL, HopLimit int
}

// Opened is an open device and what was chosen.
type Opened struct {
	Dev     verbs.Device
	Backend Backend // Softnic or RDMA, never Auto
	// Reason says why this backend was chosen, for the log.
	Reason string
	// Transport names the wire protocol peers must share: "softnic/udp",
	// "rdma/roce" or "rdma/ib".
	Transport string
	// DC says whether DCIs and DCTs can be created; without them qpcore
	// must run RC-only. DCNote says why not.
	DC     bool
	DCNote string
}

// Open opens the device o asks for.
func Open(o Options) (*Opened, error) {
	b, err := ParseBackend(string(o.Backend))
	if err != nil {
		return nil, err
	}
	switch b {
	case Softnic:
		return openSoftnic(o, "--backend softnic")
	case RDMA:
		return openRDMA(o)
	}
	why, ok := rdmaUsable(o)
	if !ok {
		return openSoftnic(o, "auto: "+why+"; using softnic (RDMA over UDP)")
	}
	op, err := openRDMA(o)
	if err != nil {
		return openSoftnic(o, fmt.Sprintf("auto: opening the RNIC failed (%v); using softnic (RDMA over UDP)", err))
	}
	op.Reason = "auto: " + op.Reason
	return op, nil
}

// rdmaUsable reports whether an RNIC port matching o exists, or why not.
func rdmaUsable(o Options) (string, bool) {
	if !rdma.Built {
		return "this krfs was built without RDMA support (build with -tags rdma)", false
	}
	devs, err := rdma.Devices()
	if err != nil {
		return fmt.Sprintf("listing RDMA devices failed (%v)", err), false
	}
	if len(devs) == 0 {
		return "no RDMA device found", false
	}
	for _, d := range devs {
		if o.Device != "" && d.Name != o.Device {
			continue
		}
		for _, p := range d.Ports {
			if p.Usable() && (o.Port == 0 || o.Port == p.Num) {
				return "", true
			}
		}
	}
	return fmt.Sprintf("no usable RDMA port (%d devices, none active with a LID or RoCEv2 GID matching --device %q --port %d)",
		len(devs), o.Device, o.Port), false
}

func openSoftnic(o Options, reason string) (*Opened, error) {
	listen := o.Listen
	if listen == "" {
		listen = o.DefaultListen
	}
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	dev, err := softnic.OpenUDPAuth(listen, o.ClusterKey, o.Encrypt)
	if err != nil {
		return nil, err
	}
	return &Opened{Dev: dev, Backend: Softnic, Reason: reason, Transport: "softnic/udp", DC: true}, nil
}

// ErrRDMAUnavailable wraps every reason the rdma backend cannot open.
var ErrRDMAUnavailable = errors.New("nic: RDMA backend unavailable")

func openRDMA(o Options) (*Opened, error) {
	if why, ok := rdmaUsable(o); !ok {
		return nil, fmt.Errorf("%w: %s", ErrRDMAUnavailable, why)
	}
	dev, err := rdma.Open(rdma.Config{Device: o.Device, Port: o.Port, GIDIndex: o.GIDIndex, CMAddr: o.Listen,
		QoS: rdma.QoS{TrafficClass: o.TrafficClass, SL: o.SL, HopLimit: o.HopLimit}})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRDMAUnavailable, err)
	}
	c := dev.Caps()
	tr := "rdma/roce"
	if c.LinkLayer == "InfiniBand" {
		tr = "rdma/ib"
	}
	return &Opened{Dev: dev, Backend: RDMA, Transport: tr, DC: c.DC, DCNote: c.DCNote,
		Reason: fmt.Sprintf("RDMA device %s port %d (%s, GID index %d, DC %v)", c.Name, c.Port, c.LinkLayer, c.GIDIndex, c.DC)}, nil
}

// Reachable reports whether a node on transport mine can talk to a peer
// on transport theirs, with a clear error if not.
func Reachable(mine, theirs string) error {
	// A peer that recorded no transport predates the rdma backend: softnic.
	if theirs == "" {
		theirs = "softnic/udp"
	}
	if mine == "" {
		mine = "softnic/udp"
	}
	if mine == theirs {
		return nil
	}
	return fmt.Errorf("nic: peer speaks %s and this node %s: they cannot reach each other (run both on the same --backend)", theirs, mine)
}
