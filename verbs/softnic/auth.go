package softnic

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"hash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/internal/replay"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// Packet authentication with a cluster key.
//
// Two devices that share the cluster key K talk only inside a session, set
// up by a two-message handshake and bound to the peer's UDP address:
//
//	initiator I                                  responder R
//	HS_INIT{idxI, tsI, nI}  tag under Kh  -->    check tag; tsI > last tsI from this address
//	                                        <--  HS_RESP{idxR, idxI, nR, nI} tag under Kh
//	both: kI2R, kR2I = HKDF-SHA256(K, salt nI|nR, info idxI|idxR|tsI)
//
// Kh = HKDF(K, "handshake"). nI and nR are fresh 32-byte nonces, tsI a
// timestamp that grows with every initiation of a device. Every other
// packet carries AuthETH: the receiver's session index, a 64-bit counter
// that the sender takes from the session at the moment it signs (so a
// retransmission is a new packet with a new counter) and a tag: HMAC-SHA256
// of the packet under the direction's key, or with Config.Encrypt the
// AES-256-GCM tag of the encrypted payload with the counter as nonce. A
// receiver drops a packet whose session it does not know, whose source
// address is not the session's peer, whose tag is wrong, or whose counter
// it has seen or is too old for its replay window (internal/replay).
//
// A device starts a handshake when it has a packet for an address without
// a session (the packet is parked, up to parkLimit per peer, and sent once
// the session exists) and when it receives an authenticated-looking packet
// from an address whose session it does not know (the peer restarted or
// lost the response): the peer then re-keys. A replayed HS_INIT is refused
// (its timestamp is not newer) or, sent from another address, creates a
// session whose keys only a holder of K that saw nR could compute, which
// is evicted when room is needed.
const (
	nonceLen        = 32
	hsInitLen       = 4 + 8 + nonceLen
	hsRespLen       = 4 + 4 + 2*nonceLen
	hsRetry         = 20 * time.Millisecond // resend an initiation no sooner
	parkLimit       = 256                   // packets parked per peer awaiting a session
	sessionsPerPeer = 4                     // receive sessions kept per peer
	maxPeers        = 8192                  // addresses with handshake state
)

// AuthStats are the counters of packet authentication. Every drop here
// is also counted in verbs.DeviceStats.BadMAC.
type AuthStats struct {
	Sessions      int    // sessions currently known
	Handshakes    uint64 // sessions established (either role)
	BadTag        uint64 // packets without AuthETH or with a wrong tag
	NoSession     uint64 // packets naming an unknown session
	WrongSource   uint64 // packets of a session arriving from another address
	Replayed      uint64 // packets whose counter was seen or is too old
	StaleInit     uint64 // HS_INITs whose timestamp is not newer (replays)
	Parked        uint64 // packets parked awaiting a session (copied once)
	ParkedDropped uint64 // parked packets dropped (queue full)
	Encrypted     uint64 // payload bytes encrypted (Config.Encrypt)
}

// authState is a device's authentication engine; nil without a key.
type authState struct {
	d       *Device
	key     []byte // the cluster key
	hsKey   []byte
	encrypt bool

	rxTag hash.Hash // handshake/receive HMAC scratch; guarded by the device's rxMu

	mu      sync.Mutex // guards the fields below
	peers   map[netip.AddrPort]*authPeer
	byIndex map[uint32]*session
	lastTS  int64

	st struct {
		handshakes, badTag, noSession, wrongSource, replayed atomic.Uint64
		staleInit, parked, parkedDropped, encrypted          atomic.Uint64
	}
}

// authPeer is the handshake state for one remote address.
type authPeer struct {
	addr   netip.AddrPort
	send   atomic.Pointer[session] // the session packets to addr are sent in
	recent []*session              // newest last; at most sessionsPerPeer
	lastTS int64                   // newest HS_INIT timestamp accepted from addr
	// Our outstanding initiation, if any.
	initIdx   uint32
	initNonce [nonceLen]byte
	initTS    int64
	initSent  time.Time
	parked    []link.Packet // header and payload owned here
	ready     chan struct{} // closed when a send session exists
}

