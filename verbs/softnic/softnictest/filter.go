package softnictest

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/krfs/krfs/verbs/softnic/wire"
)

// Filter decides the fate of one sent packet. h is the packet's parsed
// header (the zero Header if it does not parse) and payload the bytes
// after it (the whole datagram if it does not parse).
//
// The network calls its filter for every packet sent between open,
// connected links, in send order, with its lock held: a filter needs no
// locking of its own for state only it touches, must return quickly, must
// not retain or modify payload, and must not call the Network's methods.
type Filter func(from, to netip.AddrPort, h wire.Header, payload []byte) Verdict

// Verdict is a Filter's decision: Pass, Drop, Dup or Delay(d).
type Verdict struct {
	kind  verdictKind
	delay time.Duration
}

type verdictKind uint8

const (
	kindPass verdictKind = iota
	kindDrop
	kindDup
	kindDelay
)

// Verdicts.
var (
	// Pass hands the packet to the network's random faults (Config).
	Pass = Verdict{}
	// Drop loses the packet.
	Drop = Verdict{kind: kindDrop}
	// Dup delivers the packet twice, back to back, with no random faults.
	Dup = Verdict{kind: kindDup}
)

// Delay delivers the packet d later than its normal due time, with no
// random faults; packets sent after it may overtake it.
func Delay(d time.Duration) Verdict { return Verdict{kind: kindDelay, delay: max(d, 0)} }

func (v Verdict) String() string {
	switch v.kind {
	case kindPass:
		return "Pass"
	case kindDrop:
		return "Drop"
	case kindDup:
		return "Dup"
	case kindDelay:
		return fmt.Sprintf("Delay(%v)", v.delay)
	}
	return fmt.Sprintf("Verdict(%d)", v.kind)
}
