//go:build !linux

package baseline

import (
	"errors"
	"time"
)

// The UDP baselines use Linux system calls (sendmmsg, recvmmsg).

func (h Host) UDPPingPong(iters int, size int) (Latencies, error) {
	return nil, errors.ErrUnsupported
}

func (h Host) EchoRate(outstanding int, size int, d time.Duration) (float64, error) {
	return 0, errors.ErrUnsupported
}
