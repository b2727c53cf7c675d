package baseline

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Remote baselines: the same UDP ping-pong and TCP request/response as
// above, with the server in another process (typically on another host,
// across the path krfs is measured on) and the client here. RemoteServer
// runs the servers; UDPPingPongTo and TCPBandwidthTo are the clients.

// RemoteServer serves a UDP echo and the TCP message server on one address.
type RemoteServer struct {
	udp  *udpSock
	echo *echoServer
	ln   *net.TCPListener
	wg   sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// StartRemoteServer starts a UDP echo server (datagrams up to MaxUDPSize
// bytes) and a TCP server answering each tcpReqLen-byte request with
// msgSize bytes, on a (port 0: any free port).
func StartRemoteServer(a netip.Addr, udpPort, tcpPort uint16, msgSize int) (*RemoteServer, error) {
	if msgSize < 1 || msgSize > MaxTCPMsgSize {
		return nil, fmt.Errorf("baseline: message size %d outside [1, %d]", msgSize, MaxTCPMsgSize)
	}
	u, err := openUDPPort(a, udpPort, 4<<20)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, tcpPort)))
	if err != nil {
		u.close()
		return nil, fmt.Errorf("baseline: remote TCP server: %w", err)
	}
	s := &RemoteServer{udp: u, ln: ln}
	s.echo = startEcho(u, MaxUDPSize, false)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				serveConn(c, msgSize)
			}()
		}
	}()
	return s, nil
}

// serveConn answers every request on c with msgSize bytes until EOF.
func serveConn(c *net.TCPConn, msgSize int) {
	resp := make([]byte, msgSize)
	var req [tcpReqLen]byte
	for {
		if _, err := io.ReadFull(c, req[:]); err != nil {
			return
		}
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// UDPAddr is the UDP echo server's address.
func (s *RemoteServer) UDPAddr() netip.AddrPort { return s.udp.localAP }

// TCPAddr is the TCP server's address.
func (s *RemoteServer) TCPAddr() netip.AddrPort { return s.ln.Addr().(*net.TCPAddr).AddrPort() }

// Close stops both servers (open TCP connections end when their clients
// close them).
// Later calls return the first one's result.
func (s *RemoteServer) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.echo.stop()
		s.udp.close()
		s.ln.Close()
		s.wg.Wait()
	})
	return s.closeErr
}

// UDPPingPongTo is UDPPingPong against a RemoteServer's echo at to, with
// the client bound to h's address.
func (h Host) UDPPingPongTo(to netip.AddrPort, iters, size int) (Latencies, error) {
	cli, err := h.udpClient("UDPPingPongTo", iters, size)
	if err != nil {
		return nil, err
	}
	defer cli.close()
	var sa sockaddr
	sa.set(to)
	return pingPong(cli, &sa, iters, size)
}

// udpClient checks a UDP client's arguments (what is the caller's name
// for errors) and opens its socket on h's address.
func (h Host) udpClient(what string, count, size int) (*udpSock, error) {
	if err := checkUDPArgs(what, count, size); err != nil {
		return nil, err
	}
	a, err := h.addr()
	if err != nil {
		return nil, err
	}
	return openUDP(a, 0)
}

// Pinger makes single raw UDP round trips from one blocking socket to
// any RemoteServer's echo, for callers that lay out their own pattern of
// round trips (which echo, in what order, with what between them), such
// as the cold-peer benchmark's "one round trip to the meta service's
// host, then one to the peer's" beside krfs's meta READ and data READ.
type Pinger struct {
	cli       *udpSock
	req, resp []byte
	to        sockaddr
}

// NewPinger opens a Pinger bound to h's address whose round trips carry
// size bytes.
func (h Host) NewPinger(size int) (*Pinger, error) {
	cli, err := h.udpClient("NewPinger", 1, size)
	if err != nil {
		return nil, err
	}
	return &Pinger{cli: cli, req: make([]byte, size), resp: make([]byte, size+1)}, nil
}

// RoundTrip sends one datagram to the echo at to and waits for it to come
// back: the time from just before the sendto to just after the recvfrom.
// A reply not back within a second is ErrNoReply.
func (p *Pinger) RoundTrip(to netip.AddrPort) (time.Duration, error) {
	p.to.set(to)
	t0 := time.Now()
	if err := sendto(p.cli.fd, p.req, &p.to); err != nil {
		return 0, fmt.Errorf("baseline: Pinger sendto %v: %w", to, err)
	}
	n, err := recvfrom(p.cli.fd, p.resp, nil)
	d := time.Since(t0)
	switch {
	case errors.Is(err, unix.EAGAIN):
		return 0, fmt.Errorf("%w: UDP echo from %v not back within %v", ErrNoReply, to, udpTimeout)
	case err != nil:
		return 0, fmt.Errorf("baseline: Pinger recvfrom: %w", err)
	case n != len(p.req):
		return 0, fmt.Errorf("baseline: Pinger: echo of %d bytes from %v, want %d", n, to, len(p.req))
	}
	return d, nil
}

// Close closes the Pinger's socket.
func (p *Pinger) Close() { p.cli.close() }

// TCPBandwidthTo is TCPBandwidth against a RemoteServer's TCP server at to
// (whose message size must be msgSize).
func TCPBandwidthTo(to netip.AddrPort, msgSize int, total int64, depth int) (float64, error) {
	if total < 1 || depth < 1 {
		return 0, errors.New("baseline: TCPBandwidthTo: total and depth must be positive")
	}
	deadline := time.Now().Add(10*time.Second + time.Duration(total/10e6)*time.Second)
	return fetchMessages(to, msgSize, total, depth, deadline)
}
