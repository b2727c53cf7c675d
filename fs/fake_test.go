package fs_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/krfs/krfs/fs"
)

// fakeBackend is an in-memory cluster: every peer's regions are byte
// slices, messages go to channels. down marks gids that fail with
// EHOSTDOWN; slow makes every remote call time out.
type fakeBackend struct {
	self uint32

	mu    sync.Mutex
	peers map[uint32]map[string]*fakeRegion
	ports map[uint32]*fakePort // this node's bound ports
	down  map[uint32]bool
	// metaDown makes Peers and PeerInfo fail as with the meta service
	// unreachable (EHOSTDOWN); peers stay reachable.
	metaDown bool
	connect  int // Connect calls
	closed   int // Conn.Close calls
	// fault, if set, runs instead of a remote ReadAt or WriteAt (write
	// tells which) of a peer region; do performs the real transfer.
	fault func(write bool, p []byte, off int64, do func(p []byte, off int64) (int, error)) (int, error)
	// refuseAbove, if set, makes Export refuse a size above it with
	// ENOSPC (a region the store cannot hold).
	refuseAbove int64
	// stale, if set, makes that many next operations (read, write,
	// atomic) on any peer region fail with EIO, as a peer refuses a stale
	// rkey after a restart; Regions calls counts directory reads.
	stale    int
	dirReads int
	started  int // ReadStart calls
	// staleDir makes that many next directory reads fail with EIO (a
	// peer back from a restart refusing its old directory key).
	staleDir int
}

type fakeRegion struct {
	mu   sync.Mutex
	info fs.Region
	data []byte
}

func newFake(self uint32) *fakeBackend {
	f := &fakeBackend{self: self, peers: map[uint32]map[string]*fakeRegion{}, ports: map[uint32]*fakePort{}, down: map[uint32]bool{}}
	f.addPeer(self, 4096)
	return f
}

func (f *fakeBackend) addPeer(gid uint32, memSize int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers[gid] = map[string]*fakeRegion{"mem": {info: fs.Region{Name: "mem", Size: int64(memSize), Mode: 0o666, Remote: true}, data: make([]byte, memSize)}}
}

func (f *fakeBackend) Self() uint32 { return f.self }

func (f *fakeBackend) Peers(ctx context.Context) ([]uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.metaDown {
		return nil, syscall.EHOSTDOWN
	}
	var out []uint32
	for g := range f.peers {
		out = append(out, g)
	}
	return out, nil
}

func (f *fakeBackend) PeerInfo(ctx context.Context, gid uint32) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.metaDown {
		return "", syscall.EHOSTDOWN
	}
	if f.peers[gid] == nil {
		return "", syscall.ENOENT
	}
	return fmt.Sprintf("gid %d\ntransport dct\n", gid), nil
}

func (f *fakeBackend) Connect(ctx context.Context, gid uint32) (fs.Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peers[gid] == nil {
		return nil, syscall.ENOENT
	}
	f.connect++
	return &fakeConn{f: f, gid: gid}, nil
}

func (f *fakeBackend) Regions() []fs.Region {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fs.Region
	for _, r := range f.peers[f.self] {
		out = append(out, r.info)
	}
	return out
}

func (f *fakeBackend) Export(name string, size int64, mode, uid, gid uint32) (fs.Region, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs := f.peers[f.self]
	if f.refuseAbove > 0 && size > f.refuseAbove {
		return fs.Region{}, syscall.ENOSPC
	}
	if r := rs[name]; r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		nd := make([]byte, size)
		copy(nd, r.data)
		r.data, r.info.Size = nd, size
		return r.info, nil
	}
	r := &fakeRegion{info: fs.Region{Name: name, Size: size, Mode: mode, UID: uid, GID: gid, Remote: true}, data: make([]byte, size)}
	rs[name] = r
	return r.info, nil
}

func (f *fakeBackend) Unexport(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == "mem" {
		return syscall.EBUSY
	}
	if f.peers[f.self][name] == nil {
		return syscall.ENOENT
	}
	delete(f.peers[f.self], name)
	return nil
}

func (f *fakeBackend) LocalRegion(name string) (fs.LocalRegion, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.peers[f.self][name]
	if r == nil {
		return nil, syscall.ENOENT
	}
	return r, nil
}

