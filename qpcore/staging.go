package qpcore

import "github.com/krfs/krfs/clock"

// Staging: a large message no reader took within MsgStageAfter is pulled
// into the receiver's own memory (at most MsgStageMax bytes at once), so that
// its sender returns.

// stage is a large message that no reader took within MsgStageAfter: the
// receiver pulls it into memory of its own, so that the sender's write
// completes, and the reader later copies it out (a copy counted in
// MsgLargeCopied: zero-copy holds only for a reader that is waiting).
type stage struct {
	done chan struct{} // closed when the pull ended
	data []byte
	err  error
}

// stageUnread pulls a large message that is still queued (no reader took
// it in MsgStageAfter) into the receiver's own memory, if the staging
// budget MsgStageMax allows; the sender's Send then completes.
func (n *Node) stageUnread(pt *Port, from uint32, token uint64) {
	pt.mu.Lock()
	i := -1
	for k := range pt.q {
		if pt.q[k].kind == msgRTS && pt.q[k].from == from && pt.q[k].token == token && pt.q[k].st == nil {
			i = k
			break
		}
	}
	if i < 0 || pt.closed {
		pt.mu.Unlock()
		return // taken by a reader meanwhile
	}
	im := pt.q[i]
	m := &n.msg
	m.mu.Lock()
	if m.staged+int64(im.n) > int64(n.cfg.MsgStageMax) {
		m.mu.Unlock()
		pt.mu.Unlock()
		n.stats.msgStageFull.Add(1)
		return // the sender keeps waiting for a reader
	}
	m.staged += int64(im.n)
	m.mu.Unlock()
	st := &stage{done: make(chan struct{})}
	pt.q[i].st = st
	pt.mu.Unlock()
	if !n.goSafe(func() {
		ctx, cancel := clock.WithTimeout(n.ctx, n.clock, n.cfg.MsgTimeout)
		defer cancel()
		st.data = make([]byte, im.n)
		st.err = n.pull(ctx, &im, st.data)
		if st.err == nil {
			n.stats.msgStaged.Add(1)
		}
		close(st.done)
	}) {
		st.err = ErrClosed
		close(st.done)
	}
}

// unstage gives a staged message's bytes back to the budget.
func (n *Node) unstage(st *stage) {
	n.msg.mu.Lock()
	n.msg.staged -= int64(len(st.data))
	n.msg.mu.Unlock()
	st.data = nil
}
