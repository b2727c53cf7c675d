package meta

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// Backing off from a meta service that is down or busy (see "Start
// storms" in the package doc). Every wait is on the client's clock.
//
// A server whose connection attempt failed is tried again after
// RetryInterval, doubled after every further failure up to
// MaxRetryInterval, each wait multiplied by a random factor in [0.5, 1.5):
// nodes that failed together (a service that restarted, a start storm it
// shed) do not come back together. Until then callers fail at once and the
// client's maintenance goroutine makes the attempt. A new client's first
// connection, and an agent's registration, answered busy, wait out the
// same backoff and try again while the caller's context lasts.

// DefaultMaxRetryInterval bounds the reconnection backoff.
const DefaultMaxRetryInterval = 8 * time.Second

// retryDelay is the wait after fails consecutive failures (fails >= 1).
func (c *Client) retryDelay(fails int) time.Duration {
	d := c.cfg.RetryInterval
	for i := 1; i < fails && d < c.cfg.MaxRetryInterval; i++ {
		d *= 2
	}
	d = min(d, c.cfg.MaxRetryInterval)
	return d/2 + rand.N(d)
}

// sleep waits d on the client's clock, or until ctx ends.
func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	ch, stop := clock.After(c.clock, d)
	defer stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isBusy reports whether err is a meta service shedding load: a busy
// reply, or a connection request it rejected as busy.
func isBusy(err error) bool {
	return errors.Is(err, ErrBusy) ||
		errors.Is(err, verbs.ErrCMRejected) && strings.Contains(err.Error(), busyReject)
}

// deviceClock returns dev's clock if it has one (softnic's: the clock
// its ACK timeouts run on), else nil.
func deviceClock(dev verbs.Device) clock.Clock {
	if d, ok := dev.(interface{ Clock() clock.Clock }); ok {
		return d.Clock()
	}
	return nil
}

// whileBusy runs f until it returns something other than a busy answer,
// backing off between attempts (retryDelay), or until ctx ends; then it
// returns f's last error.
func (c *Client) whileBusy(ctx context.Context, f func() error) error {
	for try := 1; ; try++ {
		err := f()
		if !isBusy(err) {
			return err
		}
		c.st.busy.Add(1)
		if c.sleep(ctx, c.retryDelay(try)) != nil {
			return err
		}
	}
}

// busyWait returns how long a caller should wait before dialing s: the
// rest of s's backoff if its last attempt was answered busy and the
// backoff ends within a connection attempt's time, else 0 (dial now, or
// fail at once if the backoff is longer).
func (c *Client) busyWait(s *server) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastErr == nil || !isBusy(s.lastErr) {
		return 0
	}
	d := s.retryAt.Sub(c.clock.Now())
	if d <= 0 || d > c.reconnectTimeout(s.handshake) {
		return 0
	}
	return d
}
