package udplink

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Socket-address conversions without allocation. Ports in sockaddr
// structs are in network byte order; x/sys/unix declares them uint16, so
// they are accessed as two bytes.

// addrPortFromRaw decodes a received source address; IPv4-mapped IPv6
// addresses come back as IPv4.
func addrPortFromRaw(sa *unix.RawSockaddrAny, n uint32) netip.AddrPort {
	switch sa.Addr.Family {
	case unix.AF_INET:
		if n < unix.SizeofSockaddrInet4 {
			return netip.AddrPort{}
		}
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(p.Addr), getPort(&p.Port))
	case unix.AF_INET6:
		if n < unix.SizeofSockaddrInet6 {
			return netip.AddrPort{}
		}
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom16(p.Addr).Unmap(), getPort(&p.Port))
	}
	return netip.AddrPort{}
}

// putSockaddr encodes to into buf for a socket of the given family and
// returns the address length, or 0 if to cannot be reached from such a
// socket.
func putSockaddr(buf *unix.RawSockaddrInet6, to netip.AddrPort, v6 bool) uint32 {
	a := to.Addr()
	if !a.IsValid() || to.Port() == 0 || a.Zone() != "" {
		return 0
	}
	if v6 {
		*buf = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()} // IPv4 becomes ::ffff:a.b.c.d
		putPort(&buf.Port, to.Port())
		return unix.SizeofSockaddrInet6
	}
	a = a.Unmap()
	if !a.Is4() {
		return 0
	}
	p := (*unix.RawSockaddrInet4)(unsafe.Pointer(buf))
	*p = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
	putPort(&p.Port, to.Port())
	return unix.SizeofSockaddrInet4
}

func getPort(p *uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(p))
	return uint16(b[0])<<8 | uint16(b[1])
}

func putPort(p *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(p))
	b[0], b[1] = byte(port>>8), byte(port)
}

// setIov points v at b.
func setIov(v *unix.Iovec, b []byte) {
	if len(b) == 0 {
		v.Base = nil
		v.SetLen(0)
		return
	}
	v.Base = &b[0]
	v.SetLen(len(b))
}

// Control-message geometry, computed once.
var (
	cmsgDataOff  = unix.CmsgLen(0) // offset of the data after a cmsghdr
	cmsgLenU16   = unix.CmsgLen(2)
	cmsgSpaceU16 = unix.CmsgSpace(2)
	cmsgLenInt32 = unix.CmsgLen(4)
)
