package softnic

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// The connection manager brings RC QPs up with a three-way handshake over
// the device's own packets (QPN 0), like rdma_cm:
//
//	active                      passive
//	RESET->INIT  --CM_REQ-->    accept(): QP RESET->INIT->RTR->RTS
//	INIT->RTR->RTS <--CM_REP--
//	             --CM_RTU-->    handshake state released
//
// CM_REQ carries the active QP's QPN, start PSN and MTU and a connection
// ID; CM_REP the passive QP's. Lost packets are repaired by the active
// side resending CM_REQ; the passive side answers a repeated request from
// its record of the connection instead of accepting twice. CM_REJ ends a
// request (no listener, accept refused).
//
// Resends back off: the first after cmResend, each later one after twice
// the previous wait, at most cmResendMax, on the device's clock. A passive
// side that is slow to answer (its host starved of CPU) is then not sent
// a duplicate every cmResend for as long as it is slow: with many
// requesters at once, duplicates it must still parse, check and answer
// would be most of its work, its receive queue would fill with requests
// whose requesters had given up, and no handshake would complete.
//
// Flood resistance. Without a cluster key the passive side keeps no state
// and calls no accept function for a CM_REQ until the requester has shown
// that it receives at its source address: the first CM_REQ is answered
// with a CM_REJ carrying a cookie (a MAC of the address and connection ID
// under a secret of the device, valid for 10-20 s) and nothing else, and
// only a CM_REQ echoing that cookie goes on, as with TCP's SYN cookies.
// With a cluster key, CM packets travel in authenticated sessions bound to
// the peer's address, so that proof is already made and unauthenticated
// requests are dropped before the connection manager sees them. Either
// way a source IP may hold at most cmMaxPerSource handshake records (a
// connection accepted but not yet confirmed by CM_RTU), the device at most
// cmMaxRecords, and a record lives cmRecordTL.
const (
	cmResend       = 20 * time.Millisecond
	cmResendMax    = time.Second
	cmDefault      = 2 * time.Second
	cmRecordTL     = 5 * time.Second
	cmMaxPerSource = 64
	cmMaxRecords   = 4096
	cmCookieEpoch  = 10 * time.Second
)

type cmReply struct {
	h       wire.Header
	private []byte
}

type cmKey struct {
	from netip.AddrPort
	id   uint64
}

type cmRecord struct {
	rep     wire.Header
	private []byte
	at      time.Time
}

// cmAged is a record of cmState.aged.
type cmAged struct {
	k cmKey
	r *cmRecord
}

type cmState struct {
	mu      sync.Mutex // guards the maps and aged
	pending map[uint64]chan cmReply
	done    map[cmKey]*cmRecord
	perSrc  map[netip.Addr]int // records per source IP
	// aged lists the records in the order they were made, oldest first
	// from agedHead, so that expiring them costs what expires, not a scan
	// of every record at every request (a storm of requests made that
	// scan most of a passive side's work). Entries of records since
	// dropped or replaced are skipped, and compacted away when they are
	// most of the list (or when the skipped head is).
	aged      []cmAged
	agedHead  int
	secret    [32]byte      // cookie key, immutable after init
	macs      sync.Pool     // of hash.Hash: HMAC-SHA256 under secret
	cookies   atomic.Uint64 // cookies sent
	limited   atomic.Uint64 // requests refused by the record limits
	badCookie atomic.Uint64 // requests with a stale or forged cookie
}

func (c *cmState) init() {
	c.pending = make(map[uint64]chan cmReply)
	c.done = make(map[cmKey]*cmRecord)
	c.perSrc = make(map[netip.Addr]int)
	fillRandom(c.secret[:])
}

// CMStats are the connection manager's flood counters.
type CMStats struct {
	Records      int    // connections accepted, not yet confirmed by CM_RTU
	CookiesSent  uint64 // CM_REQs answered with a cookie
	BadCookies   uint64 // CM_REQs whose cookie was stale or forged (answered with a new one)
	LimitRejects uint64 // CM_REQs refused by the per-source or total record limit
}

// CMStats returns the connection manager's counters.
func (d *Device) CMStats() CMStats {
	d.cm.mu.Lock()
	n := len(d.cm.done)
	d.cm.mu.Unlock()
	return CMStats{Records: n, CookiesSent: d.cm.cookies.Load(), BadCookies: d.cm.badCookie.Load(), LimitRejects: d.cm.limited.Load()}
}

