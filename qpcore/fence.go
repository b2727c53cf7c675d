package qpcore

// Routing and the switching fence, one type: a VQP's fence holds the
// transport its operations take, how many of them are on each transport,
// and the new operations held while a switch waits for the old
// transport's to be done, so that a VQP's operations stay in order. The
// fence changes only through its methods; the node (the functions below)
// decides the transport a VQP wants (wantLocked: RC once the peer's RC
// QP is ready, rclink.go), queues what a fence lets through, and counts.
//
//	enqueue: fence open (nothing held, nothing left on the old route) -> queued on want
//	         otherwise                                                -> held
//	an op of the old route done, none left -> lift: held ops queued on want, in order

// fence is a VQP's route and switching fence. Guarded by the peer's mu.
type fence struct {
	route Transport
	out   [2]int // ops queued, posted or stalled on each transport
	held  []*op  // ops waiting for the switching fence
}

// blocks reports whether moving to want must wait: operations are left
// on the current route.
func (f *fence) blocks(want Transport) bool { return want != f.route && f.out[f.route] > 0 }

// current is the transport the VQP's operations take now, want being the
// one new operations should take: the old one until the fence lifts.
func (f *fence) current(want Transport) Transport {
	if len(f.held) > 0 || f.out[f.route] > 0 {
		return f.route
	}
	return want
}

// hold holds o if the VQP's new operations cannot go on want yet. It
// reports whether it held o, and whether that raised the fence (o is its
// first held op).
func (f *fence) hold(o *op, want Transport) (held, raised bool) {
	if len(f.held) == 0 && !f.blocks(want) {
		return false, false
	}
	raised = len(f.held) == 0
	f.held = append(f.held, o)
	o.setState(opHeld)
	return true, raised
}

// lift returns the held ops, in order, and empties the fence if it may
// lift for want (nothing left on the old route), else nil.
func (f *fence) lift(want Transport) []*op {
	if len(f.held) == 0 || f.blocks(want) {
		return nil
	}
	held := f.held
	f.held = nil
	return held
}

// switchTo moves the route to t and reports whether it changed.
func (f *fence) switchTo(t Transport) bool {
	if f.route == t {
		return false
	}
	f.route = t
	return true
}

// queued counts an op queued on t.
func (f *fence) queued(t Transport) { f.out[t]++ }

// done uncounts an op of t that ended, and reports whether the fence may
// lift now (ops are held and none is left on t).
func (f *fence) done(t Transport) bool {
	f.out[t]--
	return len(f.held) > 0 && f.out[t] == 0
}

// reroute moves an op counted on RC to DC (its RC QP was dropped) and
// reports whether none is left on RC.
func (f *fence) reroute() bool {
	f.out[RC]--
	f.out[DC]++
	return f.out[RC] == 0
}

// withdraw removes held op o, reporting whether it was held and whether
// the fence is now empty.
func (f *fence) withdraw(o *op) (removed, empty bool) {
	for i, h := range f.held {
		if h == o {
			f.held = append(f.held[:i], f.held[i+1:]...)
			return true, len(f.held) == 0
		}
	}
	return false, false
}

// expire removes the held ops late says are past their deadline and
// returns them, in order, and whether the fence is now empty.
func (f *fence) expire(late func(*op) bool) (gone []*op, empty bool) {
	gone = takeOps(&f.held, late)
	return gone, len(f.held) == 0
}

// fencedVQPs are a peer's VQPs with held operations.
type fencedVQPs []*VQP

func (s *fencedVQPs) add(v *VQP) { *s = append(*s, v) }

func (s *fencedVQPs) drop(v *VQP) {
	for i, h := range *s {
		if h == v {
			*s = append((*s)[:i], (*s)[i+1:]...)
			return
		}
	}
}

// wantLocked is the transport v's new operations should take. For an
// RC-only peer it is always DC: the peer has one queue (dcq), which its RC
// QP serves (see postRCOnlyLocked), so no fence is ever needed.
func (n *Node) wantLocked(p *peer, v *VQP) Transport {
	if v.sys || p.rcOnly || !p.rc.ready() {
		return DC
	}
	return RC
}

// enqueueLocked routes a new op of v. If v must switch transports and
// still has operations on the old one, the op is held until they are done
// (the switching fence), so v's operations stay in order.
func (n *Node) enqueueLocked(p *peer, v *VQP, o *op) {
	want := n.wantLocked(p, v)
	if held, raised := v.hold(o, want); held {
		if raised {
			p.held.add(v)
			n.stats.fences.Add(1)
		}
		return
	}
	n.switchRouteLocked(v, want)
	n.queueLocked(p, o, want)
}

func (n *Node) switchRouteLocked(v *VQP, to Transport) {
	if !v.switchTo(to) {
		return
	}
	if to == RC {
		n.stats.vqpToRC.Add(1)
	} else {
		n.stats.vqpToDC.Add(1)
	}
}

func (n *Node) queueLocked(p *peer, o *op, t Transport) {
	if o.expires.IsZero() && o.code != opSend {
		// Internal READs (directory, rendezvous) are bounded like the
		// caller's operations; SENDs keep MsgTimeout (RNR retries).
		o.expires = n.clock.Now().Add(n.cfg.PeerTimeout)
	}
	o.route = t
	o.setState(opQueued)
	o.v.queued(t)
	p.queue(t).push(o)
}

// settleLocked releases v's held ops once the fence allows.
func (n *Node) settleLocked(p *peer, v *VQP) {
	want := n.wantLocked(p, v)
	held := v.lift(want)
	if held == nil {
		return
	}
	n.switchRouteLocked(v, want)
	for _, o := range held {
		n.queueLocked(p, o, want)
	}
	p.held.drop(v)
}

// settleAllLocked re-evaluates every fence of p (its RC state changed).
func (n *Node) settleAllLocked(p *peer) {
	for _, v := range append([]*VQP(nil), p.held...) {
		n.settleLocked(p, v)
	}
}

// doneLocked uncounts an op of v that ended on route t, lifting v's fence
// if that was the last op it waited for.
func (n *Node) doneLocked(p *peer, v *VQP, t Transport) {
	if v.done(t) {
		n.settleLocked(p, v)
	}
}

// rerouteLocked moves an op counted on RC to DC.
func (n *Node) rerouteLocked(o *op) {
	if o.route == DC {
		return
	}
	o.route = DC
	if o.v.reroute() {
		n.switchRouteLocked(o.v, DC)
	}
}
