package meta

import (
	"errors"
	"fmt"
	"time"

	"github.com/krfs/krfs/verbs"
)

// loop is the server's only goroutine: it handles messages, posts table
// writes, sends replies and sweeps leases.
func (s *Server) loop() {
	defer s.wg.Done()
	wcs := make([]verbs.WC, 128)
	for {
		s.turns.Add(1)
		for {
			n := s.cq.Poll(wcs)
			if n == 0 {
				break
			}
			s.handleWCs(wcs[:n])
		}
		select {
		case <-s.cq.Notify():
		case <-s.sweeper.C:
			s.sweep()
		case <-s.done:
			return
		}
	}
}

// handleWCs handles one batch of completions and sends what it produced.
func (s *Server) handleWCs(wcs []verbs.WC) {
	now := s.clock.Now()
	s.regMu.Lock()
	var wb writeBatch
	for i := range wcs {
		wc := &wcs[i]
		switch {
		case wc.ID&recvBit != 0:
			s.onMessage(wc, now, &wb)
		case s.isLoop(wc.QPN):
			s.onTableWritten(wc)
		case s.retired[wc.QPN]:
			// A late completion of a loopback QP a repair replaced.
		case wc.Status != verbs.StatusSuccess:
			// A reply failed: the client is gone.
			s.reap(wc.QPN)
		}
	}
	s.queueWrites(&wb)
	s.repairLoopLocked()
	s.regMu.Unlock()
	s.flush()
}

// onMessage handles one received message. Replies that must wait until
// the table shows the change are attached to wb.
func (s *Server) onMessage(wc *verbs.WC, now time.Time, wb *writeBatch) {
	buf := int(wc.ID &^ recvBit)
	s.reposts = append(s.reposts, s.recvWR(buf))
	if wc.Status != verbs.StatusSuccess {
		if wc.Status != verbs.StatusWRFlushErr {
			s.st.malformed.Add(1) // longer than MaxMessage
		}
		return
	}
	s.connMu.Lock()
	c := s.conns[wc.QPN]
	if c != nil {
		s.heardLocked(c)
	}
	s.connMu.Unlock()
	if c == nil {
		return
	}
	c.lastRx = now
	b := s.recvMem[buf*MaxMessage : buf*MaxMessage+int(min(wc.ByteLen, MaxMessage))]
	m, err := parseMessage(b)
	if err == nil && m.kind&replyBit != 0 {
		err = fmt.Errorf("%w: a reply sent to the server", ErrMalformed)
	}
	if err != nil {
		s.st.malformed.Add(1)
		if kind, id, v, ok := parseMsgHeader(b); ok && kind&replyBit == 0 && kind != kindBye && bodyLen(kind|replyBit, stMalformed, v) == 0 {
			s.replies = append(s.replies, outReply{wc.QPN, message{kind: kind | replyBit, status: stMalformed, reqID: id, version: v}})
		}
		return
	}
	if rep, handled := s.admit(c, &m, now); handled {
		// hello, auth, or a request the node's key or its source's
		// limits refuse (auth.go).
		s.replies = append(s.replies, outReply{wc.QPN, rep})
		return
	}
	var rep message
	var ws []slotWrite
	switch m.kind {
	case kindRegister:
		if m.version != msgVersionNoOwner && !s.admitRegister(wb) { // v2 does not know busy
			s.replies = append(s.replies, outReply{wc.QPN, message{kind: kindRegister | replyBit, status: stBusy, reqID: m.reqID, version: m.version}})
			return
		}
		rep, ws = s.reg.register(&m, now)
		switch rep.status {
		case stOK:
			s.bind(c, &rep, now)
			s.st.registered.Add(1)
		case stInUse:
			s.st.refused.Add(1)
		case stFull:
			s.st.full.Add(1)
		}
	case kindHeartbeat:
		rep, ws = s.reg.heartbeat(&m, now)
		switch rep.status {
		case stOK:
			s.st.renewed.Add(1)
		case stInUse:
			s.st.refused.Add(1)
		case stNotRegistered:
			if len(ws) > 0 {
				s.st.expired.Add(1)
			}
		}
		if rep.status == stOK {
			// The new expiry word is advisory: reply at once.
			rep.version = m.version
			s.replies = append(s.replies, outReply{wc.QPN, rep})
			s.addWrites(wb, ws, nil)
			return
		}
	case kindDeregister:
		rep, ws = s.reg.deregister(&m)
		if rep.status == stOK {
			s.st.deregistered.Add(1)
		}
	case kindLookup:
		rep = s.reg.lookup(&m, now)
		s.st.lookups.Add(1)
	case kindPing:
		rep = message{kind: kindPing | replyBit, reqID: m.reqID}
	case kindBye:
		s.reap(wc.QPN)
		return
	}
	rep.version = m.version // answer in the version asked in
	if len(ws) == 0 {
		s.replies = append(s.replies, outReply{wc.QPN, rep})
		return
	}
	s.addWrites(wb, ws, &outReply{wc.QPN, rep})
}