// cookie is the CM cookie for a request from from with connection ID id
// in cookie epoch e (never 0).
func (c *cmState) cookie(from netip.AddrPort, id uint64, e int64) uint64 {
	// A keyed HMAC is reused (Reset restores its keyed state): making
	// one per request hashed the key twice and allocated, a tenth of a
	// passive side's work in a storm of connection requests.
	m, _ := c.macs.Get().(hash.Hash)
	if m == nil {
		m = hmac.New(sha256.New, c.secret[:])
	} else {
		m.Reset()
	}
	var buf [18 + 16]byte
	b, _ := from.AppendBinary(buf[:0])
	b = binary.BigEndian.AppendUint64(b, id)
	b = binary.BigEndian.AppendUint64(b, uint64(e))
	m.Write(b)
	var sum [sha256.Size]byte
	v := binary.BigEndian.Uint64(m.Sum(sum[:0])) | 1
	c.macs.Put(m)
	return v
}

// cookieOK checks the cookie of a CM_REQ; otherwise it answers with a
// fresh cookie and reports false.
func (c *cmState) cookieOK(d *Device, from netip.AddrPort, h *wire.Header) bool {
	e := d.clock.Now().UnixNano() / int64(cmCookieEpoch)
	if h.Cookie != 0 && (h.Cookie == c.cookie(from, h.ConnID, e) || h.Cookie == c.cookie(from, h.ConnID, e-1)) {
		return true
	}
	if h.Cookie != 0 {
		c.badCookie.Add(1)
	}
	c.cookies.Add(1)
	rej := wire.Header{Op: wire.OpCMRej, Service: h.Service, ConnID: h.ConnID, Cookie: c.cookie(from, h.ConnID, e)}
	d.rxOut.add(from, &rej, []byte(wire.CookieReason))
	return false
}

// ListenRC registers a CM service.
func (d *Device) ListenRC(service uint32, accept verbs.AcceptFunc) error {
	if accept == nil {
		return fmt.Errorf("%w: nil accept function", verbs.ErrInvalidArg)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return verbs.ErrClosed
	}
	if _, dup := d.listeners[service]; dup {
		return fmt.Errorf("%w: %s already has a listener", verbs.ErrInvalidArg, verbs.ServiceName(service))
	}
	d.listeners[service] = accept
	return nil
}

// StopListenRC removes a CM service; later requests for it are rejected.
func (d *Device) StopListenRC(service uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.listeners[service]; !ok {
		return fmt.Errorf("%w: no listener for %s", verbs.ErrInvalidArg, verbs.ServiceName(service))
	}
	delete(d.listeners, service)
	return nil
}

