package qpcore

import (
	"context"
	"errors"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// Rendezvous of large messages: the receiver READs the message from the
// sender's buffer and SENDs the outcome back in a FIN.

// pull READs a rendezvous message into dst and tells the sender.
func (n *Node) pull(ctx context.Context, im *inMsg, dst []byte) error {
	p, err := n.peerRef(ctx, im.from)
	if err != nil {
		return err
	}
	defer n.unref(p)
	me, off, err := n.mem.get(dst)
	if err != nil {
		return err
	}
	o := newOp()
	o.v, o.p, o.code, o.sys = p.sys, p, opRawRead, true
	o.local, o.mem, o.lmr, o.loff, o.rkey, o.off = dst, me, me.mr, off, im.rkey, im.raddr
	o.done = make(chan struct{}, 1)
	if err := n.postSys(p, o); err != nil {
		n.mem.put(me)
		return err
	}
	n.wait(ctx, o)
	st := uint8(finOK)
	if o.err != nil {
		st = finFailed
	} else {
		n.stats.msgLargeBytes.Add(uint64(len(dst)))
		n.stats.msgRecv.Add(1)
	}
	fin := msgHdr{kind: msgFIN, status: st, src: n.gid.Load(), token: im.token, inc: n.incarnation}
	if err := n.sendSmall(context.WithoutCancel(ctx), p, &fin, nil); err != nil {
		n.stats.msgFINErrors.Add(1)
	}
	return o.err
}

// sendFIN tells a rendezvous sender the outcome (goroutine).
func (n *Node) sendFIN(gid uint32, token uint64, status uint8) {
	ctx, cancel := clock.WithTimeout(n.ctx, n.clock, n.cfg.PeerTimeout)
	defer cancel()
	p, err := n.peerRef(ctx, gid)
	if err != nil {
		return
	}
	defer n.unref(p)
	fin := msgHdr{kind: msgFIN, status: status, src: n.gid.Load(), token: token, inc: n.incarnation}
	if n.sendSmall(ctx, p, &fin, nil) != nil {
		n.stats.msgFINErrors.Add(1)
	}
}

// withdrawn reports whether a pull failed because the sender's buffer was
// no longer registered (it gave up waiting): the READ met an access error
// at the sender.
func withdrawn(err error) bool {
	var re *RemoteError
	return errors.As(err, &re) && re.Status == verbs.StatusRemAccessErr && re.Reason == verbs.ReasonRKey
}
