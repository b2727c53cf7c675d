package meta

import (
	"math/rand/v2"
	"sort"
	"time"
)

// registry is the meta server's protocol core: registrations, leases and
// the table index, as a pure state machine. Each operation takes the
// current time and returns the reply to send and the slot writes that
// publish its effect in the table, in the order they must be applied.
// The Server shell does all I/O. Not safe for concurrent use.
type registry struct {
	geom  tableGeom
	epoch time.Time
	idx   *index
	nodes map[uint32]*lease
	// assigned maps the incarnation of each live lease whose gid the
	// registry assigned to that gid, so that a registration asking for a
	// gid that is sent again (its reply was lost with the client's
	// connection) gets the same gid instead of a second one.
	assigned map[uint64]uint32
	lease    time.Duration // granted when a request asks for 0
	minLease time.Duration
	maxLease time.Duration
	// nextGID is where the search for an unused gid to assign starts.
	firstGID uint32
	nextGID  uint32
	rng      *rand.Rand
	moves    uint64 // hopscotch displacements so far
}

// lease is a live registration.
type lease struct {
	node    NodeInfo
	slot    int
	term    time.Duration // granted lease length
	expires time.Time
	written uint32 // expiry as last written to the table
}

// slotWrite is one update of a table slot. With expiryOnly, only the
// entry's expiry word changes, in place (see the package doc); otherwise
// the slot gets e as a whole, versioned write (e.live false clears it).
type slotWrite struct {
	slot       int
	e          entry
	expiryOnly bool
}

func newRegistry(g tableGeom, epoch time.Time, cfg *ServerConfig, seed uint64) *registry {
	return &registry{
		geom:     g,
		epoch:    epoch,
		idx:      newIndex(g),
		nodes:    make(map[uint32]*lease),
		assigned: make(map[uint64]uint32),
		lease:    cfg.Lease,
		minLease: cfg.MinLease,
		maxLease: cfg.MaxLease,
		firstGID: cfg.FirstAssignedGID,
		nextGID:  cfg.FirstAssignedGID,
		rng:      rand.New(rand.NewPCG(seed, seed^0x6d657461)),
	}
}

// grant clamps a requested lease length.
func (r *registry) grant(ms uint32) time.Duration {
	d := time.Duration(ms) * time.Millisecond
	if d == 0 {
		d = r.lease
	}
	return min(max(d, r.minLease), r.maxLease)
}

func (r *registry) entryOf(l *lease) entry {
	return entry{node: l.node, live: true, expiry: expiryMillis(r.epoch, l.expires)}
}

// register handles a registration request m at time now.
//
//   - gid 0 asks for an assigned gid; incarnation 0 for an assigned
//     incarnation.
//   - A gid held by a live lease with another incarnation is refused
//     (stInUse), unless the request comes from the same node address: a
//     node's address is its NIC's bound UDP socket, which no two live
//     processes can hold, so the holder has died and this is its restart
//     (it takes over at once instead of waiting out the old lease). With
//     the same incarnation the request renews and updates the
//     registration: a retransmitted request, or a node re-registering
//     after the meta server restarted.
func (r *registry) register(m *message, now time.Time) (message, []slotWrite) {
	rep := message{kind: m.kind | replyBit, reqID: m.reqID}
	n := m.node
	if n.Incarnation == 0 {
		n.Incarnation = r.newIncarnation()
	}
	assign := false
	if l := r.nodes[r.assigned[n.Incarnation]]; n.GID == 0 && l != nil && l.node.Incarnation == n.Incarnation && l.node.Addr == n.Addr {
		n.GID = l.node.GID // sent again: the gid assigned the first time
	} else if n.GID == 0 {
		assign = true
		n.GID = r.assignGID()
		if n.GID == 0 {
			rep.status = stFull
			return rep, nil
		}
	}
	term := r.grant(m.leaseMs)
	if l := r.nodes[n.GID]; l != nil {
		// An expired lease not yet swept is no longer live: its slot is
		// taken over in place.
		if l.node.Incarnation != n.Incarnation && !now.After(l.expires) && l.node.Addr != n.Addr {
			rep.status = stInUse
			return rep, nil
		}
		if l.node.Incarnation != n.Incarnation {
			r.forgetAssigned(l)
		}
		l.node, l.term, l.expires = n, term, now.Add(term)
		e := r.entryOf(l)
		l.written = e.expiry
		rep.node = n
		rep.leaseMs = uint32(term / time.Millisecond)
		return rep, []slotWrite{{slot: l.slot, e: e}}
	}
	slot, moves, ok := r.idx.insert(n.GID)
	if !ok {
		rep.status = stFull
		return rep, nil
	}
	var ws []slotWrite
	r.moves += uint64(len(moves))
	for _, mv := range moves {
		moved := r.nodes[r.idx.gids[mv.to]]
		moved.slot = mv.to
		ws = append(ws, slotWrite{slot: mv.to, e: r.entryOf(moved)})
	}
	l := &lease{node: n, slot: slot, term: term, expires: now.Add(term)}
	r.nodes[n.GID] = l
	if assign {
		r.assigned[n.Incarnation] = n.GID
	}
	e := r.entryOf(l)
	l.written = e.expiry
	ws = append(ws, slotWrite{slot: slot, e: e})
	rep.node = n
	rep.leaseMs = uint32(term / time.Millisecond)
	return rep, ws
}