// ConnectRC connects qp (in RESET) to a service on a remote device. Without
// a deadline on ctx it gives up after 2 s.
func (d *Device) ConnectRC(ctx context.Context, vqp verbs.QP, remote netip.AddrPort, service uint32, p verbs.ConnParams) ([]byte, error) {
	q, ok := vqp.(*qp)
	if !ok || q.dev != d || q.typ != verbs.RC {
		return nil, fmt.Errorf("%w: ConnectRC needs an RC QP of this device", verbs.ErrInvalidArg)
	}
	if len(p.Private) > wire.MaxPrivate {
		return nil, fmt.Errorf("%w: %d bytes of private data, max %d", verbs.ErrLength, len(p.Private), wire.MaxPrivate)
	}
	if !remote.IsValid() {
		return nil, fmt.Errorf("%w: remote address %v", verbs.ErrInvalidArg, remote)
	}
	if q.State() != verbs.StateReset {
		return nil, fmt.Errorf("%w: ConnectRC needs a QP in RESET", verbs.ErrQPState)
	}
	if _, has := ctx.Deadline(); !has {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cmDefault)
		defer cancel()
	}
	mtu := p.PathMTU
	if mtu == 0 {
		mtu = d.mtu
	}
	if err := q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: p.Access, PathMTU: mtu}); err != nil {
		return nil, err
	}
	d.mu.Lock()
	startPSN := d.rng.Uint32N(wire.PSNMask + 1)
	d.mu.Unlock()
	id := randUint64()
	ch := make(chan cmReply, 1)
	d.cm.mu.Lock()
	d.cm.pending[id] = ch
	d.cm.mu.Unlock()
	defer func() {
		d.cm.mu.Lock()
		delete(d.cm.pending, id)
		d.cm.mu.Unlock()
	}()
	if d.auth != nil {
		if err := d.auth.ensure(ctx, remote); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w: %v: no authenticated session (handshake unanswered)", verbs.ErrCMTimeout, remote)
			}
			return fail0(q, err)
		}
	}
	req := wire.Header{Op: wire.OpCMReq, Service: service, CMQPN: q.qpn, CMPSN: startPSN, CMMTU: uint32(mtu), ConnID: id}
	fail := func(err error) ([]byte, error) {
		_ = q.Modify(verbs.QPAttr{State: verbs.StateReset})
		return nil, err
	}
	wait := cmResend
	var resend chan struct{}
	var t link.Timer
	send := func() {
		d.sendNow(remote, &req, p.Private)
		d.stopLinger() // the reply comes to a waiter that does not drive
		fire := make(chan struct{})
		resend, t = fire, d.clock.AfterFunc(wait, func() { close(fire) })
	}
	send()
	defer func() { t.Stop() }()
	for {
		select {
		case rep := <-ch:
			if rep.h.Op == wire.OpCMRej && rep.h.Cookie != 0 && string(rep.private) == wire.CookieReason {
				if rep.h.Cookie == req.Cookie {
					// The answer to a resent request without the
					// cookie: the request with it is on its way.
					continue
				}
				req.Cookie = rep.h.Cookie // prove we receive here, and ask again
				t.Stop()
				wait = cmResend
				send()
				continue
			}
			if rep.h.Op == wire.OpCMRej {
				return fail(fmt.Errorf("%w by %v: %s", verbs.ErrCMRejected, remote, rep.private))
			}
			pmtu := min(mtu, int(rep.h.CMMTU))
			err := q.Modify(verbs.QPAttr{State: verbs.StateRTR, RemoteAddr: remote, RemoteQPN: rep.h.CMQPN,
				RQPSN: rep.h.CMPSN, PathMTU: pmtu})
			if err == nil {
				err = q.Modify(verbs.QPAttr{State: verbs.StateRTS, SQPSN: startPSN, Timeout: p.Timeout,
					RetryCnt: p.RetryCnt, RNRRetry: p.RNRRetry})
			}
			if err != nil {
				return fail(err)
			}
			rtu := wire.Header{Op: wire.OpCMRTU, Service: service, CMQPN: q.qpn, ConnID: id}
			d.sendNow(remote, &rtu, nil)
			return rep.private, nil
		case <-resend:
			wait = min(2*wait, cmResendMax)
			send()
		case <-ctx.Done():
			err := ctx.Err()
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w: %v, %s", verbs.ErrCMTimeout, remote, verbs.ServiceName(service))
			}
			return fail(err)
		}
	}
}

// onPacket handles CM packets on the receive path (rxMu held).
func (c *cmState) onPacket(d *Device, from netip.AddrPort, h *wire.Header, payload []byte) {
	switch h.Op {
	case wire.OpCMRep, wire.OpCMRej:
		c.mu.Lock()
		ch := c.pending[h.ConnID]
		c.mu.Unlock()
		if ch != nil {
			select {
			case ch <- cmReply{h: *h, private: append([]byte(nil), payload...)}:
			default:
			}
		}
	case wire.OpCMRTU:
		c.mu.Lock()
		c.dropLocked(cmKey{from, h.ConnID})
		c.mu.Unlock()
	case wire.OpCMReq:
		c.onRequest(d, from, h, payload)
	}
}

func (c *cmState) dropLocked(k cmKey) {
	if _, ok := c.done[k]; ok {
		delete(c.done, k)
		if c.perSrc[k.from.Addr()]--; c.perSrc[k.from.Addr()] <= 0 {
			delete(c.perSrc, k.from.Addr())
		}
	}
}

// addLocked records r for k (replacing a record k had).
func (c *cmState) addLocked(k cmKey, r *cmRecord) {
	if _, dup := c.done[k]; !dup {
		c.perSrc[k.from.Addr()]++
	}
	c.done[k] = r
	c.aged = append(c.aged, cmAged{k, r})
	if live := len(c.aged) - c.agedHead; live > 2*len(c.done)+64 || c.agedHead > len(c.aged)/2 {
		kept := c.aged[:0]
		for _, e := range c.aged[c.agedHead:] {
			if c.done[e.k] == e.r {
				kept = append(kept, e)
			}
		}
		clear(c.aged[len(kept):])
		c.aged, c.agedHead = kept, 0
	}
}

