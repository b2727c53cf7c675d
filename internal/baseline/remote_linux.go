package baseline

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
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
	if err := checkUDPArgs("UDPPingPongTo", iters, size); err != nil {
		return nil, err
	}
	a, err := h.addr()
	if err != nil {
		return nil, err
	}
	cli, err := openUDP(a, 0)
	if err != nil {
		return nil, err
	}
	defer cli.close()
	var sa sockaddr
	sa.set(to)
	return pingPong(cli, &sa, iters, size)
}

// TCPBandwidthTo is TCPBandwidth against a RemoteServer's TCP server at to
// (whose message size must be msgSize).
func TCPBandwidthTo(to netip.AddrPort, msgSize int, total int64, depth int) (float64, error) {
	if total < 1 || depth < 1 {
		return 0, errors.New("baseline: TCPBandwidthTo: total and depth must be positive")
	}
	deadline := time.Now().Add(10*time.Second + time.Duration(total/10e6)*time.Second)
	return fetchMessages(to, msgSize, total, depth, deadline)
}
