package qpcore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// The peer directory cache: each peer's region directory (see regdir.go)
// is READ once and cached; an unknown region name, a NAK for an invalid
// rkey or a new incarnation invalidates it and the next lookup READs it
// again (no more often than dirRefreshMin for unknown names).

// dirRefreshMin is how old a directory must be before an unknown region
// name makes qpcore read it again.
const dirRefreshMin = 5 * time.Millisecond

// regionLocked finds a region of p by name. It may release and retake
// p.mu.
func (n *Node) regionLocked(ctx context.Context, p *peer, name string) (Region, error) {
	if err := n.ensureDirLocked(ctx, p); err != nil {
		return Region{}, err
	}
	r, ok := p.dir[name]
	if !ok && clock.Since(n.clock, p.dirAt) > dirRefreshMin {
		p.dirValid = false
		if err := n.ensureDirLocked(ctx, p); err != nil {
			return Region{}, err
		}
		r, ok = p.dir[name]
	}
	if !ok {
		return Region{}, fmt.Errorf("%w: %q on gid %d", ErrNoRegion, name, p.gid)
	}
	return r, nil
}

// ensureDirLocked makes sure p's directory is cached, reading it if
// needed. It releases p.mu while waiting and returns with it held.
func (n *Node) ensureDirLocked(ctx context.Context, p *peer) error {
	for tries := 0; ; tries++ {
		if err := n.usableLocked(p); err != nil {
			return err
		}
		if p.dirValid {
			return nil
		}
		if tries > 0 && p.dirErr != nil && !p.dirFetching {
			return p.dirErr
		}
		e := newEffects()
		n.fetchDirLocked(p)
		ch := p.dirWait
		n.kickLocked(p, e)
		p.mu.Unlock()
		n.apply(e)
		var err error
		if ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		p.mu.Lock()
		if err != nil {
			return err
		}
	}
}

// fetchDirLocked starts reading p's directory with one READ, unless a
// read is in progress or the directory is valid.
func (n *Node) fetchDirLocked(p *peer) {
	if p.dirFetching || p.dirValid {
		return
	}
	if p.dirWait == nil {
		p.dirWait = make(chan struct{})
	}
	p.dirErr = nil
	if p.info.DirLen == 0 || p.info.DirRKey == 0 {
		n.dirDoneLocked(p, map[string]Region{}, nil)
		return
	}
	buf := make([]byte, p.info.DirLen)
	mr, err := n.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		n.dirDoneLocked(p, nil, err)
		return
	}
	p.dirFetching = true
	o := newOp()
	o.v, o.p, o.code, o.sys = p.sys, p, opRawRead, true
	o.local, o.lmr, o.tmp, o.rkey = buf, mr, true, p.info.DirRKey
	o.onDone = n.dirFetched
	n.ops.add(o)
	p.active++
	n.queueLocked(p, o, DC)
	n.stats.dirReads.Add(1)
}

// dirFetched is the completion of a directory READ.
func (n *Node) dirFetched(o *op) {
	p := o.p
	var regions map[string]Region
	err := o.err
	if err == nil {
		regions, _, err = parseDirectory(o.local)
	}
	e := newEffects()
	p.mu.Lock()
	p.dirFetching = false
	if errors.Is(err, errTorn) && p.dirTorn < 16 {
		p.dirTorn++
		n.stats.dirTorn.Add(1)
		n.fetchDirLocked(p)
	} else {
		if errors.Is(err, errTorn) {
			err = fmt.Errorf("%w: records kept changing during %d READs", ErrDirectory, p.dirTorn+1)
		}
		p.dirTorn = 0
		n.dirDoneLocked(p, regions, err)
		if err != nil {
			// Operations waiting for the directory cannot be checked.
			for _, q := range []*opQueue{&p.dcq, &p.rcq} {
				for _, u := range q.filter(func(x *op) bool { return x.sys }) {
					n.finishLocked(p, u, err, e)
				}
			}
		}
	}
	n.kickLocked(p, e)
	p.mu.Unlock()
	n.apply(e)
}

func (n *Node) dirDoneLocked(p *peer, regions map[string]Region, err error) {
	if err != nil {
		p.dirErr = err
		p.dirValid = false
	} else {
		p.dir, p.dirValid, p.dirAt, p.dirErr = regions, true, n.clock.Now(), nil
	}
	if p.dirWait != nil {
		close(p.dirWait)
		p.dirWait = nil
	}
}

// invalidateDirLocked makes the next user operation read the directory
// again (after a NAK that says the cached one is wrong).
func (n *Node) invalidateDirLocked(p *peer) {
	p.dirValid = false
}
