package rdma

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/krfs/krfs/verbs"
)

// The connection manager of this backend runs out of band, over UDP,
// because RDMA hardware has no krfs control path of its own (rdma_cm
// would need IP-over-IB or RoCE addresses plus librdmacm; this keeps the
// dependency to libibverbs). Each device has one CM socket; its address
// is the device's verbs address (Device.Addr), which is what meta
// publishes and what DCTarget.Addr and QPAttr.RemoteAddr name.
//
//	active                         passive
//	QP RESET                --REQ-->  accept(): QP RESET->INIT->RTR->RTS
//	                        <--REP--  (QPN, PSN, MTU, GID, LID of each side)
//	QP RESET->INIT->RTR->RTS
//	                        --RTU-->  handshake record dropped
//
// The active side resends REQ every 20 ms until a REP or REJ or its
// context ends; the passive side answers a repeated REQ from its record
// instead of accepting twice. ADDR_QUERY/ADDR_REPLY resolve a CM address
// to the GID and LID of the port behind it, for DC targets and for RC QPs
// connected by hand with Modify; answers are cached.
//
// The CM socket is plain UDP: anyone who can reach it can ask for
// connections, exactly like rdma_cm. Data never flows through it.
const (
	cmResend    = 20 * time.Millisecond
	cmDefault   = 2 * time.Second
	cmRecordTTL = 30 * time.Second
	cmResolveTO = time.Second
)

// endpoint is what RTR needs of a peer QP.
type endpoint struct {
	Addr netip.AddrPort // the peer device's CM address
	GID  GID
	LID  uint16
	QPN  uint32
	PSN  uint32
	MTU  int
}

// cmHost is what the connection manager needs of a device.
type cmHost interface {
	// localPort is this device's port: its GID, LID and number.
	localPort() (GID, uint16, uint8)
	maxMTU() int
	// ownRC reports whether q is an RC QP of this device in RESET.
	ownRC(q verbs.QP) error
	// bringUp moves q from RESET to RTS connected to peer. p.Access 0
	// means the QP's own access, or if it has none all remote access the
	// device supports (atomics only with atomics).
	bringUp(q verbs.QP, peer endpoint, sqPSN uint32, p verbs.ConnParams) error
}

type cmKey struct {
	from netip.AddrPort
	id   uint64
}

type cmRecord struct {
	rep cmMsg
	at  time.Time
}

type cmConn struct {
	host cmHost
	sock *net.UDPConn
	addr netip.AddrPort
	wg   sync.WaitGroup

	mu        sync.Mutex // guards the fields below
	closed    bool
	listeners map[uint32]verbs.AcceptFunc
	pending   map[uint64]chan cmMsg
	done      map[cmKey]*cmRecord
	addrs     map[netip.AddrPort]endpoint // resolved GID and LID per CM address
}

// listenCM opens the CM socket on addr ("host:port"; port 0 picks one).
func listenCM(host cmHost, addr string) (*cmConn, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma: CM address %q: %w", addr, err)
	}
	sock, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("rdma: CM socket: %w", err)
	}
	c := &cmConn{host: host, sock: sock, addr: sock.LocalAddr().(*net.UDPAddr).AddrPort(),
		listeners: map[uint32]verbs.AcceptFunc{}, pending: map[uint64]chan cmMsg{},
		done: map[cmKey]*cmRecord{}, addrs: map[netip.AddrPort]endpoint{}}
	c.addr = netip.AddrPortFrom(c.addr.Addr().Unmap(), c.addr.Port())
	if c.addr.Addr().IsUnspecified() {
		// Bound to every interface: peers need one address to name this
		// device by, so publish the host's first global unicast address.
		if ip, ok := hostIP(); ok {
			c.addr = netip.AddrPortFrom(ip, c.addr.Port())
		}
	}
	c.wg.Add(1)
	go c.run()
	return c, nil
}

// hostIP is the first global unicast address of an up interface,
// preferring IPv4.
func hostIP() (netip.Addr, bool) {
	ifs, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, false
	}
	var v6 netip.Addr
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			p, err := netip.ParsePrefix(a.String())
			if err != nil || !p.Addr().IsGlobalUnicast() {
				continue
			}
			if p.Addr().Is4() {
				return p.Addr(), true
			}
			if !v6.IsValid() {
				v6 = p.Addr()
			}
		}
	}
	return v6, v6.IsValid()
}

