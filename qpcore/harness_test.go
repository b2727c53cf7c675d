package qpcore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// The meta client is a Resolver.
var _ qpcore.Resolver = (*meta.Client)(nil)

// mapResolver is a Resolver over a map, standing in for the meta client.
type mapResolver struct {
	mu      sync.Mutex
	m       map[uint32]meta.NodeInfo
	lookups atomic.Int64
	invals  atomic.Int64
	delay   time.Duration // added to every lookup
}

func newResolver() *mapResolver { return &mapResolver{m: make(map[uint32]meta.NodeInfo)} }

func (r *mapResolver) Lookup(ctx context.Context, gid uint32) (meta.NodeInfo, error) {
	r.lookups.Add(1)
	if r.delay > 0 {
		select {
		case <-time.After(r.delay):
		case <-ctx.Done():
			return meta.NodeInfo{}, ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	info, ok := r.m[gid]
	if !ok {
		return meta.NodeInfo{}, fmt.Errorf("gid %d: %w", gid, meta.ErrNotFound)
	}
	return info, nil
}

func (r *mapResolver) Invalidate(uint32) { r.invals.Add(1) }

func (r *mapResolver) set(info meta.NodeInfo) {
	r.mu.Lock()
	r.m[info.GID] = info
	r.mu.Unlock()
}

// tnode is a node of a test cluster: a softnic device on real UDP, a
// qpcore node, and its exported region "mem".
type tnode struct {
	t    testing.TB
	gid  uint32
	addr string
	dev  *softnic.Device
	n    *qpcore.Node
	mem  []byte
}

type cluster struct {
	t     testing.TB
	res   *mapResolver
	nodes map[uint32]*tnode
}

func newCluster(t testing.TB) *cluster {
	c := &cluster{t: t, res: newResolver(), nodes: make(map[uint32]*tnode)}
	t.Cleanup(func() {
		for _, tn := range c.nodes {
			tn.close()
		}
	})
	return c
}

// add starts node gid on a fresh UDP port (or addr) exporting memSize
// bytes as "mem".
func (c *cluster) add(gid uint32, memSize int, cfg qpcore.Config) *tnode {
	return c.addAt(gid, "127.0.0.1:0", memSize, cfg)
}

func (c *cluster) addAt(gid uint32, addr string, memSize int, cfg qpcore.Config) *tnode {
	t := c.t
	t.Helper()
	dev, err := softnic.OpenUDP(addr)
	if err != nil {
		t.Fatalf("OpenUDP(%s): %v", addr, err)
	}
	cfg.GID = gid
	n, err := qpcore.NewNode(dev, c.res, cfg)
	if err != nil {
		dev.Close()
		t.Fatalf("NewNode: %v", err)
	}
	tn := &tnode{t: t, gid: gid, addr: dev.Addr().String(), dev: dev, n: n}
	if memSize > 0 {
		tn.mem = make([]byte, memSize)
		if _, err := n.Export("mem", tn.mem, verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
			t.Fatal(err)
		}
	}
	c.res.set(n.Info())
	c.nodes[gid] = tn
	return tn
}

func (tn *tnode) close() {
	if tn.n != nil {
		tn.n.Close()
		tn.n = nil
	}
	if tn.dev != nil {
		tn.dev.Close()
		tn.dev = nil
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustConnect(t testing.TB, n *qpcore.Node, gid uint32) *qpcore.VQP {
	t.Helper()
	v, err := n.Connect(ctxT(t, 5*time.Second), gid)
	if err != nil {
		t.Fatalf("Connect(%d): %v", gid, err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

func checkLeaks(t *testing.T) { leaktest.Check(t) }

// noQPErrors fails if any node saw an error completion on a QP.
func noQPErrors(t testing.TB, ns ...*qpcore.Node) {
	t.Helper()
	for _, n := range ns {
		if s := n.Stats(); s.QPErrors != 0 || s.PostErrors != 0 {
			t.Errorf("node %d: %d QP errors, %d post errors (%+v)", n.GID(), s.QPErrors, s.PostErrors, s)
		}
	}
}

func isErr(err, target error) bool { return errors.Is(err, target) }
