package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/nic"
	"github.com/krfs/krfs/node"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// apiTarget benchmarks a peer through the Go API, as a fresh application
// would: its own device, meta client and qpcore node, a VQP to the peer.
type apiTarget struct {
	o      *Opts
	n      *node.Node   // the bench's node (owns the device)
	dev    verbs.Device // n's
	cl     *meta.Client // n's resolver (cached)
	raw    *meta.Client // meta_lookup: no cache
	node   *qpcore.Node // n's
	v      *qpcore.VQP
	gid    uint32
	region string
	regLen uint64
	bufs   [][]byte
	wrs    []qpcore.WR
	cs     []qpcore.Completion
}

func openAPITarget(o *Opts) (_ *apiTarget, err error) {
	servers, err := node.ParseMeta(o.Meta)
	if err == nil && len(servers) == 0 {
		err = fmt.Errorf("--meta %q: want HOST:PORT[,HOST:PORT...]", o.Meta)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if _, err := netip.ParseAddrPort(o.Listen); err != nil {
		return nil, fmt.Errorf("%w: --listen %q: want IP:PORT", ErrUsage, o.Listen)
	}
	t := &apiTarget{o: o, gid: uint32(o.GID), region: o.Region}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	no := o.NIC
	no.Listen = o.Listen
	opened, err := nic.Open(no)
	if err != nil {
		return nil, fmt.Errorf("opening the NIC (--backend %s) on %s: %w", no.Backend, o.Listen, err)
	}
	dev := opened.Dev
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	// --timeout bounds each operation: it is the node's PeerTimeout, from
	// which qpcore derives every operation's deadline and the NIC's
	// retransmission budget (a loaded machine must not fail a benchmark
	// at qpcore's 1 s default when the user asked for more).
	qc := qpcore.Config{VQPDepth: max(o.Outstanding, qpcore.DefaultVQPDepth), DisableRC: o.Transport == "dc", PeerTimeout: o.Timeout,
		NoDC: !opened.DC, Transport: opened.Transport}
	if o.Transport == "rc" {
		// Measuring RC: the peer turns hot on its first operation and
		// keeps its RC QP for the run. The default policy (2,000
		// operations in 100 ms, torn down after 2 s idle) is a rate in real
		// time that a loaded machine may never reach.
		qc.RCThreshold, qc.RCIdle = 1, time.Hour
	}
	t.n, err = node.Start(ctx, node.Config{
		Device:       dev,
		Meta:         servers,
		QPCore:       qc,
		NoRegister:   !o.Register,
		StartTimeout: o.Timeout,
	}, logrus.New())
	if err != nil {
		return nil, err
	}
	t.dev, t.cl, t.node = t.n.Device(), t.n.Meta(), t.n.Core()
	if o.Test == "meta_lookup" {
		if t.raw, err = meta.NewClient(ctx, t.dev, meta.ClientConfig{Servers: servers, CacheEntries: -1}); err != nil {
			return nil, fmt.Errorf("meta service %v unreachable: %w", servers, err)
		}
	}
	if t.v, err = t.node.Connect(ctx, t.gid); err != nil {
		return nil, fmt.Errorf("connect to gid %d: %w", t.gid, err)
	}
	if o.Test != "send_lat" && o.Test != "meta_lookup" {
		reg, err := t.v.Region(ctx, t.region)
		if err != nil {
			return nil, fmt.Errorf("gid %d region %q: %w", t.gid, t.region, err)
		}
		t.regLen = reg.Len
	}
	if o.Transport == "rc" {
		if err := t.makeHot(); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// makeHot reads from the peer, 64 READs at a time, until qpcore moved
// it to an RC QP.
func (t *apiTarget) makeHot() error {
	const k = 64
	for i := range k {
		t.buf(i, 8)
	}
	end := time.Now().Add(t.o.Timeout)
	for t.v.Transport() != qpcore.RC {
		if time.Now().After(end) {
			return fmt.Errorf("gid %d did not move to RC within %v", t.gid, t.o.Timeout)
		}
		if err := t.stream(false, 8, 16*k, k, time.Time{}, func() {}); err != nil {
			return err
		}
	}
	return nil
}

func (t *apiTarget) describe() string {
	s := fmt.Sprintf("gid %d region %s via meta %s, bench node on %v", t.gid, t.region, t.o.Meta, t.dev.Addr())
	if t.o.Test == "send_lat" {
		s = fmt.Sprintf("gid %d port %d via meta %s, bench node on %v", t.gid, t.o.Port, t.o.Meta, t.dev.Addr())
	}
	if t.v != nil {
		s += fmt.Sprintf(" (transport %v)", t.v.Transport())
	}
	return s
}

func (t *apiTarget) limit() int64 { return int64(t.regLen) }

func (t *apiTarget) buf(i, size int) []byte {
	for len(t.bufs) <= i {
		t.bufs = append(t.bufs, nil)
	}
	if len(t.bufs[i]) < size {
		if t.bufs[i] != nil {
			_ = t.node.Unregister(t.bufs[i])
		}
		t.bufs[i] = make([]byte, size)
		_ = t.node.Register(t.bufs[i]) // else registered on first use
	}
	return t.bufs[i]
}

// ctx is the context of one synchronous operation. The node already ends
// every operation by its deadline (PeerTimeout, which is --timeout), so it
// has no deadline of its own: context.WithTimeout per call would add a
// runtime timer and 4 allocations, 0.5-0.7 us on the 2-vCPU test VM, to
// every figure, which measures Go's timers rather than krfs.
func (t *apiTarget) ctx() (context.Context, context.CancelFunc) {
	return context.Background(), func() {}
}

func (t *apiTarget) read(p []byte) error {
	ctx, cancel := t.ctx()
	defer cancel()
	return t.v.Read(ctx, p, t.region, 0)
}

func (t *apiTarget) write(p []byte) error {
	ctx, cancel := t.ctx()
	defer cancel()
	return t.v.Write(ctx, p, t.region, 0)
}

func (t *apiTarget) fetchAdd() error {
	ctx, cancel := t.ctx()
	defer cancel()
	_, err := t.v.FetchAdd(ctx, t.region, 0, 1)
	return err
}

func (t *apiTarget) send(p []byte) error {
	ctx, cancel := t.ctx()
	defer cancel()
	return t.v.Send(ctx, uint32(t.o.Port), p)
}

func (t *apiTarget) stream(write bool, size, n, outstanding int, deadline time.Time, done func()) error {
	op := qpcore.OpRead
	if write {
		op = qpcore.OpWrite
	}
	if len(t.wrs) < outstanding {
		t.wrs = make([]qpcore.WR, outstanding)
		t.cs = make([]qpcore.Completion, outstanding)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	posted, completed, inflight := 0, 0, 0
	more := func() bool {
		if deadline.IsZero() {
			return posted < n
		}
		return posted%64 != 0 || time.Now().Before(deadline)
	}
	free := make([]int, 0, outstanding) // buffer indexes not in flight
	for i := outstanding - 1; i >= 0; i-- {
		free = append(free, i)
	}
	for {
		k := 0
		for len(free) > 0 && more() {
			i := free[len(free)-1]
			free = free[:len(free)-1]
			t.wrs[k] = qpcore.WR{ID: uint64(i), Op: op, Local: t.bufs[i][:size], Region: t.region}
			k++
			posted++
		}
		if k > 0 {
			if _, err := t.v.Post(ctx, t.wrs[:k], 0); err != nil {
				return err
			}
			inflight += k
		}
		if inflight == 0 {
			return nil
		}
		wctx, wcancel := context.WithTimeout(ctx, t.o.Timeout)
		err := t.v.Wait(wctx)
		wcancel()
		if err != nil {
			return fmt.Errorf("%d operations outstanding: %w", inflight, err)
		}
		m := t.v.Poll(t.cs[:outstanding])
		for _, c := range t.cs[:m] {
			if c.Err != nil {
				return c.Err
			}
			free = append(free, int(c.ID))
			inflight--
			completed++
			done()
		}
	}
}

func (t *apiTarget) variants(test string) []string {
	switch test {
	case "meta_lookup":
		return []string{"one-sided", "rpc"}
	case "fullmesh":
		return []string{"every node, cold"}
	}
	return []string{"warm", "cold", "cold+read8"}
}

func (t *apiTarget) once(test, variant string) (time.Duration, error) {
	ctx, cancel := t.ctx()
	defer cancel()
	switch variant {
	case "every node, cold":
		return t.fullMesh(ctx)
	case "one-sided", "rpc":
		t0 := time.Now()
		var err error
		if variant == "rpc" {
			_, err = t.raw.LookupRPC(ctx, t.gid)
		} else {
			_, err = t.raw.Lookup(ctx, t.gid)
		}
		return time.Since(t0), err
	}
	if variant != "warm" {
		// The bench's own VQP stays open, which keeps the peer known:
		// close it for the cold variants.
		if t.v != nil {
			t.v.Close()
			t.v = nil
		}
		if !t.node.Forget(t.gid) {
			return 0, errors.New("peer still in use; cannot forget it")
		}
	}
	b := t.buf(0, 8)[:8]
	t0 := time.Now()
	v, err := t.node.Connect(ctx, t.gid)
	if err != nil {
		return 0, err
	}
	if variant == "cold+read8" {
		err = v.Read(ctx, b, t.region, 0)
	}
	d := time.Since(t0)
	v.Close()
	return d, err
}

// fullMesh reaches every live node but this one, as a freshly started
// application would: each peer is forgotten first, then connected (one
// meta lookup) and read once (the first operation also reads the peer's
// region directory).
func (t *apiTarget) fullMesh(ctx context.Context) (time.Duration, error) {
	nodes, err := t.cl.List(ctx)
	if err != nil {
		return 0, err
	}
	if t.v != nil {
		t.v.Close()
		t.v = nil
	}
	self := t.node.GID()
	b := t.buf(0, 8)[:8]
	var total time.Duration
	for _, nd := range nodes {
		if nd.GID == self {
			continue
		}
		t.node.Forget(nd.GID)
		t0 := time.Now()
		v, err := t.node.Connect(ctx, nd.GID)
		if err != nil {
			return 0, fmt.Errorf("gid %d: %w", nd.GID, err)
		}
		err = v.Read(ctx, b, t.region, 0)
		total += time.Since(t0)
		v.Close()
		if err != nil {
			return 0, fmt.Errorf("gid %d: %w", nd.GID, err)
		}
	}
	return total, nil
}

func (t *apiTarget) close() error {
	if t.v != nil {
		t.v.Close()
	}
	if t.raw != nil {
		t.raw.Close()
	}
	if t.n != nil {
		t.n.Close()
	}
	return nil
}