// sendReplies posts the queued replies, one doorbell per connection run.
func (s *Server) sendReplies() {
	var wrs []verbs.SendWR
	for i := 0; i < len(s.replies); {
		qpn := s.replies[i].qpn
		s.connMu.Lock()
		c := s.conns[qpn]
		s.connMu.Unlock()
		wrs = wrs[:0]
		j := i
		for ; j < len(s.replies) && s.replies[j].qpn == qpn; j++ {
			m := &s.replies[j].m
			p := s.inline(m.size())
			m.append(p[:0])
			wrs = append(wrs, verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, InlineData: p})
		}
		switch {
		case c == nil:
			s.st.droppedReplies.Add(uint64(j - i))
		case c.qp.SendQueueFree() < len(wrs):
			s.st.droppedReplies.Add(uint64(j - i))
		default:
			if err := c.qp.PostSend(wrs); err != nil {
				var pe *verbs.PostError
				n := len(wrs)
				if errors.As(err, &pe) {
					n -= pe.Index
				}
				s.st.droppedReplies.Add(uint64(n))
			}
		}
		i = j
	}
	clear(s.replies)
	s.replies = s.replies[:0]
}

// sweep removes expired leases and reclaims dead or idle connections.
func (s *Server) sweep() {
	now := s.clock.Now()
	s.regMu.Lock()
	ws, gone := s.reg.expire(now)
	var wb writeBatch
	s.addWrites(&wb, ws, nil)
	s.regMu.Unlock()
	s.st.expired.Add(uint64(len(gone)))
	s.queueWrites(&wb)
	s.regMu.Lock()
	s.repairLoopLocked() // if the pair is broken and an earlier try failed
	s.regMu.Unlock()
	var dead []uint32
	s.connMu.Lock()
	for n, c := range s.conns {
		if c.qp.State() == verbs.StateErr || now.Sub(c.lastRx) > s.cfg.IdleTimeout ||
			!c.heard && now.Sub(c.lastRx) > s.cfg.HalfOpenTimeout {
			dead = append(dead, n)
		}
	}
	s.connMu.Unlock()
	for _, n := range dead {
		s.reap(n)
	}
	s.flush()
}

// reap destroys the connection of QPN n.
func (s *Server) reap(n uint32) {
	s.connMu.Lock()
	c := s.conns[n]
	delete(s.conns, n)
	if c != nil {
		s.heardLocked(c) // no longer half-open
		if s.perSrc[c.remote.Addr()]--; s.perSrc[c.remote.Addr()] <= 0 {
			delete(s.perSrc, c.remote.Addr())
		}
	}
	s.connMu.Unlock()
	if c != nil {
		c.qp.Destroy()
		s.st.reaped.Add(1)
	}
}
