package meta

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"
)

// # Node keys
//
// A cluster key (softnic) makes every member a trusted peer of the NIC,
// but one key shared by all is no identity: without more, any member
// could deregister another node, overwrite its entry or fill the table.
// So each node also has a key pair of its own (Ed25519; krfs keeps it in
// the node's region store, internal/shm) and the meta service binds an
// entry to the key that registered it:
//
//   - A client whose ClientConfig has a NodeKey proves it on every
//     connection to a server that supports it (Bootstrap.NodeKeys): it
//     sends hello with its public key, the server answers with a random
//     nonce, and the client sends auth, its signature of authContext, the
//     server's incarnation, the nonce and the key. The connection is then
//     that key's session (a nonce is never reused, so a captured auth
//     proves nothing on another connection).
//   - A registration made on a key's session binds the entry to that key
//     (the first registration of the gid while no live entry holds it).
//     From then on, while the lease lives, a registration, heartbeat or
//     deregistration of that gid is accepted only on a session of the same
//     key: another node's is refused with ErrDenied, whatever incarnation
//     or address it claims. The same key registering with another
//     incarnation is the same node restarted (possibly at another
//     address): it takes the entry over at once.
//   - Entries registered without a key (a node of an older release, or
//     without a NodeKey) are unbound and keep the older rules (the
//     incarnation is the proof; the same address takes over); an
//     AuthConfig.RequireNodeKeys server refuses them.
//
// Per source IP address, AuthConfig bounds the live entries registered
// (MaxNodesPerSource) and the rate of registrations (RegisterRate,
// RegisterBurst): a member, with or without keys, cannot flood the table.
// Refusals are ErrLimited (EAGAIN).
//
// The table itself is written only by the server's loopback QP: client
// QPs and the DCT have remote READ access alone, on the read-only MR
// (TestMembersCannotWriteTheTable).

const (
	authKeyLen       = ed25519.PublicKeySize
	authSigLen       = ed25519.SignatureSize
	authNonceLen     = 32
	bootFlagNodeKeys = 1
	authContext      = "krfs meta node key v1"
)

var (
	// ErrDenied: the gid's entry is bound to another node's key, or the
	// server requires a node key and the connection proved none.
	ErrDenied = newError("refused: the entry belongs to another node's key", syscall.EACCES)
	// ErrLimited: the server's per-source limits refused a registration
	// (too many live entries from this source IP, or too many
	// registrations too fast).
	ErrLimited = newError("registration refused by the per-source limits of the meta service", syscall.EAGAIN)
)

// AuthConfig is a server's node-key policy and per-source registration
// limits. The zero value accepts unauthenticated nodes and sets no limit
// (krfs meta sets limits by default).
type AuthConfig struct {
	// RequireNodeKeys refuses registrations, heartbeats and
	// deregistrations on a connection that proved no node key.
	RequireNodeKeys bool
	// MaxNodesPerSource bounds the live entries registered from one
	// source IP address (0: no bound).
	MaxNodesPerSource int
	// RegisterRate is the registrations per second one source IP address
	// may make on average, RegisterBurst at once (a token bucket); a rate
	// of 0 sets no bound. A burst of 0 is max(1, RegisterRate).
	RegisterRate  float64
	RegisterBurst int
}

func (c *AuthConfig) check() error {
	if c.MaxNodesPerSource < 0 || c.RegisterRate < 0 || c.RegisterBurst < 0 {
		return fmt.Errorf("meta: negative registration limit")
	}
	if c.RegisterRate > 0 && c.RegisterBurst == 0 {
		c.RegisterBurst = max(1, int(c.RegisterRate))
	}
	return nil
}

// connAuth is a server connection's node-key state.
type connAuth struct {
	offered ed25519.PublicKey // hello's key, until auth proves it
	nonce   []byte            // hello's answer, until auth
	key     ed25519.PublicKey // the proven key; nil before
}

// AuthStats are a server's node-key and limit counters.
type AuthStats struct {
	Authenticated uint64 // connections that proved a node key
	BadAuth       uint64 // auth messages that failed (bad signature, no hello)
	Denied        uint64 // requests refused: another node's entry, or no key where one is required
	Limited       uint64 // registrations refused by a per-source limit
}

// AuthStats returns the server's node-key and limit counters.
func (s *Server) AuthStats() AuthStats {
	g := &s.guard
	return AuthStats{Authenticated: g.authenticated.Load(), BadAuth: g.badAuth.Load(),
		Denied: g.denied.Load(), Limited: g.limited.Load()}
}

// authChallenge is what a node signs to prove its key on a connection.
func authChallenge(serverInc uint64, nonce []byte, pub ed25519.PublicKey) []byte {
	b := make([]byte, 0, len(authContext)+8+len(nonce)+len(pub))
	b = append(b, authContext...)
	b = binary.LittleEndian.AppendUint64(b, serverInc)
	b = append(b, nonce...)
	return append(b, pub...)
}

// authenticate proves the client's node key on cn, if it has one and the
// server supports it. Called by dial before the connection is used.
func (c *Client) authenticate(ctx context.Context, cn *conn) error {
	key := c.cfg.NodeKey
	if key == nil || !cn.boot.NodeKeys {
		return nil
	}
	pub := key.Public().(ed25519.PublicKey)
	hello := message{kind: kindHello}
	copy(hello.blob[:], pub)
	rep, err := cn.call(ctx, hello)
	if err == nil {
		err = rep.status.err()
	}
	if err != nil {
		return fmt.Errorf("meta: node key hello: %w", err)
	}
	auth := message{kind: kindAuth}
	copy(auth.blob[:], ed25519.Sign(key, authChallenge(cn.boot.ServerIncarnation, rep.blob[:authNonceLen], pub)))
	rep, err = cn.call(ctx, auth)
	if err == nil {
		err = rep.status.err()
	}
	if err != nil {
		return fmt.Errorf("meta: node key not accepted: %w", err)
	}
	return nil
}

