package qpcore

import (
	"context"
	"fmt"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// The send side of messages: Send, and the SEND of a header (and a small
// payload) through a bounce buffer on the peer's internal VQP.

// Send sends msg to port on peer gid and returns once it is queued on
// the port (small) or pulled by the reader (large). It fails with
// ErrNoPort if the port is not bound, and with ErrPortFull if the port's
// queue stayed full until ctx ended (it retries meanwhile). A small
// message whose attempt was on its way when ctx ended may still be
// queued by the receiver after Send returned its error, if the port has
// room by the time it arrives.
func (n *Node) Send(ctx context.Context, gid uint32, port uint32, msg []byte) error {
	p, err := n.peerRef(ctx, gid)
	if err != nil {
		return err
	}
	defer n.unref(p)
	h := msgHdr{port: port, src: n.gid.Load(), length: uint64(len(msg)), inc: n.incarnation}
	var mr verbs.MR
	if len(msg) < n.cfg.MsgThreshold {
		h.kind = msgData
	} else {
		if mr, err = n.pd.RegMR(msg, verbs.AccessRemoteRead); err != nil {
			return fmt.Errorf("qpcore: exposing a message: %w", err)
		}
		defer mr.Dereg()
		h.kind, h.rkey, h.raddr = msgRTS, mr.RKey(), mr.IOVA()
	}
	ch := make(chan uint8, 2)
	n.msg.mu.Lock()
	n.msg.token++
	tok := n.msg.token
	n.msg.rdv[tok] = ch
	n.msg.mu.Unlock()
	defer func() {
		n.msg.mu.Lock()
		delete(n.msg.rdv, tok)
		n.msg.mu.Unlock()
	}()
	h.token = tok
	if h.src == 0 && h.kind == msgData {
		// A node outside the meta service (a benchmark client) cannot be
		// answered: its message is sent as is, without a verdict.
		h.token = 0
		if err := n.sendSmall(ctx, p, &h, msg); err != nil {
			return err
		}
		n.stats.msgSent.Add(1)
		return nil
	}
	backoff := time.Millisecond
	full := false // the port was full at least once
	portFull := func() error {
		return fmt.Errorf("%w: port %d on gid %d until %v", ErrPortFull, port, gid, context.Cause(ctx))
	}
	for {
		payload := msg
		if h.kind == msgRTS {
			payload = nil
		}
		if err := n.sendSmall(ctx, p, &h, payload); err != nil {
			if full && ctx.Err() != nil {
				return portFull()
			}
			return err
		}
		timeout, stop := clock.After(n.clock, n.cfg.MsgTimeout)
		var st uint8
		select {
		case st = <-ch:
			stop()
		case <-ctx.Done():
			stop()
			if full {
				return portFull()
			}
			return ctx.Err()
		case <-timeout:
			if h.kind == msgData {
				return fmt.Errorf("%w: no answer from the receiver within %v", ErrTimeout, n.cfg.MsgTimeout)
			}
			return fmt.Errorf("%w: receiver did not pull the message within %v", ErrTimeout, n.cfg.MsgTimeout)
		}
		switch st {
		case finOK:
			n.stats.msgSent.Add(1)
			if h.kind == msgRTS {
				n.stats.msgRendezvous.Add(1)
			}
			return nil
		case finNoPort:
			return fmt.Errorf("%w: %d on gid %d", ErrNoPort, port, gid)
		case finFull:
			full = true
			n.stats.msgFullRetries.Add(1)
			wait, stop := clock.After(n.clock, backoff)
			select {
			case <-wait:
			case <-ctx.Done():
				stop()
				return portFull()
			}
			backoff = min(2*backoff, 50*time.Millisecond)
		default:
			return fmt.Errorf("%w: the receiver could not pull the message", ErrRemote)
		}
	}
}

// sendSmall SENDs header h and payload through a bounce buffer.
func (n *Node) sendSmall(ctx context.Context, p *peer, h *msgHdr, payload []byte) error {
	b, err := n.msg.getBounce(ctx)
	if err != nil {
		return err
	}
	defer func() { n.msg.bounce <- b }()
	h.put(b.buf)
	copy(b.buf[msgHdrLen:], payload)
	n.stats.msgSmallCopied.Add(uint64(len(payload)))
	o := newOp()
	o.v, o.p, o.code, o.sys = p.sys, p, opSend, true
	o.local, o.lmr = b.buf[:msgHdrLen+len(payload)], b.mr
	o.deadline = n.clock.Now().Add(n.cfg.MsgTimeout)
	o.done = make(chan struct{}, 1)
	if err := n.postSys(p, o); err != nil {
		return err
	}
	n.wait(ctx, o)
	return o.err
}

// postSys enqueues an internal op on p's DC queue.
func (n *Node) postSys(p *peer, o *op) error {
	e := n.newEffects()
	p.mu.Lock()
	if err := n.usableLocked(p); err != nil {
		p.mu.Unlock()
		return err
	}
	n.ops.add(o)
	p.active++
	n.queueLocked(p, o, DC)
	n.kickLocked(p, e)
	p.mu.Unlock()
	n.apply(e)
	return nil
}
