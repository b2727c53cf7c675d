package qpcore

// Routing and the switching fence: which transport a VQP's new operations
// take, and holding them while the VQP's operations on the old transport
// are still in flight, so that they stay in order.

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
	if len(v.held) > 0 || (want != v.route && v.out[v.route] > 0) {
		if len(v.held) == 0 {
			p.held = append(p.held, v)
			n.stats.fences.Add(1)
		}
		v.held = append(v.held, o)
		o.setState(opHeld)
		return
	}
	n.switchRouteLocked(v, want)
	n.queueLocked(p, o, want)
}

func (n *Node) switchRouteLocked(v *VQP, to Transport) {
	if v.route == to {
		return
	}
	v.route = to
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
	o.v.out[t]++
	p.queue(t).push(o)
}

// settleLocked releases v's held ops once the fence allows.
func (n *Node) settleLocked(p *peer, v *VQP) {
	if len(v.held) == 0 {
		return
	}
	want := n.wantLocked(p, v)
	if want != v.route && v.out[v.route] > 0 {
		return
	}
	n.switchRouteLocked(v, want)
	held := v.held
	v.held = nil
	for _, o := range held {
		n.queueLocked(p, o, want)
	}
	n.dropHeldLocked(p, v)
}

func (n *Node) dropHeldLocked(p *peer, v *VQP) {
	for i, h := range p.held {
		if h == v {
			p.held = append(p.held[:i], p.held[i+1:]...)
			return
		}
	}
}

// settleAllLocked re-evaluates every fence of p (its RC state changed).
func (n *Node) settleAllLocked(p *peer) {
	for _, v := range append([]*VQP(nil), p.held...) {
		n.settleLocked(p, v)
	}
}

// rerouteLocked moves an op counted on RC to DC.
func (n *Node) rerouteLocked(o *op) {
	if o.route == DC {
		return
	}
	v := o.v
	v.out[RC]--
	v.out[DC]++
	o.route = DC
	if v.out[RC] == 0 {
		n.switchRouteLocked(v, DC)
	}
}
