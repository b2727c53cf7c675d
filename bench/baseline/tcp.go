package baseline

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// tcpReqLen is the size of a TCPBandwidth request, about what a READ
// request header takes.
const tcpReqLen = 16

// TCPBandwidth measures the bytes per second a server on h's address
// delivers over one TCP connection (net package, TCP_NODELAY) when a
// client asks for msgSize-byte messages with small requests and keeps
// depth requests outstanding — how a kernel byte stream would serve
// one-sided READs of msgSize bytes. Messages are requested until total
// bytes (rounded up to whole messages) have arrived; one untimed message
// goes first. The rate is payload bytes over the time from the first timed
// request to the last byte received.
func (h Host) TCPBandwidth(msgSize int, total int64, depth int) (bytesPerSec float64, err error) {
	if msgSize < 1 || msgSize > MaxTCPMsgSize {
		return 0, fmt.Errorf("baseline: TCPBandwidth: message size %d outside [1, %d]", msgSize, MaxTCPMsgSize)
	}
	if total < 1 {
		return 0, fmt.Errorf("baseline: TCPBandwidth: total %d < 1", total)
	}
	if depth < 1 {
		return 0, fmt.Errorf("baseline: TCPBandwidth: depth %d < 1", depth)
	}
	a, err := h.addr()
	if err != nil {
		return 0, err
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	if err != nil {
		return 0, fmt.Errorf("baseline: TCPBandwidth: %w", err)
	}
	// Generous: a run slower than 10 MB/s is broken, not slow.
	deadline := time.Now().Add(10*time.Second + time.Duration(total/10e6)*time.Second)
	srvDone := make(chan error, 1)
	go func() { srvDone <- serveMessages(ln, msgSize, deadline) }()

	rate, err := fetchMessages(ln.Addr().(*net.TCPAddr).AddrPort(), msgSize, total, depth, deadline)
	ln.Close() // unblocks Accept if the client never connected
	if serr := <-srvDone; err == nil && serr != nil {
		return 0, serr
	}
	return rate, err
}

// serveMessages accepts one connection and answers every tcpReqLen-byte
// request with msgSize bytes until the client closes.
func serveMessages(ln *net.TCPListener, msgSize int, deadline time.Time) error {
	c, err := ln.AcceptTCP()
	if err != nil {
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		return fmt.Errorf("baseline: TCPBandwidth accept: %w", err)
	}
	defer c.Close()
	if err := c.SetDeadline(deadline); err != nil {
		return fmt.Errorf("baseline: TCPBandwidth server: %w", err)
	}
	resp := make([]byte, msgSize)
	for i := range resp {
		resp[i] = byte(i)
	}
	var req [tcpReqLen]byte
	for {
		if _, err := io.ReadFull(c, req[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("baseline: TCPBandwidth server read: %w", err)
		}
		if _, err := c.Write(resp); err != nil {
			return fmt.Errorf("baseline: TCPBandwidth server write: %w", err)
		}
	}
}

func fetchMessages(addr netip.AddrPort, msgSize int, total int64, depth int, deadline time.Time) (float64, error) {
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		return 0, fmt.Errorf("baseline: TCPBandwidth dial: %w", err)
	}
	defer c.Close()
	if err := c.SetDeadline(deadline); err != nil {
		return 0, fmt.Errorf("baseline: TCPBandwidth: %w", err)
	}
	buf := make([]byte, msgSize)
	req := make([]byte, tcpReqLen*depth)
	fail := func(op string, err error) (float64, error) {
		return 0, fmt.Errorf("baseline: TCPBandwidth %s: %w", op, err)
	}

	// Untimed warm-up: faults in buf and opens the congestion window.
	if _, err := c.Write(req[:tcpReqLen]); err != nil {
		return fail("write", err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		return fail("read", err)
	}

	n := (total + int64(msgSize) - 1) / int64(msgSize)
	start := time.Now()
	sent := min(int64(depth), n)
	if _, err := c.Write(req[:tcpReqLen*int(sent)]); err != nil {
		return fail("write", err)
	}
	for got := int64(0); got < n; got++ {
		if _, err := io.ReadFull(c, buf); err != nil {
			return fail("read", err)
		}
		if sent < n {
			if _, err := c.Write(req[:tcpReqLen]); err != nil {
				return fail("write", err)
			}
			sent++
		}
	}
	elapsed := time.Since(start)
	return float64(n*int64(msgSize)) / elapsed.Seconds(), nil
}

// connectTimeout bounds one TCPConnectRoundTrip iteration.
const connectTimeout = 5 * time.Second

// connectWarmup is the number of untimed connections before the timed ones.
const connectWarmup = 2

// TCPConnectRoundTrip measures, iters times, a new TCP connection to a
// server on h's address (net package): dial, the server's accept, and one
// 1-byte round trip. Each duration runs from just before the dial to just
// after the reply byte arrived. The client then resets the connection
// (SO_LINGER 0), so repeated runs leave no TIME_WAIT sockets behind.
func (h Host) TCPConnectRoundTrip(iters int) (Latencies, error) {
	if iters < 1 {
		return nil, fmt.Errorf("baseline: TCPConnectRoundTrip: iters %d < 1", iters)
	}
	a, err := h.addr()
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	if err != nil {
		return nil, fmt.Errorf("baseline: TCPConnectRoundTrip: %w", err)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- serveConnects(ln) }()

	lat, err := connectLoop(ln.Addr().(*net.TCPAddr).AddrPort(), iters)
	ln.Close()
	if serr := <-srvDone; err == nil && serr != nil {
		return nil, serr
	}
	return lat, err
}

// serveConnects accepts connections one after another until the listener
// is closed, echoing one byte on each. It returns the first failure of a
// connection, if any.
func serveConnects(ln *net.TCPListener) error {
	var first error
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return first
			}
			return fmt.Errorf("baseline: TCPConnectRoundTrip accept: %w", err)
		}
		if err := echoByte(c); err != nil && first == nil {
			first = fmt.Errorf("baseline: TCPConnectRoundTrip server: %w", err)
		}
	}
}

func echoByte(c *net.TCPConn) error {
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(connectTimeout)); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	_, err := c.Write(b[:])
	return err
}

func connectLoop(addr netip.AddrPort, iters int) (Latencies, error) {
	d := net.Dialer{Timeout: connectTimeout}
	target := addr.String()
	lat := make(Latencies, iters)
	for i := -connectWarmup; i < iters; i++ {
		t0 := time.Now()
		c, err := d.Dial("tcp", target)
		if err != nil {
			return nil, fmt.Errorf("baseline: TCPConnectRoundTrip dial: %w", err)
		}
		err = connectRoundTrip(c.(*net.TCPConn), t0)
		dur := time.Since(t0)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("baseline: TCPConnectRoundTrip: %w", err)
		}
		if i >= 0 {
			lat[i] = dur
		}
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	return lat, nil
}

func connectRoundTrip(c *net.TCPConn, t0 time.Time) error {
	if err := c.SetDeadline(t0.Add(connectTimeout)); err != nil {
		return err
	}
	b := [1]byte{'k'}
	if _, err := c.Write(b[:]); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	return nil
}