// session is one authenticated session with a peer.
type session struct {
	peer     netip.AddrPort
	local    uint32 // our index: peers put it in packets they send us
	remote   uint32 // the peer's index, put in packets we send
	created  time.Time
	sendCtr  atomic.Uint64
	sendPool sync.Pool // hash.Hash under the send key (MAC mode)
	sendAEAD cipher.AEAD
	recvAEAD cipher.AEAD
	recvMAC  hash.Hash     // under the receive key; guarded by rxMu
	win      replay.Window // guarded by rxMu
	heard    atomic.Bool   // a valid packet arrived in this session
}

func newAuth(d *Device, key []byte, encrypt bool) *authState {
	hs, err := hkdf.Key(sha256.New, key, nil, "krfs softnic v1 handshake", 32)
	if err != nil {
		panic(err) // only for absurd lengths
	}
	return &authState{d: d, key: key, hsKey: hs, encrypt: encrypt,
		rxTag:   hmac.New(sha256.New, hs),
		peers:   make(map[netip.AddrPort]*authPeer),
		byIndex: make(map[uint32]*session)}
}

// Stats returns the authentication counters.
func (a *authState) Stats() AuthStats {
	a.mu.Lock()
	n := len(a.byIndex)
	a.mu.Unlock()
	return AuthStats{Sessions: n, Handshakes: a.st.handshakes.Load(), BadTag: a.st.badTag.Load(),
		NoSession: a.st.noSession.Load(), WrongSource: a.st.wrongSource.Load(), Replayed: a.st.replayed.Load(),
		StaleInit: a.st.staleInit.Load(), Parked: a.st.parked.Load(), ParkedDropped: a.st.parkedDropped.Load(),
		Encrypted: a.st.encrypted.Load()}
}

// overhead is what authentication adds to a packet beyond AuthETH: the
// GCM tag after an encrypted payload.
func (a *authState) overhead() int {
	if a != nil && a.encrypt {
		return 16
	}
	return 0
}

func (a *authState) newSession(peer netip.AddrPort, local, remote uint32, sendKey, recvKey []byte) *session {
	s := &session{peer: peer, local: local, remote: remote, created: a.d.clock.Now()}
	if a.encrypt {
		s.sendAEAD = mustGCM(sendKey)
		s.recvAEAD = mustGCM(recvKey)
	} else {
		sk := append([]byte(nil), sendKey...)
		s.sendPool.New = func() any { return hmac.New(sha256.New, sk) }
		s.recvMAC = hmac.New(sha256.New, recvKey)
	}
	return s
}