func (f *fakeBackend) Bind(port uint32) (fs.Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ports[port] != nil {
		return nil, syscall.EADDRINUSE
	}
	p := &fakePort{f: f, num: port, wake: make(chan struct{}, 1)}
	f.ports[port] = p
	return p, nil
}

func (f *fakeBackend) Ports() []uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []uint32
	for p := range f.ports {
		out = append(out, p)
	}
	return out
}

func (f *fakeBackend) Stats(w io.Writer, json bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if json {
		_, err := fmt.Fprintf(w, "{\"connects\": %d, \"Regions\": [{\"name\": \"mem\", \"rkey\": 4660}]}\n", f.connect)
		return err
	}
	_, err := fmt.Fprintf(w, "connects %d\n", f.connect)
	return err
}

func (r *fakeRegion) Info() fs.Region {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.info
}

func (r *fakeRegion) ReadAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if off+int64(len(p)) > int64(len(r.data)) {
		return 0, syscall.EINVAL
	}
	return copy(p, r.data[off:]), nil
}

func (r *fakeRegion) WriteAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if off+int64(len(p)) > int64(len(r.data)) {
		return 0, syscall.EFBIG
	}
	return copy(r.data[off:], p), nil
}

func (r *fakeRegion) FetchAdd(off int64, d uint64) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := binary.NativeEndian.Uint64(r.data[off:])
	binary.NativeEndian.PutUint64(r.data[off:], old+d)
	return old, nil
}

func (r *fakeRegion) CompareAndSwap(off int64, cmp, swap uint64) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := binary.NativeEndian.Uint64(r.data[off:])
	if old == cmp {
		binary.NativeEndian.PutUint64(r.data[off:], swap)
	}
	return old, nil
}

func (r *fakeRegion) Chmod(mode uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.info.Mode = mode
	return nil
}

func (r *fakeRegion) Chown(uid, gid uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.info.UID, r.info.GID = uid, gid
	return nil
}

type fakeConn struct {
	f   *fakeBackend
	gid uint32
}

func (c *fakeConn) region(name string) (*fakeRegion, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if c.f.down[c.gid] {
		return nil, syscall.EHOSTDOWN
	}
	if c.f.stale > 0 {
		c.f.stale--
		return nil, syscall.EIO
	}
	r := c.f.peers[c.gid][name]
	if r == nil {
		return nil, syscall.ENOENT
	}
	return r, nil
}

func (c *fakeConn) Regions(ctx context.Context) ([]fs.Region, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.f.dirReads++
	if c.f.staleDir > 0 {
		c.f.staleDir--
		return nil, syscall.EIO
	}
	if c.f.down[c.gid] {
		return nil, syscall.EHOSTDOWN
	}
	var out []fs.Region
	for _, r := range c.f.peers[c.gid] {
		out = append(out, r.Info())
	}
	return out, nil
}

func (c *fakeConn) ReadAt(ctx context.Context, region string, p []byte, off int64) (int, error) {
	r, err := c.region(region)
	if err != nil {
		return 0, err
	}
	if fault := c.faultHook(); fault != nil {
		return fault(false, p, off, r.ReadAt)
	}
	return r.ReadAt(p, off)
}

// ReadStart makes the fake a fs.ReadStarter: the READ happens, and fails
// if it does, when it is waited for, as a NIC's error comes with the
// completion.
func (c *fakeConn) ReadStart(ctx context.Context, region string, p []byte, off int64) (fs.StartedRead, error) {
	c.f.mu.Lock()
	c.f.started++
	c.f.mu.Unlock()
	return &fakeStarted{c: c, region: region, p: p, off: off}, nil
}

type fakeStarted struct {
	c      *fakeConn
	region string
	p      []byte
	off    int64
	done   bool
	n      int
	err    error
}

func (s *fakeStarted) Ready() bool { return s.done }

// Await performs the READ: it completes at once.
func (s *fakeStarted) Await(time.Duration) bool {
	if !s.done {
		s.n, s.err = s.c.ReadAt(context.Background(), s.region, s.p, s.off)
		s.done = true
	}
	return true
}

func (s *fakeStarted) Wait(ctx context.Context) (int, error) {
	s.Await(0)
	return s.n, s.err
}

func (c *fakeConn) WriteAt(ctx context.Context, region string, p []byte, off int64) (int, error) {
	r, err := c.region(region)
	if err != nil {
		return 0, err
	}
	if fault := c.faultHook(); fault != nil {
		return fault(true, p, off, r.WriteAt)
	}
	return r.WriteAt(p, off)
}

