//go:build !linux

package udplink

import (
	"net/netip"

	"github.com/krfs/krfs/verbs/softnic/link"
)

var _ link.Link = (*Link)(nil)

// Link is a softnic link over one UDP socket. It is implemented on Linux
// only; elsewhere Open fails with ErrUnsupported.
type Link struct{}

// Open returns ErrUnsupported on this system.
func Open(cfg Config) (*Link, error) { return nil, ErrUnsupported }

func (l *Link) LocalAddr() netip.AddrPort        { return netip.AddrPort{} }
func (l *Link) Send(pkts []link.Packet) error    { return ErrUnsupported }
func (l *Link) Start(r link.Receiver)            {}
func (l *Link) MaxDatagram() int                 { return MaxDatagramIPv4 }
func (l *Link) MaxDatagramTo(netip.AddrPort) int { return MaxDatagramIPv4 }
func (l *Link) Stats() link.Stats                { return link.Stats{} }
func (l *Link) Counters() Counters               { return Counters{} }
func (l *Link) Close() error                     { return nil }
