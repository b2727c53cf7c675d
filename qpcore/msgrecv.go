package qpcore

import "github.com/krfs/krfs/verbs"

// The receive side of messages: a receive completion (dispatcher goroutine)
// is a FIN for a waiting sender, or a message queued on its port, or
// refused with a verdict sent back.

// pollRecv processes receive completions (dispatcher goroutine).
func (n *Node) pollRecv() {
	for {
		k := n.rcq.Poll(n.rwcs[:])
		if k == 0 {
			return
		}
		for i := range k {
			n.onRecv(&n.rwcs[i])
		}
	}
}

func (n *Node) onRecv(wc *verbs.WC) {
	m := &n.msg
	i := int(wc.ID)
	if i < 0 || i >= n.cfg.RecvBuffers {
		return
	}
	if wc.Status != verbs.StatusSuccess {
		if wc.Status != verbs.StatusWRFlushErr {
			n.stats.msgMalformed.Add(1)
			m.repost(i)
		}
		return
	}
	b, _, _ := m.slot(i)
	b = b[:min(int(wc.ByteLen), m.bufSize)]
	h, ok := parseMsgHdr(b)
	if !ok || (h.kind == msgData && uint64(len(b)-msgHdrLen) != h.length) {
		n.stats.msgMalformed.Add(1)
		m.repost(i)
		return
	}
	if h.kind == msgFIN {
		m.repost(i)
		m.mu.Lock()
		ch := m.rdv[h.token]
		m.mu.Unlock()
		if ch != nil {
			select {
			case ch <- h.status:
			default:
			}
		}
		return
	}
	im := inMsg{kind: h.kind, from: h.src, n: int(h.length), buf: i, rkey: h.rkey, raddr: h.raddr, token: h.token}
	if h.kind == msgRTS {
		m.repost(i)
		im.buf = -1
	}
	m.mu.Lock()
	pt := m.ports[h.port]
	m.mu.Unlock()
	verdict := uint8(finNoPort)
	if pt != nil {
		pt.mu.Lock()
		switch {
		case pt.closed:
		case len(pt.q) >= n.cfg.PortDepth:
			verdict = finFull
		default:
			pt.q = append(pt.q, im)
			pt.mu.Unlock()
			pt.queued()
			if h.kind == msgData && h.token != 0 {
				n.goSafe(func() { n.sendFIN(h.src, h.token, finOK) })
			}
			if h.kind == msgRTS {
				from, tok := h.src, h.token
				n.clock.AfterFunc(n.cfg.MsgStageAfter, func() { n.stageUnread(pt, from, tok) })
			}
			return
		}
		pt.mu.Unlock()
	}
	// Refused: the sender learns why (a sender that asked for no verdict,
	// token 0, sees its message dropped).
	n.stats.msgRefused.Add(1)
	if h.kind == msgData {
		m.repost(im.buf)
	}
	if h.token != 0 {
		n.goSafe(func() { n.sendFIN(h.src, h.token, verdict) })
	}
}