func (c *fakeConn) faultHook() func(bool, []byte, int64, func([]byte, int64) (int, error)) (int, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	return c.f.fault
}

func (c *fakeConn) FetchAdd(ctx context.Context, region string, off int64, d uint64) (uint64, error) {
	r, err := c.region(region)
	if err != nil {
		return 0, err
	}
	return r.FetchAdd(off, d)
}

func (c *fakeConn) CompareAndSwap(ctx context.Context, region string, off int64, cmp, swap uint64) (uint64, error) {
	r, err := c.region(region)
	if err != nil {
		return 0, err
	}
	return r.CompareAndSwap(off, cmp, swap)
}

func (c *fakeConn) Send(ctx context.Context, port uint32, msg []byte) error {
	c.f.mu.Lock()
	if c.f.down[c.gid] {
		c.f.mu.Unlock()
		return syscall.EHOSTDOWN
	}
	var p *fakePort
	if c.gid == c.f.self {
		p = c.f.ports[port]
	}
	c.f.mu.Unlock()
	if p == nil {
		return syscall.ECONNREFUSED
	}
	p.put(append([]byte(nil), msg...), false)
	return nil
}

func (c *fakeConn) Close() error {
	c.f.mu.Lock()
	c.f.closed++
	c.f.mu.Unlock()
	return nil
}

// fakePort is a bound port: a queue of messages. It is a StreamPort.
type fakePort struct {
	f    *fakeBackend
	num  uint32
	wake chan struct{} // a message was queued

	mu sync.Mutex
	q  [][]byte
	// takeLate, if set, makes a waiting Recv whose context ends take the
	// next message anyway, once one is queued, and return it: a message
	// taken from the queue just as its reader is interrupted. waiting and
	// gaveUp, if set, are told when such a Recv waits and when its
	// context has ended.
	takeLate        bool
	waiting, gaveUp chan struct{}
	onQueue         func()
}

func (p *fakePort) OnQueue(f func()) {
	p.mu.Lock()
	p.onQueue = f
	p.mu.Unlock()
}

var _ fs.StreamPort = (*fakePort)(nil)

func (p *fakePort) put(m []byte, front bool) {
	p.mu.Lock()
	if front {
		p.q = append([][]byte{m}, p.q...)
	} else {
		p.q = append(p.q, m)
	}
	f := p.onQueue
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	if f != nil {
		f()
	}
}

// take returns the next message, ok false when none is queued.
func (p *fakePort) take(buf []byte) (n int, ok bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.q) > 0 {
		m := p.q[0]
		if len(m) > len(buf) {
			return 0, true, syscall.EMSGSIZE
		}
		p.q = p.q[1:]
		if len(p.q) > 0 {
			select {
			case p.wake <- struct{}{}:
			default:
			}
		}
		return copy(buf, m), true, nil
	}
	return 0, false, nil
}

func (p *fakePort) Recv(ctx context.Context, buf []byte) (int, error) {
	p.mu.Lock()
	late, waiting, gaveUp := p.takeLate, p.waiting, p.gaveUp
	p.mu.Unlock()
	told := false
	for {
		if n, ok, err := p.take(buf); ok {
			return n, err
		}
		if late && !told && waiting != nil {
			told = true
			close(waiting)
		}
		select {
		case <-p.wake:
		case <-ctx.Done():
			if !late {
				return 0, ctx.Err()
			}
			if gaveUp != nil {
				close(gaveUp)
				gaveUp = nil
			}
			<-p.wake
		}
	}
}

func (p *fakePort) TryRecv(ctx context.Context, buf []byte) (int, error) {
	if n, ok, err := p.take(buf); ok {
		return n, err
	}
	return 0, syscall.EAGAIN
}

func (p *fakePort) Unrecv(msg []byte) { p.put(append([]byte(nil), msg...), true) }

func (p *fakePort) QueuedBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b int64
	for _, m := range p.q {
		b += int64(len(m))
	}
	return b
}

func (p *fakePort) Close() error {
	p.f.mu.Lock()
	delete(p.f.ports, p.num)
	p.f.mu.Unlock()
	return nil
}

// Capacity: a store of 64 MiB with 60 MiB free, 50 regions.
func (f *fakeBackend) Capacity() (total, free int64, maxRegions int, err error) {
	return 64 << 20, 60 << 20, 50, nil
}
