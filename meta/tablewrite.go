package meta

import (
	"encoding/binary"
	"slices"

	"github.com/krfs/krfs/verbs"
)

// writeBatch is table WRITEs to post together, the slots they write (in
// order, for a repair) and the replies that may leave once they are done.
type writeBatch struct {
	wrs     []verbs.SendWR
	slots   []int
	replies []outReply
	// mapOpen: the batch wrote an odd membership generation before a
	// slot whose occupancy changes; closeMap then writes mapDirty, the
	// bitmap words changed, and the next even generation.
	mapOpen  bool
	mapDirty map[int]bool
}

// setupLoop connects two RC QPs of the server's own device to each other:
// loopReq posts WRITEs that loopResp executes into the table.
func (s *Server) setupLoop() error {
	var err error
	s.loopReq, err = s.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq,
		Caps: verbs.QPCaps{MaxSendWR: loopDepth, MaxRecvWR: 1, MaxInline: EntrySize}})
	if err != nil {
		return err
	}
	s.loopResp, err = s.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq,
		Caps: verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		return err
	}
	self := s.dev.Addr()
	for _, p := range [][2]verbs.QP{{s.loopReq, s.loopResp}, {s.loopResp, s.loopReq}} {
		q, peer := p[0], p[1]
		// The ACK timeout of a client connection, not the NIC's default
		// (8 ms): on a host starved of CPU the WRITEs' ACKs wait in the
		// server's own socket, and every retransmission go-back-N of the
		// whole group went into that same socket, ahead of the clients'
		// requests (a meta service given 1% of a CPU read 7,114 loopback
		// WRITEs of 8,880 datagrams; TestStarvedServerLoopbackRetransmits).
		if err := q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteWrite,
			Timeout: connQPTimeout, RetryCnt: DefaultQPRetryCnt}); err != nil {
			return err
		}
		if err := q.Modify(verbs.QPAttr{State: verbs.StateRTR, RemoteAddr: self, RemoteQPN: peer.QPN()}); err != nil {
			return err
		}
		if err := q.Modify(verbs.QPAttr{State: verbs.StateRTS}); err != nil {
			return err
		}
	}
	return nil
}

// addWrites turns slot writes into WRITE WRs on wb; rep, if any, leaves
// once they are done.
//
// A whole-slot write from version v to v+2 is four WRITEs, executed in
// order by the RC responder: the head version becomes v+1 (odd: a write
// is in progress), the tail v+2, then the body, then the head v+2. A
// reader READs a slot in address order and accepts it only if head and
// tail are equal and even; see the package doc for why that never
// accepts a mix of two versions. An expiry-only write is one 4-byte
// WRITE of the expiry word, in place.
func (s *Server) addWrites(wb *writeBatch, ws []slotWrite, rep *outReply) {
	for _, w := range ws {
		base := slotOffset(w.slot)
		wb.slots = append(wb.slots, w.slot)
		if w.expiryOnly {
			p := s.inline(4)
			binary.LittleEndian.PutUint32(p, w.e.expiry)
			wb.wrs = append(wb.wrs, s.writeWR(base+offExpiry, p))
			continue
		}
		word, bit := w.slot/64, uint64(1)<<(w.slot%64)
		if was := s.liveMap[word]&bit != 0; was != w.e.live {
			s.openMap(wb)
			s.liveMap[word] ^= bit
			wb.mapDirty[word] = true
		}
		old, next := s.reg.idx.bump(w.slot)
		p := s.inline(EntrySize + 8)
		binary.LittleEndian.PutUint32(p[0:], old+1)
		binary.LittleEndian.PutUint32(p[4:], next)
		body := p[8:]
		putEntryBody(body, &w.e)
		wb.wrs = append(wb.wrs,
			s.writeWR(base+offHead, p[0:4]),
			s.writeWR(base+offTail, p[4:8]),
			s.writeWR(base+offGID, body[offGID:offTail]),
			s.writeWR(base+offHead, p[4:8]))
	}
	if rep != nil {
		wb.replies = append(wb.replies, *rep)
	}
	if len(wb.wrs) >= writeGroup {
		s.queueWrites(wb)
	}
}

// openMap starts a change of occupancy in wb: the membership generation
// becomes odd before any of the slots that follow is written.
func (s *Server) openMap(wb *writeBatch) {
	if wb.mapOpen {
		return
	}
	wb.mapOpen = true
	if wb.mapDirty == nil {
		wb.mapDirty = make(map[int]bool)
	}
	s.mapGen++
	p := s.inline(8)
	binary.LittleEndian.PutUint64(p, s.mapGen)
	wb.wrs = append(wb.wrs, s.writeWR(uint64(s.geom.mapOffset()), p))
}