// guard is the server's record of which key and source registered each
// live entry, and its per-source limits. Owned by the loop.
type guard struct {
	owners  map[uint32]owner
	bySrc   map[netip.Addr]map[uint32]*lease
	buckets buckets

	authenticated, badAuth, denied, limited atomic.Uint64
}

// owner is who registered the lease of a gid: valid while the registry
// still holds that very lease.
type owner struct {
	l   *lease
	key ed25519.PublicKey // nil: unbound
	src netip.Addr
}

// ownerOf returns the live record of l.
func (g *guard) ownerOf(l *lease) (owner, bool) {
	o, ok := g.owners[l.node.GID]
	return o, ok && o.l == l
}

// admit handles hello and auth, and refuses a registration, heartbeat or
// deregistration that the entry's key or the source's limits do not
// allow. handled says whether rep is the reply to send (and nothing else
// is to be done).
func (s *Server) admit(c *srvConn, m *message, now time.Time) (rep message, handled bool) {
	refuse := func(st status) (message, bool) {
		switch st {
		case stDenied:
			s.guard.denied.Add(1)
		case stLimited:
			s.guard.limited.Add(1)
		}
		if m.version == msgVersionNoOwner { // the statuses it knows
			st = map[status]status{stDenied: stInUse, stLimited: stFull, stMalformed: stMalformed}[st]
		}
		return message{kind: m.kind | replyBit, reqID: m.reqID, status: st, version: m.version}, true
	}
	switch m.kind {
	case kindHello:
		if c.auth.key != nil {
			return refuse(stMalformed) // one key per connection
		}
		rep := message{kind: kindHello | replyBit, reqID: m.reqID, version: m.version}
		_, _ = rand.Read(rep.blob[:authNonceLen])
		c.auth.offered = ed25519.PublicKey(bytes.Clone(m.blob[:authKeyLen]))
		c.auth.nonce = bytes.Clone(rep.blob[:authNonceLen])
		return rep, true
	case kindAuth:
		ok := c.auth.nonce != nil && ed25519.Verify(c.auth.offered, authChallenge(s.boot.ServerIncarnation, c.auth.nonce, c.auth.offered), m.blob[:])
		c.auth.nonce = nil
		if !ok {
			s.guard.badAuth.Add(1)
			return refuse(stMalformed)
		}
		c.auth.key = c.auth.offered
		s.guard.authenticated.Add(1)
		return message{kind: kindAuth | replyBit, reqID: m.reqID, version: m.version}, true
	case kindRegister, kindHeartbeat, kindDeregister:
	default:
		return message{}, false
	}
	cfg := &s.cfg.Auth
	if cfg.RequireNodeKeys && c.auth.key == nil {
		return refuse(stDenied)
	}
	g := &s.guard
	if m.kind != kindRegister {
		if l := s.reg.nodes[m.node.GID]; l != nil {
			if o, ok := g.ownerOf(l); ok && o.key != nil && !o.key.Equal(c.auth.key) {
				return refuse(stDenied)
			}
		}
		return message{}, false
	}
	src := c.remote.Addr()
	if !g.buckets.take(src, now, cfg) {
		return refuse(stLimited)
	}
	l := s.reg.nodes[m.node.GID]
	if m.node.GID == 0 && m.node.Incarnation != 0 {
		if gid, ok := s.reg.assigned[m.node.Incarnation]; ok {
			l = s.reg.nodes[gid] // a registration sent again: the gid it got
		}
	}
	live := l != nil && !now.After(l.expires)
	if live {
		o, ok := g.ownerOf(l)
		switch {
		case ok && o.key != nil && !o.key.Equal(c.auth.key):
			return refuse(stDenied)
		case ok && o.key != nil && l.node.Incarnation != m.node.Incarnation:
			// The same key with another incarnation: the node restarted,
			// perhaps at another address. Its old lease ends now, and
			// the registration takes the entry over in place.
			l.expires = now.Add(-time.Nanosecond)
		}
	}
	if cfg.MaxNodesPerSource > 0 && !(live && g.bySrc[src][l.node.GID] == l) && g.count(s.reg, src) >= cfg.MaxNodesPerSource {
		return refuse(stLimited)
	}
	return message{}, false
}

// bind records that the registration rep (accepted on c) holds its gid's
// entry for c's key and source.
func (s *Server) bind(c *srvConn, rep *message, now time.Time) {
	g := &s.guard
	l := s.reg.nodes[rep.node.GID]
	if l == nil {
		return
	}
	if g.owners == nil {
		g.owners = make(map[uint32]owner)
		g.bySrc = make(map[netip.Addr]map[uint32]*lease)
	}
	if old, ok := g.owners[l.node.GID]; ok && old.src != c.remote.Addr() {
		delete(g.bySrc[old.src], l.node.GID)
	}
	g.owners[l.node.GID] = owner{l: l, key: c.auth.key, src: c.remote.Addr()}
	set := g.bySrc[c.remote.Addr()]
	if set == nil {
		set = make(map[uint32]*lease)
		g.bySrc[c.remote.Addr()] = set
	}
	set[l.node.GID] = l
	if len(g.owners) > 2*len(s.reg.nodes)+64 {
		g.prune(s.reg)
	}
	g.buckets.prune(now, &s.cfg.Auth)
}