func (c *cmConn) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	err := c.sock.Close()
	c.wg.Wait()
	return err
}

func (c *cmConn) send(to netip.AddrPort, m *cmMsg) {
	b, err := appendCM(make([]byte, 0, cmHeaderLen+len(m.Private)), m)
	if err != nil {
		return
	}
	_, _ = c.sock.WriteToUDPAddrPort(b, to)
}

func (c *cmConn) listen(service uint32, accept verbs.AcceptFunc) error {
	if accept == nil {
		return fmt.Errorf("%w: nil accept function", verbs.ErrInvalidArg)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return verbs.ErrClosed
	}
	if _, dup := c.listeners[service]; dup {
		return fmt.Errorf("%w: %s already has a listener", verbs.ErrInvalidArg, verbs.ServiceName(service))
	}
	c.listeners[service] = accept
	return nil
}

func (c *cmConn) stopListen(service uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.listeners[service]; !ok {
		return fmt.Errorf("%w: no listener for %s", verbs.ErrInvalidArg, verbs.ServiceName(service))
	}
	delete(c.listeners, service)
	return nil
}

func randID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// exchange sends m (with a fresh connection ID) to remote every cmResend
// until a reply with the same ID arrives or ctx ends.
func (c *cmConn) exchange(ctx context.Context, remote netip.AddrPort, m *cmMsg) (cmMsg, error) {
	m.ConnID = randID()
	ch := make(chan cmMsg, 1)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return cmMsg{}, verbs.ErrClosed
	}
	c.pending[m.ConnID] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, m.ConnID)
		c.mu.Unlock()
	}()
	tick := time.NewTicker(cmResend)
	defer tick.Stop()
	for {
		c.send(remote, m)
		select {
		case r := <-ch:
			return r, nil
		case <-tick.C:
		case <-ctx.Done():
			return cmMsg{}, ctx.Err()
		}
	}
}

// connect is Device.ConnectRC.
func (c *cmConn) connect(ctx context.Context, q verbs.QP, remote netip.AddrPort, service uint32, p verbs.ConnParams) ([]byte, error) {
	if err := c.host.ownRC(q); err != nil {
		return nil, err
	}
	if len(p.Private) > MaxPrivate {
		return nil, fmt.Errorf("%w: %d bytes of private data, max %d", verbs.ErrLength, len(p.Private), MaxPrivate)
	}
	if !remote.IsValid() {
		return nil, fmt.Errorf("%w: remote address %v", verbs.ErrInvalidArg, remote)
	}
	if _, has := ctx.Deadline(); !has {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cmDefault)
		defer cancel()
	}
	mtu := p.PathMTU
	if mtu == 0 || mtu > c.host.maxMTU() {
		mtu = c.host.maxMTU()
	}
	gid, lid, port := c.host.localPort()
	psn := uint32(randID()) & 0xffffff
	req := cmMsg{Kind: cmReq, Service: service, QPN: q.QPN(), PSN: psn, MTU: uint32(mtu), GID: gid, LID: lid, Port: port, Private: p.Private}
	rep, err := c.exchange(ctx, remote, &req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %v, %s", verbs.ErrCMTimeout, remote, verbs.ServiceName(service))
		}
		return nil, err
	}
	if rep.Kind == cmRej {
		return nil, fmt.Errorf("%w by %v: %s", verbs.ErrCMRejected, remote, rep.Private)
	}
	if rep.Kind != cmRep {
		return nil, fmt.Errorf("%w: %v answered a REQ with %v", verbs.ErrCMRejected, remote, rep.Kind)
	}
	peer := endpoint{Addr: remote, GID: rep.GID, LID: rep.LID, QPN: rep.QPN, PSN: rep.PSN, MTU: min(mtu, int(rep.MTU))}
	c.remember(peer)
	p.PathMTU = peer.MTU
	if err := c.host.bringUp(q, peer, psn, p); err != nil {
		return nil, err
	}
	c.send(remote, &cmMsg{Kind: cmRTU, ConnID: req.ConnID, Service: service, QPN: q.QPN()})
	return append([]byte(nil), rep.Private...), nil
}

func (c *cmConn) remember(e endpoint) {
	c.mu.Lock()
	c.addrs[e.Addr] = endpoint{Addr: e.Addr, GID: e.GID, LID: e.LID}
	c.mu.Unlock()
}