// closeMap ends wb's change of occupancy: the changed bitmap words, in
// runs of at most EntrySize bytes (the loopback QP's inline limit), then
// the next even generation.
func (s *Server) closeMap(wb *writeBatch) {
	if !wb.mapOpen {
		return
	}
	words := make([]int, 0, len(wb.mapDirty))
	for w := range wb.mapDirty {
		words = append(words, w)
	}
	slices.Sort(words)
	const perWrite = EntrySize / 8
	for i := 0; i < len(words); {
		j := i + 1
		for j < len(words) && words[j] == words[j-1]+1 && j-i < perWrite {
			j++
		}
		p := s.inline(8 * (j - i))
		for k := i; k < j; k++ {
			binary.LittleEndian.PutUint64(p[8*(k-i):], s.liveMap[words[k]])
		}
		wb.wrs = append(wb.wrs, s.writeWR(uint64(s.geom.mapOffset()+8+8*words[i]), p))
		i = j
	}
	s.mapGen++
	p := s.inline(8)
	binary.LittleEndian.PutUint64(p, s.mapGen)
	wb.wrs = append(wb.wrs, s.writeWR(uint64(s.geom.mapOffset()), p))
	wb.mapOpen, wb.mapDirty = false, nil
}

// rewriteMap makes wb write the whole membership map again (a repair: the
// writes of a failed group may not have reached it).
func (s *Server) rewriteMap(wb *writeBatch) {
	s.openMap(wb)
	for w := range s.liveMap {
		wb.mapDirty[w] = true
	}
}

// inline hands out n bytes of the arena that holds inline WRITE and SEND
// payloads until they are posted (PostSend copies inline data).
func (s *Server) inline(n int) []byte {
	if cap(s.arena)-len(s.arena) < n {
		s.arena = make([]byte, 0, max(64<<10, n))
	}
	s.arena = s.arena[:len(s.arena)+n]
	return s.arena[len(s.arena)-n:]
}

func (s *Server) writeWR(off uint64, p []byte) verbs.SendWR {
	return verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, InlineData: p, RemoteAddr: off, RKey: s.tableRW.RKey()}
}

// queueWrites moves wb to the backlog of write groups, split into groups
// of at most writeGroup WRITEs (see splitGroup).
func (s *Server) queueWrites(wb *writeBatch) {
	s.closeMap(wb)
	if len(wb.wrs) == 0 {
		s.replies = append(s.replies, wb.replies...)
	} else {
		s.backlog = append(s.backlog, splitGroup(*wb, writeGroup)...)
		s.queued += len(wb.wrs)
	}
	*wb = writeBatch{}
}

// flush posts the write groups the loopback send queue has room for, one
// doorbell each with its last WRITE signaled, then sends the replies that
// may leave, and reposts receive buffers.
func (s *Server) flush() {
	for len(s.backlog) > 0 && !s.loopBroken && s.loopReq != nil {
		g := &s.backlog[0]
		if s.loopReq.SendQueueFree() < len(g.wrs) {
			break // the completions of earlier groups make room
		}
		s.nextWR++
		last := &g.wrs[len(g.wrs)-1]
		last.ID, last.Flags = s.nextWR, last.Flags|verbs.Signaled
		if err := s.loopReq.PostSend(g.wrs); err != nil {
			// The loopback QP failed. The group stays in the backlog
			// (if a prefix of it was posted, the repair rewrites its
			// slots anyway) and the pair is re-created at the next
			// batch or sweep.
			s.loopBroken = true
			break
		}
		s.st.tableWrites.Add(uint64(len(g.wrs)))
		s.inflight[s.nextWR] = *g
		s.backlog[0] = writeBatch{}
		s.backlog = s.backlog[1:]
	}
	if len(s.backlog) == 0 {
		s.backlog = nil
	}
	s.sendReplies()
	if len(s.reposts) > 0 {
		_ = s.srq.PostRecv(s.reposts) // fails only once the SRQ is destroyed
		s.reposts = s.reposts[:0]
	}
	s.notePending()
	if len(s.backlog) == 0 {
		// Everything handed out was posted, and PostSend copied it.
		s.arena = s.arena[:0]
	}
}

