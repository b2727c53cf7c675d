//go:build !linux

package baseline

import (
	"errors"
	"net/netip"
	"time"
)

// The UDP baselines use Linux system calls (sendmmsg, recvmmsg).

func (h Host) UDPPingPong(iters int, size int) (Latencies, error) {
	return nil, errors.ErrUnsupported
}

func (h Host) EchoRate(outstanding int, size int, d time.Duration) (float64, error) {
	return 0, errors.ErrUnsupported
}

// Pinger makes single raw UDP round trips (Linux only).
type Pinger struct{}

func (h Host) NewPinger(size int) (*Pinger, error) { return nil, errors.ErrUnsupported }

func (p *Pinger) RoundTrip(to netip.AddrPort) (time.Duration, error) {
	return 0, errors.ErrUnsupported
}

func (p *Pinger) Close() {}