func mustGCM(key []byte) cipher.AEAD {
	b, err := aes.NewCipher(key)
	if err != nil {
		panic(err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		panic(err)
	}
	return g
}

// sessionKeys derives the initiator->responder and responder->initiator
// keys of a session.
func (a *authState) sessionKeys(nI, nR []byte, idxI, idxR uint32, ts int64) (i2r, r2i []byte) {
	salt := append(append([]byte(nil), nI...), nR...)
	info := binary.BigEndian.AppendUint32([]byte("krfs softnic v1 session"), idxI)
	info = binary.BigEndian.AppendUint32(info, idxR)
	info = binary.BigEndian.AppendUint64(info, uint64(ts))
	k, err := hkdf.Key(sha256.New, a.key, salt, string(info), 64)
	if err != nil {
		panic(err)
	}
	return k[:32], k[32:]
}

// newIndexLocked picks an unused nonzero session index.
func (a *authState) newIndexLocked() uint32 {
	for {
		i := uint32(randUint64())
		if _, used := a.byIndex[i]; i != 0 && !used {
			return i
		}
	}
}

// peerLocked returns the state for addr, creating it (and evicting a peer
// without a usable session if the table is full); nil if it cannot.
func (a *authState) peerLocked(addr netip.AddrPort) *authPeer {
	if p := a.peers[addr]; p != nil {
		return p
	}
	if len(a.peers) >= maxPeers && !a.evictLocked() {
		return nil
	}
	p := &authPeer{addr: addr, ready: make(chan struct{})}
	a.peers[addr] = p
	return p
}

// evictLocked drops the state of one address that has no session in
// which anything was heard (handshake state made by replays and floods).
func (a *authState) evictLocked() bool {
	for addr, p := range a.peers {
		heard := false
		for _, s := range p.recent {
			heard = heard || s.heard.Load()
		}
		if !heard && len(p.parked) == 0 {
			for _, s := range p.recent {
				delete(a.byIndex, s.local)
			}
			if p.initIdx != 0 {
				delete(a.byIndex, p.initIdx)
			}
			delete(a.peers, addr)
			return true
		}
	}
	return false
}

// installLocked adds s as p's newest session and the one to send in.
func (a *authState) installLocked(p *authPeer, s *session) {
	a.byIndex[s.local] = s
	p.recent = append(p.recent, s)
	if len(p.recent) > sessionsPerPeer {
		delete(a.byIndex, p.recent[0].local)
		p.recent = append(p.recent[:0], p.recent[1:]...)
	}
	if p.send.Swap(s) == nil {
		close(p.ready)
	}
	a.st.handshakes.Add(1)
}

// hsTag computes the handshake tag of an encoded handshake packet whose
// tag field is zero.
func hsTag(h hash.Hash, hdr, payload []byte) []byte {
	h.Reset()
	h.Write(hdr)
	h.Write(payload)
	return h.Sum(nil)[:wire.MACLen]
}

// initiateLocked sends an HS_INIT to p unless one was sent less than
// hsRetry ago.
func (a *authState) initiateLocked(p *authPeer) {
	now := a.d.clock.Now()
	if p.initIdx != 0 && now.Sub(p.initSent) < hsRetry {
		return
	}
	if p.initIdx != 0 {
		delete(a.byIndex, p.initIdx) // reserved only
	}
	p.initIdx = a.newIndexLocked()
	a.byIndex[p.initIdx] = nil // reserve the index
	fillRandom(p.initNonce[:])
	p.initTS = max(now.UnixNano(), a.lastTS+1)
	a.lastTS = p.initTS
	p.initSent = now
	payload := binary.BigEndian.AppendUint32(nil, p.initIdx)
	payload = binary.BigEndian.AppendUint64(payload, uint64(p.initTS))
	payload = append(payload, p.initNonce[:]...)
	a.sendHandshake(p.addr, wire.OpHSInit, payload)
}

// sendHandshake signs and sends a handshake packet directly on the link
// (callers may hold any outbox's lock).
func (a *authState) sendHandshake(to netip.AddrPort, op wire.Opcode, payload []byte) {
	if a.d.portDown.Load() {
		return // no link (Device.SetPortActive)
	}
	h := wire.Header{Op: op, Flags: wire.FlagMAC}
	hdr := h.Append(nil)
	copy(wire.MACField(hdr), hsTag(hmac.New(sha256.New, a.hsKey), hdr, payload))
	a.d.stats.txPackets.Add(1)
	a.d.stats.txBytes.Add(uint64(len(hdr) + len(payload)))
	_ = a.d.link.Send([]link.Packet{{To: to, Hdr: hdr, Payload: payload}})
}

// ensure waits until a session with remote exists, initiating (and
// repeating) the handshake.
func (a *authState) ensure(ctx context.Context, remote netip.AddrPort) error {
	tick := clock.NewTicker(a.d.clock, hsRetry)
	defer tick.Stop()
	for {
		a.mu.Lock()
		p := a.peerLocked(remote)
		if p == nil {
			a.mu.Unlock()
			return errAuthTable
		}
		if p.send.Load() != nil {
			a.mu.Unlock()
			return nil
		}
		a.initiateLocked(p)
		ready := p.ready
		a.mu.Unlock()
		a.d.stopLinger() // the answer comes to a waiter that does not drive
		select {
		case <-ready:
			return nil
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// seal signs (and with Encrypt, encrypts) the packets of an outbox before
// they are sent. Packets to an address without a session are parked and
// removed from pkts; it returns the packets left.
func (a *authState) seal(o *outbox, pkts []link.Packet) []link.Packet {
	if a.encrypt {
		need := 0
		for i := range pkts {
			need += len(pkts[i].Payload) + 16
		}
		if cap(o.enc) < need {
			o.enc = make([]byte, 0, need)
		}
		o.enc = o.enc[:0]
	}
	keep := pkts[:0]
	for _, p := range pkts {
		sp := a.sendSession(p.To)
		if sp == nil {
			a.park(p)
			continue
		}
		ctr := sp.sendCtr.Add(1)
		wire.SetAuth(p.Hdr, sp.remote, ctr)
		if a.encrypt {
			p.Hdr[3] |= byte(wire.FlagEnc)
			clear(wire.MACField(p.Hdr))
			var nonce [12]byte
			binary.BigEndian.PutUint64(nonce[4:], ctr)
			start := len(o.enc)
			o.enc = sp.sendAEAD.Seal(o.enc, nonce[:], p.Payload, p.Hdr)
			a.st.encrypted.Add(uint64(len(p.Payload)))
			p.Payload = o.enc[start:len(o.enc):len(o.enc)]
		} else {
			clear(wire.MACField(p.Hdr))
			h := sp.sendPool.Get().(hash.Hash)
			h.Reset()
			h.Write(p.Hdr)
			h.Write(p.Payload)
			var sum [sha256.Size]byte
			copy(wire.MACField(p.Hdr), h.Sum(sum[:0]))
			sp.sendPool.Put(h)
		}
		keep = append(keep, p)
	}
	clear(pkts[len(keep):])
	return keep
}

func (a *authState) sendSession(to netip.AddrPort) *session {
	a.mu.Lock()
	p := a.peers[to]
	a.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.send.Load()
}

// park keeps a copy of a packet for an address without a session and
// starts the handshake; the copy leaves when the session exists.
func (a *authState) park(pk link.Packet) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.peerLocked(pk.To)
	if p == nil {
		a.st.parkedDropped.Add(1)
		return
	}
	if s := p.send.Load(); s != nil {
		// Raced with a handshake that just finished: resend through the
		// normal path later (the protocol retransmits).
		a.st.parkedDropped.Add(1)
		return
	}
	if len(p.parked) >= parkLimit {
		a.st.parkedDropped.Add(1)
		p.parked = append(p.parked[:0], p.parked[1:]...)
	}
	buf := make([]byte, len(pk.Hdr)+len(pk.Payload))
	n := copy(buf, pk.Hdr)
	copy(buf[n:], pk.Payload)
	p.parked = append(p.parked, link.Packet{To: pk.To, Hdr: buf[:n:n], Payload: buf[n:]})
	a.st.parked.Add(1)
	a.initiateLocked(p)
}

// verify authenticates a received non-handshake packet (rxMu held). It
// returns the payload to use (decrypted in place with Encrypt) and
// whether the packet may be processed.
func (a *authState) verify(from netip.AddrPort, h *wire.Header, hdr, payload []byte) ([]byte, bool) {
	if h.Flags&wire.FlagMAC == 0 || (h.Flags&wire.FlagEnc != 0) != a.encrypt {
		a.st.badTag.Add(1)
		return nil, false
	}
	a.mu.Lock()
	s := a.byIndex[h.AuthIndex]
	a.mu.Unlock()
	if s == nil {
		a.st.noSession.Add(1)
		a.rekey(from)
		return nil, false
	}
	if s.peer != from {
		a.st.wrongSource.Add(1)
		return nil, false
	}
	if a.encrypt {
		if len(payload) < 16 {
			a.st.badTag.Add(1)
			return nil, false
		}
		var nonce [12]byte
		binary.BigEndian.PutUint64(nonce[4:], h.AuthCounter)
		pt, err := s.recvAEAD.Open(payload[:0], nonce[:], payload, hdr)
		if err != nil {
			a.st.badTag.Add(1)
			return nil, false
		}
		payload = pt
	} else {
		var tag [wire.MACLen]byte
		f := wire.MACField(hdr)
		copy(tag[:], f)
		clear(f)
		m := s.recvMAC
		m.Reset()
		m.Write(hdr)
		m.Write(payload)
		var sum [sha256.Size]byte
		ok := subtle.ConstantTimeCompare(m.Sum(sum[:0])[:wire.MACLen], tag[:]) == 1
		copy(f, tag[:])
		if !ok {
			a.st.badTag.Add(1)
			return nil, false
		}
	}
	if !s.win.Accept(h.AuthCounter) {
		a.st.replayed.Add(1)
		return nil, false
	}
	s.heard.Store(true)
	return payload, true
}

// rekey starts a handshake with an address that sent a packet of a
// session we do not know (rate-limited by initiateLocked).
func (a *authState) rekey(from netip.AddrPort) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.peers[from]
	if p == nil {
		if len(a.peers) >= maxPeers {
			return
		}
		p = a.peerLocked(from)
	}
	// A known peer with a working session may simply be using a session
	// we evicted or forgot: initiate anyway; the peer re-keys.
	a.initiateLocked(p)
}

// onHandshake handles HS_INIT and HS_RESP (rxMu held).
func (a *authState) onHandshake(from netip.AddrPort, h *wire.Header, hdr, payload []byte) {
	f := wire.MACField(hdr)
	var tag [wire.MACLen]byte
	copy(tag[:], f)
	clear(f)
	ok := hmac.Equal(hsTag(a.rxTag, hdr, payload), tag[:])
	copy(f, tag[:])
	if !ok || h.AuthIndex != 0 || h.AuthCounter != 0 {
		a.st.badTag.Add(1)
		return
	}
	be := binary.BigEndian
	switch h.Op {
	case wire.OpHSInit:
		if len(payload) != hsInitLen {
			a.st.badTag.Add(1)
			return
		}
		idxI, ts, nI := be.Uint32(payload), int64(be.Uint64(payload[4:])), payload[12:]
		a.mu.Lock()
		p := a.peerLocked(from)
		if p == nil || ts <= p.lastTS {
			a.mu.Unlock()
			a.st.staleInit.Add(1)
			return
		}
		p.lastTS = ts
		idxR := a.newIndexLocked()
		var nR [nonceLen]byte
		fillRandom(nR[:])
		i2r, r2i := a.sessionKeys(nI, nR[:], idxI, idxR, ts)
		a.installLocked(p, a.newSession(from, idxR, idxI, r2i, i2r))
		parked := a.takeParkedLocked(p)
		a.mu.Unlock()
		rep := be.AppendUint32(nil, idxR)
		rep = be.AppendUint32(rep, idxI)
		rep = append(rep, nR[:]...)
		rep = append(rep, nI...)
		a.sendHandshake(from, wire.OpHSResp, rep)
		a.release(parked)
	case wire.OpHSResp:
		if len(payload) != hsRespLen {
			a.st.badTag.Add(1)
			return
		}
		idxR, idxI, nR, nI := be.Uint32(payload), be.Uint32(payload[4:]), payload[8:8+nonceLen], payload[8+nonceLen:]
		a.mu.Lock()
		p := a.peers[from]
		if p == nil || p.initIdx == 0 || p.initIdx != idxI || !hmac.Equal(nI, p.initNonce[:]) {
			a.mu.Unlock()
			a.st.staleInit.Add(1)
			return
		}
		i2r, r2i := a.sessionKeys(nI, nR, idxI, idxR, p.initTS)
		p.initIdx = 0
		a.installLocked(p, a.newSession(from, idxI, idxR, i2r, r2i))
		parked := a.takeParkedLocked(p)
		a.mu.Unlock()
		a.release(parked)
	}
}

func (a *authState) takeParkedLocked(p *authPeer) []link.Packet {
	pk := p.parked
	p.parked = nil
	return pk
}

// release sends parked packets through the receive outbox (rxMu held),
// which signs them in the new session at its flush.
func (a *authState) release(pkts []link.Packet) {
	for _, p := range pkts {
		a.d.rxOut.addEncoded(p)
	}
}

func fillRandom(b []byte) {
	for len(b) > 0 {
		var x [8]byte
		binary.LittleEndian.PutUint64(x[:], randUint64())
		b = b[copy(b, x[:]):]
	}
}

// errAuthTable is returned when no handshake state can be kept for a new
// peer (the table is full of peers with live sessions).
var errAuthTable = errors.New("softnic: authentication table full")