// expireLocked drops the records older than cmRecordTL at now.
func (c *cmState) expireLocked(now time.Time) {
	for c.agedHead < len(c.aged) {
		e := c.aged[c.agedHead]
		if c.done[e.k] == e.r {
			if now.Sub(e.r.at) <= cmRecordTL {
				break
			}
			c.dropLocked(e.k)
		}
		c.aged[c.agedHead] = cmAged{}
		c.agedHead++
	}
	if c.agedHead == len(c.aged) {
		c.aged, c.agedHead = c.aged[:0], 0
	}
}

func (c *cmState) onRequest(d *Device, from netip.AddrPort, h *wire.Header, payload []byte) {
	if d.auth == nil && !c.cookieOK(d, from, h) {
		return
	}
	key := cmKey{from, h.ConnID}
	now := d.clock.Now()
	reject := func(why string) {
		rej := wire.Header{Op: wire.OpCMRej, Service: h.Service, ConnID: h.ConnID}
		d.rxOut.add(from, &rej, []byte(why))
	}
	c.mu.Lock()
	c.expireLocked(now)
	rec := c.done[key]
	full := len(c.done) >= cmMaxRecords || c.perSrc[from.Addr()] >= cmMaxPerSource
	c.mu.Unlock()
	if rec != nil {
		d.rxOut.add(from, &rec.rep, rec.private)
		return
	}
	if full {
		c.limited.Add(1)
		reject(fmt.Sprintf("too many unconfirmed connection requests from %v", from.Addr()))
		return
	}
	d.mu.RLock()
	accept := d.listeners[h.Service]
	d.mu.RUnlock()
	if accept == nil {
		reject(fmt.Sprintf("no listener for %s", verbs.ServiceName(h.Service)))
		return
	}
	vq, priv, err := accept(verbs.ConnRequest{RemoteAddr: from, RemoteQPN: h.CMQPN, Private: append([]byte(nil), payload...)})
	if err != nil {
		reject(err.Error())
		return
	}
	q, ok := vq.(*qp)
	if !ok || q.dev != d || q.typ != verbs.RC || len(priv) > wire.MaxPrivate {
		reject("accept returned an unusable QP")
		return
	}
	mtu := min(int(h.CMMTU), d.mtu)
	if mtu < 256 {
		reject("path MTU too small")
		return
	}
	d.mu.Lock()
	startPSN := d.rng.Uint32N(wire.PSNMask + 1)
	d.mu.Unlock()
	err = q.Modify(verbs.QPAttr{State: verbs.StateInit, PathMTU: mtu, Access: q.attrAccess()})
	if err == nil {
		err = q.Modify(verbs.QPAttr{State: verbs.StateRTR, RemoteAddr: from, RemoteQPN: h.CMQPN, RQPSN: h.CMPSN})
	}
	if err == nil {
		err = q.Modify(verbs.QPAttr{State: verbs.StateRTS, SQPSN: startPSN})
	}
	if err != nil {
		reject(err.Error())
		return
	}
	rep := wire.Header{Op: wire.OpCMRep, Service: h.Service, CMQPN: q.qpn, CMPSN: startPSN, CMMTU: uint32(mtu), ConnID: h.ConnID}
	c.mu.Lock()
	c.addLocked(key, &cmRecord{rep: rep, private: append([]byte(nil), priv...), at: now})
	c.mu.Unlock()
	d.rxOut.add(from, &rep, priv)
}

// attrAccess is the remote access a passively connected QP grants: the
// flags set on it before (QPs keep Access across RESET), or all the
// remote access the device has (atomics only with them), leaving the
// decision to each MR's own access flags.
func (q *qp) attrAccess() verbs.Access {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.attr.Access != 0 {
		return q.attr.Access
	}
	if q.dev.atomics == verbs.AtomicNone {
		return verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	}
	return verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
}

// fail0 returns a QP moved to INIT by ConnectRC to RESET and reports err.
func fail0(q *qp, err error) ([]byte, error) {
	_ = q.Modify(verbs.QPAttr{State: verbs.StateReset})
	return nil, err
}