// forget drops what resolve learnt of addr, so that the next resolve asks
// again (a peer restarted on another port or GID).
func (c *cmConn) forget(addr netip.AddrPort) {
	c.mu.Lock()
	delete(c.addrs, addr)
	c.mu.Unlock()
}

// resolve returns the GID and LID behind a CM address, asking it once.
func (c *cmConn) resolve(ctx context.Context, addr netip.AddrPort) (endpoint, error) {
	if addr == c.addr {
		gid, lid, _ := c.host.localPort()
		return endpoint{Addr: addr, GID: gid, LID: lid}, nil
	}
	c.mu.Lock()
	e, ok := c.addrs[addr]
	c.mu.Unlock()
	if ok {
		return e, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cmResolveTO)
	defer cancel()
	r, err := c.exchange(ctx, addr, &cmMsg{Kind: cmAddrQ})
	if err != nil {
		return endpoint{}, fmt.Errorf("%w: resolving %v: %v", verbs.ErrNoSuchTarget, addr, err)
	}
	e = endpoint{Addr: addr, GID: r.GID, LID: r.LID}
	c.remember(e)
	return e, nil
}

func (c *cmConn) run() {
	defer c.wg.Done()
	buf := make([]byte, 2048)
	for {
		n, from, err := c.sock.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		m, err := parseCM(buf[:n])
		if err != nil {
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		c.onMsg(from, m)
	}
}

func (c *cmConn) onMsg(from netip.AddrPort, m cmMsg) {
	switch m.Kind {
	case cmRep, cmRej, cmAddrR:
		m.Private = append([]byte(nil), m.Private...)
		c.mu.Lock()
		ch := c.pending[m.ConnID]
		c.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m:
			default:
			}
		}
	case cmRTU:
		c.mu.Lock()
		delete(c.done, cmKey{from, m.ConnID})
		c.mu.Unlock()
	case cmAddrQ:
		gid, lid, port := c.host.localPort()
		c.send(from, &cmMsg{Kind: cmAddrR, ConnID: m.ConnID, GID: gid, LID: lid, Port: port, MTU: uint32(c.host.maxMTU())})
	case cmReq:
		c.onRequest(from, m)
	}
}

func (c *cmConn) onRequest(from netip.AddrPort, m cmMsg) {
	key := cmKey{from, m.ConnID}
	now := time.Now()
	c.mu.Lock()
	for k, r := range c.done {
		if now.Sub(r.at) > cmRecordTTL {
			delete(c.done, k)
		}
	}
	rec := c.done[key]
	accept := c.listeners[m.Service]
	c.mu.Unlock()
	if rec != nil {
		c.send(from, &rec.rep)
		return
	}
	reject := func(why string) {
		if len(why) > MaxPrivate {
			why = why[:MaxPrivate]
		}
		c.send(from, &cmMsg{Kind: cmRej, ConnID: m.ConnID, Service: m.Service, Private: []byte(why)})
	}
	if accept == nil {
		reject(fmt.Sprintf("no listener for %s", verbs.ServiceName(m.Service)))
		return
	}
	q, priv, err := accept(verbs.ConnRequest{RemoteAddr: from, RemoteQPN: m.QPN, Private: append([]byte(nil), m.Private...)})
	if err != nil {
		reject(err.Error())
		return
	}
	if err := c.host.ownRC(q); err != nil || len(priv) > MaxPrivate {
		reject("accept returned an unusable QP")
		return
	}
	mtu := min(int(m.MTU), c.host.maxMTU())
	if mtu < 256 {
		reject("path MTU too small")
		return
	}
	peer := endpoint{Addr: from, GID: m.GID, LID: m.LID, QPN: m.QPN, PSN: m.PSN, MTU: mtu}
	c.remember(peer)
	psn := uint32(randID()) & 0xffffff
	if err := c.host.bringUp(q, peer, psn, verbs.ConnParams{PathMTU: mtu}); err != nil {
		reject(err.Error())
		return
	}
	gid, lid, port := c.host.localPort()
	rep := cmMsg{Kind: cmRep, ConnID: m.ConnID, Service: m.Service, QPN: q.QPN(), PSN: psn, MTU: uint32(mtu),
		GID: gid, LID: lid, Port: port, Private: append([]byte(nil), priv...)}
	c.mu.Lock()
	c.done[key] = &cmRecord{rep: rep, at: now}
	c.mu.Unlock()
	c.send(from, &rep)
}