// owned returns the reply to m and the lease m may act on: the one of
// (gid, incarnation); without it the reply already says why.
func (r *registry) owned(m *message) (message, *lease) {
	rep := message{kind: m.kind | replyBit, reqID: m.reqID, node: NodeInfo{GID: m.node.GID}}
	l := r.nodes[m.node.GID]
	switch {
	case l == nil:
		rep.status = stNotRegistered
		return rep, nil
	case l.node.Incarnation != m.node.Incarnation:
		rep.status = stInUse
		return rep, nil
	}
	return rep, l
}

// heartbeat renews the lease of (gid, incarnation).
func (r *registry) heartbeat(m *message, now time.Time) (message, []slotWrite) {
	rep, l := r.owned(m)
	switch {
	case l == nil:
		return rep, nil
	case now.After(l.expires):
		// Too late: the lease ended. The node must register again.
		rep.status = stNotRegistered
		return rep, []slotWrite{r.drop(l)}
	}
	l.expires = now.Add(l.term)
	rep.leaseMs = uint32(l.term / time.Millisecond)
	e := r.entryOf(l)
	if e.expiry == l.written {
		return rep, nil
	}
	l.written = e.expiry
	return rep, []slotWrite{{slot: l.slot, e: e, expiryOnly: true}}
}

// deregister removes (gid, incarnation) at once.
func (r *registry) deregister(m *message) (message, []slotWrite) {
	rep, l := r.owned(m)
	if l == nil {
		return rep, nil
	}
	return rep, []slotWrite{r.drop(l)}
}

func (r *registry) drop(l *lease) slotWrite {
	r.forgetAssigned(l)
	delete(r.nodes, l.node.GID)
	r.idx.remove(l.node.GID)
	return slotWrite{slot: l.slot}
}

// forgetAssigned drops l's incarnation from assigned.
func (r *registry) forgetAssigned(l *lease) {
	if g, ok := r.assigned[l.node.Incarnation]; ok && g == l.node.GID {
		delete(r.assigned, l.node.Incarnation)
	}
}

// lookup answers the RPC lookup path from the registry itself.
func (r *registry) lookup(m *message, now time.Time) message {
	rep := message{kind: m.kind | replyBit, reqID: m.reqID, node: NodeInfo{GID: m.node.GID}}
	l := r.nodes[m.node.GID]
	if l == nil {
		rep.status = stNotFound
		return rep
	}
	rep.node = l.node
	rep.leaseMs = uint32(max(l.expires.Sub(now), 0) / time.Millisecond)
	return rep
}

// expire drops every lease that ended before now and returns the writes
// clearing their slots and the gids dropped.
func (r *registry) expire(now time.Time) ([]slotWrite, []uint32) {
	var ws []slotWrite
	var gone []uint32
	for _, l := range r.nodes {
		if now.After(l.expires) {
			gone = append(gone, l.node.GID)
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i] < gone[j] })
	for _, g := range gone {
		ws = append(ws, r.drop(r.nodes[g]))
	}
	return ws, gone
}

// assignGID returns the first unused gid at or after the assignment
// cursor (which follows the last gid assigned, wrapping to firstGID), or
// 0 if none is left.
func (r *registry) assignGID() uint32 {
	g := r.nextGID
	for range len(r.nodes) + 1 {
		if g == 0 {
			g = r.firstGID
		}
		if r.nodes[g] == nil {
			r.nextGID = g + 1
			return g
		}
		g++
	}
	return 0
}

func (r *registry) newIncarnation() uint64 {
	for {
		if v := r.rng.Uint64(); v != 0 {
			return v
		}
	}
}

// list returns the live registrations sorted by gid.
func (r *registry) list() []NodeInfo {
	out := make([]NodeInfo, 0, len(r.nodes))
	for _, l := range r.nodes {
		out = append(out, l.node)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GID < out[j].GID })
	return out
}