// onTableWritten releases the replies of a completed write group. A
// failed completion of either loopback QP means the pair is in error: the
// group stays in flight until repairLoopLocked rewrites its slots.
func (s *Server) onTableWritten(wc *verbs.WC) {
	if wc.Status != verbs.StatusSuccess {
		s.loopBroken = true
		return
	}
	g, ok := s.inflight[wc.ID]
	if !ok {
		return
	}
	delete(s.inflight, wc.ID)
	s.queued -= len(g.wrs)
	s.replies = append(s.replies, g.replies...)
}

// repairLoopLocked heals the table writer after its loopback QP pair
// failed (a burst of loss on the host's own address exhausts the RC
// retries as on any path): it destroys the pair, creates and connects a
// new one, and replaces every write group in flight or in the backlog by
// a whole-slot rewrite, from the registry, of each slot they write. A
// group in flight may have executed any prefix of its WRITEs, so its
// slots may hold a write in progress (odd head) that readers refuse; the
// rewrite gives each slot its current entry under a newer version, in the
// order the groups wrote them. The groups' replies leave once the rewrite
// is done, so no request is lost. If the pair cannot be created now, the
// next batch or sweep tries again.
//
// It runs on the loop with regMu held.
func (s *Server) repairLoopLocked() {
	if !s.loopBroken && s.loopReq != nil && s.loopReq.State() != verbs.StateErr {
		return
	}
	s.destroyLoop()
	if err := s.setupLoop(); err != nil {
		s.destroyLoop()
		s.loopBroken = true
		return
	}
	s.loopBroken = false
	s.st.loopRepairs.Add(1)
	// The groups in flight in the order they were posted (IDs grow),
	// then the backlog.
	ids := make([]uint64, 0, len(s.inflight))
	for id := range s.inflight {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	groups := make([]writeBatch, 0, len(ids)+len(s.backlog))
	for _, id := range ids {
		groups = append(groups, s.inflight[id])
		delete(s.inflight, id)
	}
	groups = append(groups, s.backlog...)
	s.backlog, s.queued = nil, 0
	var replies []outReply
	seen := make(map[int]bool)
	var wb writeBatch
	if len(groups) > 0 {
		s.rewriteMap(&wb)
		s.queueWrites(&wb)
	}
	for _, g := range groups {
		replies = append(replies, g.replies...)
		for _, i := range g.slots {
			if seen[i] {
				continue // each slot once, where it was first written
			}
			seen[i] = true
			w := slotWrite{slot: i} // free unless a gid lives there
			if gid := s.reg.idx.gids[i]; gid != 0 {
				if l := s.reg.nodes[gid]; l != nil {
					w.e = s.reg.entryOf(l)
				}
			}
			s.addWrites(&wb, []slotWrite{w}, nil) // queues full groups
		}
	}
	wb.replies = replies
	s.queueWrites(&wb)
}

// isLoop reports whether qpn is one of the current loopback QPs.
func (s *Server) isLoop(qpn uint32) bool {
	return s.loopReq != nil && (qpn == s.loopReq.QPN() || qpn == s.loopResp.QPN())
}

// destroyLoop destroys the loopback QP pair; its late completions are
// ignored.
func (s *Server) destroyLoop() {
	for _, q := range []verbs.QP{s.loopReq, s.loopResp} {
		if q != nil {
			s.retired[q.QPN()] = true
			q.Destroy()
		}
	}
	s.loopReq, s.loopResp = nil, nil
}

// splitGroup cuts a write batch into groups of at most n WRITEs, so that
// no group is larger than the loopback send queue (loopDepth): flush posts
// a group only when the queue has room for all of it, and a group larger
// than the queue would wait forever, with every reply queued behind it (a
// sweep that expired 1,024 or more leases at once built one group of
// about four WRITEs per lease and locked the service up).
//
// Any cut is safe. The groups are posted in order on one RC QP, which
// executes and completes them in order, so the WRITEs land as they would
// as one group; a reader meanwhile sees what it could see between any two
// WRITEs (a slot's odd head, an odd membership generation) and reads
// again. The last group carries the batch's replies, which leave only
// once every WRITE before them is done, and its slots, which a repair of
// the loopback QP rewrites: a group still in flight or waiting when the
// pair fails means the last group is too, so every slot the batch touched
// is rewritten.
func splitGroup(wb writeBatch, n int) []writeBatch {
	if len(wb.wrs) <= n {
		return []writeBatch{wb}
	}
	out := make([]writeBatch, 0, (len(wb.wrs)+n-1)/n)
	for len(wb.wrs) > n {
		out = append(out, writeBatch{wrs: wb.wrs[:n:n]})
		wb.wrs = wb.wrs[n:]
	}
	return append(out, wb)
}
