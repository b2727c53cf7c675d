package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// The fs.Backend of a node: the filesystem's view of qpcore (VQPs and
// regions), the meta client (membership) and the shm store (region
// memory).

var (
	_ fs.Backend         = (*Node)(nil)
	_ fs.BufferRegistrar = (*Node)(nil)
	_ fs.MemoryRegistrar = (*Node)(nil)
	_ fs.FreshConn       = (*vqpConn)(nil)
	_ fs.SizeConn        = (*vqpConn)(nil)
)

// RegisterIOBuffers registers the filesystem's I/O buffers with qpcore
// for good (Register: one MR, no registration per READ) and reports
// them in Stats and the metrics.
func (b *Node) RegisterIOBuffers(p *fs.IOBuffers) error {
	b.ioMu.Lock()
	defer b.ioMu.Unlock()
	if err := b.core.Register(p.Memory()); err != nil {
		return err
	}
	b.ioBufs.Store(p)
	return nil
}

// RegisterMemory registers memory the filesystem's transport owns (the
// FUSE ring entries' payload buffers) with qpcore for good, so that
// READs land in it and WRITEs leave from it with no copy.
func (b *Node) RegisterMemory(m []byte) error {
	b.ioMu.Lock()
	defer b.ioMu.Unlock()
	if err := b.core.Register(m); err != nil {
		return err
	}
	b.ioMem = append(b.ioMem, m)
	return nil
}

// UnregisterMemory undoes RegisterMemory. Memory the node already let
// go of (it closed first, as at unmount) is no error.
func (b *Node) UnregisterMemory(m []byte) error { return b.releaseMemory(m) }

// releaseMemory unregisters m (all RegisterMemory's memory, for a nil m)
// if still registered.
func (b *Node) releaseMemory(m []byte) error {
	b.ioMu.Lock()
	defer b.ioMu.Unlock()
	var first error
	kept := b.ioMem[:0]
	for _, r := range b.ioMem {
		if m != nil && unsafe.SliceData(r) != unsafe.SliceData(m) {
			kept = append(kept, r)
			continue
		}
		if err := b.core.Unregister(r); err != nil && first == nil {
			first = err
		}
	}
	clear(b.ioMem[len(kept):])
	b.ioMem = kept
	return first
}

// UnregisterIOBuffers undoes RegisterIOBuffers. Buffers the node already
// let go of (it closed first, as at unmount) are no error.
func (b *Node) UnregisterIOBuffers(p *fs.IOBuffers) error {
	return b.releaseIOBuffers(p)
}

// releaseIOBuffers unregisters the I/O buffers if they are p (any, for a
// nil p) and still registered.
func (b *Node) releaseIOBuffers(p *fs.IOBuffers) error {
	b.ioMu.Lock()
	defer b.ioMu.Unlock()
	cur := b.ioBufs.Load()
	if cur == nil || p != nil && cur != p {
		return nil
	}
	b.ioBufs.Store(nil)
	return b.core.Unregister(cur.Memory())
}

const exportAccess = verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic

func (b *Node) Self() uint32 { return b.core.GID() }

// Peers lists the live nodes. A node that the previous listing had, or
// that PeerInfo described since, and that this listing lacks has left: its
// cached meta entry is dropped, so that its name stops resolving
// (PeerInfo) at once rather than when the entry expires.
func (b *Node) Peers(ctx context.Context) ([]uint32, error) {
	nodes, err := b.meta.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(nodes))
	now := make(map[uint32]bool, len(nodes))
	for i, n := range nodes {
		out[i] = n.GID
		now[n.GID] = true
	}
	b.listedMu.Lock()
	for g := range b.listed {
		if !now[g] {
			b.meta.Invalidate(g)
		}
	}
	b.listed = now
	b.listedMu.Unlock()
	return out, nil
}

// PeerInfo describes a peer (peers/<gid>/info); the file system also
// calls it to learn that a peer exists (a lookup of peers/<gid>). It goes
// through qpcore's Connect: one meta lookup, after which the peer is known
// to qpcore, so the open that usually follows costs no second lookup.
//
// The meta service decides whether the peer exists: a gid it no longer
// has (a node that deregistered, or whose lease expired) is ENOENT once
// the meta client's cached entry is gone (its TTL, meta.DefaultCacheTTL;
// at once after a listing that lacks it, see Peers), even though qpcore
// still holds the peer's metadata. With the meta service unreachable the
// meta client answers from what it last knew, and qpcore decides; the
// membership check waits at most membershipWait for the meta service, so
// that peers known here keep resolving without waiting for a meta service
// that does not answer.
func (b *Node) PeerInfo(ctx context.Context, gid uint32) (string, error) {
	mctx, cancel := context.WithTimeout(ctx, membershipWait)
	_, err := b.meta.Lookup(mctx, gid)
	cancel()
	if errors.Is(err, meta.ErrNotFound) {
		return "", syscall.ENOENT
	}
	var info meta.NodeInfo
	transport := ""
	v, err := b.core.Connect(ctx, gid)
	switch {
	case err == nil:
		info, transport = v.PeerInfo(), v.Transport().String()
		v.Close()
	case errors.Is(err, qpcore.ErrTransportMismatch):
		// Known to the meta service, unreachable from here: describe it.
		if info, err = b.meta.Lookup(ctx, gid); err != nil {
			return "", err
		}
	case errors.Is(err, meta.ErrNotFound):
		return "", syscall.ENOENT
	default:
		return "", err
	}
	b.listedMu.Lock()
	if b.listed == nil {
		b.listed = map[uint32]bool{}
	}
	b.listed[gid] = true
	b.listedMu.Unlock()
	s := fmt.Sprintf("gid %d\naddress %v\nincarnation %#x\ndct %d\n", info.GID, info.Addr, info.Incarnation, info.DCTN)
	if transport != "" {
		s += fmt.Sprintf("transport %v\n", transport)
	}
	return s, nil
}

// membershipWait bounds PeerInfo's question to the meta service.
const membershipWait = 250 * time.Millisecond

func (b *Node) Connect(ctx context.Context, gid uint32) (fs.Conn, error) {
	v, err := b.core.Connect(ctx, gid)
	if err != nil {
		return nil, err
	}
	return &vqpConn{v: v}, nil
}

func region(r qpcore.Region) fs.Region {
	return fs.Region{Name: r.Name, Size: int64(r.Len), Mode: r.Mode, UID: r.UID, GID: r.GID,
		Remote: r.Access&verbs.AccessRemoteRead != 0}
}

// Regions lists the exported regions and the empty ones (created, not
// yet grown: they have no memory to register, but ls must show them).
func (b *Node) Regions() []fs.Region {
	rs := b.core.Regions()
	out := make([]fs.Region, 0, len(rs))
	seen := make(map[string]bool, len(rs))
	for _, r := range rs {
		out = append(out, region(r))
		seen[r.Name] = true
	}
	if b.store != nil {
		for _, name := range b.store.Mapped() {
			if seen[name] {
				continue
			}
			if r, ok := b.localInfo(name); ok {
				out = append(out, r)
			}
		}
	}
	return out
}

// Export creates a region or resizes an existing one (its shared-memory
// file is grown or shrunk and the region registered again under a new
// rkey; a region of size 0 is listed but not registered). A new region is
// refused with ENOSPC once the node has Config.MaxRegions, a size above
// Config.MaxRegionSize with EFBIG, a bad name with EINVAL; every refusal
// says why, and a refused new region leaves no file behind.
func (b *Node) Export(name string, size int64, mode, uid, gid uint32) (fs.Region, error) {
	if !shm.ValidName(name) {
		return fs.Region{}, fmt.Errorf("region name %q: want 1-32 characters of [A-Za-z0-9._-], not starting with '.': %w", name, syscall.EINVAL)
	}
	if size < 0 || size > b.maxRegionSize {
		return fs.Region{}, fmt.Errorf("region %s: %d bytes: the largest region is %d bytes (--max-region-size): %w", name, size, b.maxRegionSize, syscall.EFBIG)
	}
	if b.store == nil {
		return fs.Region{}, fmt.Errorf("this node has no region store: %w", syscall.EROFS)
	}
	b.regionMu.Lock()
	defer b.regionMu.Unlock()
	old := b.store.Get(name)
	if old == nil {
		if k := len(b.store.Mapped()); k >= b.maxRegions {
			b.log.Warnf("region %s refused: this node already has %d regions, the limit (--max-regions)", name, k)
			return fs.Region{}, fmt.Errorf("region %s: %d regions, the limit (--max-regions): %w", name, k, syscall.ENOSPC)
		}
	} else {
		if cur, _ := b.localInfo(name); cur.Size == size {
			return cur, nil
		}
		if err := b.core.Unexport(name); err != nil && !errors.Is(err, qpcore.ErrNotPresent) {
			return fs.Region{}, err
		}
		m, u, g, _, err := b.store.Stat(name)
		if err != nil {
			return fs.Region{}, err
		}
		mode, uid, gid = uint32(m), uint32(u), uint32(g)
	}
	r, err := b.store.Map(name, size, os.FileMode(mode&0o777), int(uid), int(gid))
	if err != nil {
		if old := b.store.Get(name); old != nil && len(old.Mem) > 0 {
			// A refused growth keeps the old region: export it again.
			_, _ = b.export(old, mode, uid, gid)
		}
		return fs.Region{}, err
	}
	out, err := b.export(r, mode, uid, gid)
	if err != nil && old == nil {
		// Never leave a half-created region behind.
		_ = b.store.Remove(name)
	}
	if err == nil && old != nil && name == qpcore.DefaultRegion {
		b.publishDefault("resized")
	}
	return out, err
}

// publishDefault republishes this node's meta entry after its default
// region changed (why: "resized", "chmod", "chown"). The entry carries the
// region's rkey, length, mode and owner, so that peers that look this node
// up from now on do not start from a stale hint (peers holding the old
// entry see the change within the bound of qpcore's FreshRegion). Not
// fatal: a peer with a stale hint is refused by the NIC (a new rkey) and
// reads the directory, and a stale mode ages out.
func (b *Node) publishDefault(why string) {
	if b.agent == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.agent.Update(ctx, b.core.Info()); err != nil {
		b.log.Infof("publishing the %s default region in the meta entry: %v", why, err)
	}
}

func (b *Node) export(r *shm.Region, mode, uid, gid uint32) (fs.Region, error) {
	if len(r.Mem) == 0 {
		// An empty region is listed locally but has no memory to register.
		return fs.Region{Name: r.Name, Mode: mode, UID: uid, GID: gid}, nil
	}
	if _, err := b.core.Export(r.Name, r.Mem, exportAccess); err != nil {
		return fs.Region{}, err
	}
	qr, err := b.core.SetOwner(r.Name, mode, uid, gid)
	if err != nil {
		return fs.Region{}, err
	}
	return region(qr), nil
}

func (b *Node) Unexport(name string) error {
	if name == "mem" {
		return syscall.EBUSY // the default region lives as long as the node
	}
	if b.store == nil || b.store.Get(name) == nil {
		return syscall.ENOENT
	}
	b.regionMu.Lock()
	defer b.regionMu.Unlock()
	if err := b.core.Unexport(name); err != nil && !errors.Is(err, qpcore.ErrNotPresent) {
		return err
	}
	b.syncMemory()
	return b.store.Remove(name)
}

func (b *Node) localInfo(name string) (fs.Region, bool) {
	for _, r := range b.core.Regions() {
		if r.Name == name {
			return region(r), true
		}
	}
	if b.store != nil && b.store.Get(name) != nil {
		m, u, g, size, err := b.store.Stat(name)
		if err == nil {
			return fs.Region{Name: name, Size: size, Mode: uint32(m), UID: uint32(u), GID: uint32(g)}, true
		}
	}
	return fs.Region{}, false
}

func (b *Node) LocalRegion(name string) (fs.LocalRegion, error) {
	if _, ok := b.localInfo(name); !ok {
		return nil, syscall.ENOENT
	}
	return &localRegion{b: b, name: name}, nil
}

func (b *Node) Bind(port uint32) (fs.Port, error) {
	p, err := b.core.Bind(port)
	if err != nil {
		return nil, err
	}
	return &portAdapter{p: p}, nil
}

func (b *Node) Ports() []uint32 { return b.core.Ports() }

// Stats writes node, cache and NIC counters.
func (b *Node) Stats(w io.Writer, asJSON bool) error {
	st := struct {
		GID     uint32
		Address string
		Node    any
		Meta    meta.ClientStats
		NIC     verbs.DeviceStats
		// Auth and CM: the device's packet authentication and connection
		// manager, if it reports them (verbs.SecurityReporter).
		Auth   *verbs.AuthStats `json:",omitempty"`
		CM     *verbs.CMStats   `json:",omitempty"`
		Server any              `json:",omitempty"`
		// IOBuf: the filesystem's I/O buffers, when a mount registered them.
		IOBuf *fs.IOBufferStats `json:",omitempty"`
		// Fuse: how the mount's FUSE requests are served.
		Fuse *fs.FuseStats `json:"fuse,omitempty"`
		// For `krfs res` (JSON only).
		QPs     []ResQP   `json:",omitempty"`
		Regions []ResMR   `json:",omitempty"`
		Peers   []ResPeer `json:",omitempty"`
	}{GID: b.core.GID(), Address: b.dev.Addr().String(), Node: b.core.Stats(), Meta: b.meta.Stats(), NIC: b.dev.Stats()}
	if b.srv != nil {
		st.Server = b.srv.Stats()
	}
	if p := b.ioBufs.Load(); p != nil {
		s := p.Stats()
		st.IOBuf = &s
	}
	st.Fuse = b.fuseStatsNow()
	if sec, ok := b.securityStats(); ok {
		if sec.Keyed {
			st.Auth = &sec.Auth
		}
		st.CM = &sec.CM
	}
	if asJSON {
		st.QPs, st.Regions, st.Peers = b.ResQPs(), b.ResMRs(), b.ResPeers()
	}
	if asJSON {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(st)
	}
	fmt.Fprintf(w, "gid %d\naddress %s\n", st.GID, st.Address)
	type section struct {
		name string
		v    any
	}
	secs := []section{{"node", st.Node}, {"meta", st.Meta}, {"nic", st.NIC}}
	if st.Auth != nil {
		secs = append(secs, section{"auth", st.Auth})
	}
	if st.CM != nil {
		secs = append(secs, section{"cm", st.CM})
	}
	if st.IOBuf != nil {
		secs = append(secs, section{"iobuf", st.IOBuf})
	}
	for _, sec := range append(secs, section{"meta-server", st.Server}) {
		if sec.v == nil {
			continue
		}
		raw, err := json.Marshal(sec.v)
		if err != nil {
			return err
		}
		// json.Number keeps counters exact (6561369026, not 6.561369026e+09).
		var m map[string]any
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if d.Decode(&m) != nil {
			continue
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "%s.%s %v\n", sec.name, k, m[k])
		}
	}
	return nil
}

// securityStats are the device's authentication and connection-manager
// counters, if it keeps them (softnic does; a hardware RNIC does not).
func (b *Node) securityStats() (verbs.SecurityStats, bool) {
	if r, ok := b.dev.(verbs.SecurityReporter); ok {
		return r.SecurityStats(), true
	}
	return verbs.SecurityStats{}, false
}

// localRegion is regions/<name>: direct access to the mapped memory.
type localRegion struct {
	b    *Node
	name string
}

// mem returns the region's mapping with b.regionMu read-locked (a resize
// remaps it); the caller calls l.b.regionMu.RUnlock when done, also on
// error.
func (l *localRegion) mem() ([]byte, error) {
	l.b.regionMu.RLock()
	if l.b.store == nil {
		return nil, syscall.ENOENT
	}
	r := l.b.store.Get(l.name)
	if r == nil {
		return nil, syscall.ENOENT
	}
	return r.Mem, nil
}

func (l *localRegion) Info() fs.Region {
	r, _ := l.b.localInfo(l.name)
	return r
}

func (l *localRegion) ReadAt(p []byte, off int64) (int, error) {
	m, err := l.mem()
	defer l.b.regionMu.RUnlock()
	if err != nil {
		return 0, err
	}
	if off < 0 || off > int64(len(m)) {
		return 0, syscall.EINVAL
	}
	l.b.syncMemory()
	var n int
	err = shm.Guard(func() { n = copy(p, m[off:]) })
	return n, err
}

func (l *localRegion) WriteAt(p []byte, off int64) (int, error) {
	m, err := l.mem()
	defer l.b.regionMu.RUnlock()
	if err != nil {
		return 0, err
	}
	if off < 0 || off+int64(len(p)) > int64(len(m)) {
		return 0, syscall.EFBIG
	}
	var n int
	if err := shm.Guard(func() { n = copy(m[off:], p) }); err != nil {
		return 0, err
	}
	l.b.syncMemory()
	return n, nil
}

// word returns the 8-byte word at off for CPU atomics, which are atomic
// with the NIC's atomics on the same memory; like mem, it returns with
// b.regionMu read-locked.
func (l *localRegion) word(off int64) (*uint64, error) {
	m, err := l.mem()
	if err != nil {
		return nil, err
	}
	if off < 0 || off%8 != 0 || off+8 > int64(len(m)) {
		return nil, syscall.EINVAL
	}
	return (*uint64)(unsafe.Pointer(&m[off])), nil
}

func (l *localRegion) FetchAdd(off int64, delta uint64) (uint64, error) {
	w, err := l.word(off)
	defer l.b.regionMu.RUnlock()
	if err != nil {
		return 0, err
	}
	var v uint64
	err = shm.Guard(func() { v = atomic.AddUint64(w, delta) - delta })
	return v, err
}

func (l *localRegion) CompareAndSwap(off int64, cmp, swap uint64) (uint64, error) {
	w, err := l.word(off)
	defer l.b.regionMu.RUnlock()
	if err != nil {
		return 0, err
	}
	var old uint64
	err = shm.Guard(func() {
		for {
			old = atomic.LoadUint64(w)
			if old != cmp || atomic.CompareAndSwapUint64(w, old, swap) {
				return
			}
		}
	})
	return old, err
}

func (l *localRegion) Chmod(mode uint32) error {
	info := l.Info()
	if err := l.b.store.Chmod(l.name, os.FileMode(mode&0o777)); err != nil {
		return err
	}
	_, err := l.b.core.SetOwner(l.name, mode, info.UID, info.GID)
	if errors.Is(err, qpcore.ErrNotPresent) {
		err = nil // an empty region is not exported yet
	} else if err == nil && l.name == qpcore.DefaultRegion {
		l.b.publishDefault("chmod")
	}
	return err
}

func (l *localRegion) Chown(uid, gid uint32) error {
	info := l.Info()
	if err := l.b.store.Chown(l.name, int(uid), int(gid)); err != nil {
		return err
	}
	_, err := l.b.core.SetOwner(l.name, info.Mode, uid, gid)
	if errors.Is(err, qpcore.ErrNotPresent) {
		err = nil
	} else if err == nil && l.name == qpcore.DefaultRegion {
		l.b.publishDefault("chown")
	}
	return err
}

// vqpConn adapts a VQP to fs.Conn.
type vqpConn struct{ v *qpcore.VQP }

func (c *vqpConn) Regions(ctx context.Context) ([]fs.Region, error) {
	rs, err := c.v.Regions(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]fs.Region, len(rs))
	for i, r := range rs {
		out[i] = region(r)
	}
	return out, nil
}

// FreshRegions and FreshRegion read the peer's directory again when the
// cached copy is older than maxAge (fs uses them for listings and opens).
func (c *vqpConn) FreshRegions(ctx context.Context, maxAge time.Duration) ([]fs.Region, error) {
	rs, err := c.v.FreshRegions(ctx, maxAge)
	if err != nil {
		return nil, err
	}
	out := make([]fs.Region, len(rs))
	for i, r := range rs {
		out[i] = region(r)
	}
	return out, nil
}

func (c *vqpConn) FreshRegion(ctx context.Context, name string, maxAge time.Duration) (fs.Region, error) {
	r, err := c.v.FreshRegion(ctx, name, maxAge)
	if err != nil {
		return fs.Region{}, err
	}
	return region(r), nil
}

// FreshSize sizes an open without a directory READ when the peer's meta
// entry carries the region (the default region).
func (c *vqpConn) FreshSize(ctx context.Context, name string, maxAge time.Duration) (int64, error) {
	n, err := c.v.FreshSize(ctx, name, maxAge)
	return int64(n), err
}

func (c *vqpConn) ReadAt(ctx context.Context, name string, p []byte, off int64) (int, error) {
	if err := c.v.Read(ctx, p, name, uint64(off)); err != nil {
		return 0, err
	}
	return len(p), nil
}

var _ fs.ReadStarter = (*vqpConn)(nil)

// ReadStart implements fs.ReadStarter.
func (c *vqpConn) ReadStart(ctx context.Context, name string, p []byte, off int64) (fs.StartedRead, error) {
	pr, err := c.v.ReadStart(ctx, p, name, uint64(off))
	if err != nil {
		return nil, err
	}
	return &startedRead{p: pr, n: len(p)}, nil
}

// startedRead is a qpcore.PendingRead as an fs.StartedRead.
type startedRead struct {
	p *qpcore.PendingRead
	n int
}

func (r *startedRead) Ready() bool { return r.p.Ready() }

func (r *startedRead) Await(d time.Duration) bool { return r.p.Await(d) }

func (r *startedRead) Wait(ctx context.Context) (int, error) {
	if err := r.p.Wait(ctx); err != nil {
		return 0, err
	}
	return r.n, nil
}

func (c *vqpConn) WriteAt(ctx context.Context, name string, p []byte, off int64) (int, error) {
	if err := c.v.Write(ctx, p, name, uint64(off)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// FetchAdd and CompareAndSwap run the atomic once: the filesystem retries
// one the peer refused because the region changed (its stale-region rule,
// fs's retryStale), after reading the directory again.
func (c *vqpConn) FetchAdd(ctx context.Context, name string, off int64, d uint64) (uint64, error) {
	return c.v.FetchAdd(ctx, name, uint64(off), d)
}

func (c *vqpConn) CompareAndSwap(ctx context.Context, name string, off int64, cmp, swap uint64) (uint64, error) {
	return c.v.CompareAndSwap(ctx, name, uint64(off), cmp, swap)
}

func (c *vqpConn) Send(ctx context.Context, port uint32, msg []byte) error {
	return c.v.Send(ctx, port, msg)
}

func (c *vqpConn) Close() error { return c.v.Close() }

type portAdapter struct{ p *qpcore.Port }

func (a *portAdapter) Recv(ctx context.Context, buf []byte) (int, error) {
	m, err := a.p.Recv(ctx, buf)
	return m.Len, err
}

func (a *portAdapter) TryRecv(ctx context.Context, buf []byte) (int, error) {
	m, err := a.p.TryRecv(ctx, buf)
	return m.Len, err
}

func (a *portAdapter) Close() error { return a.p.Close() }

var _ fs.StreamPort = (*portAdapter)(nil)

// Unrecv gives a message back to the port; the filesystem does not carry
// the sender's gid, so the message comes back as from gid 0.
func (a *portAdapter) Unrecv(msg []byte) { a.p.Unrecv(0, msg) }

func (a *portAdapter) QueuedBytes() int64 { return a.p.QueuedBytes() }

func (a *portAdapter) OnQueue(f func()) { a.p.OnQueue(f) }

var _ fs.CapacityReporter = (*Node)(nil)

// Capacity reports the region store's filesystem (its size and free
// bytes: regions are files there) and the region count limit, for statfs.
func (b *Node) Capacity() (total, free int64, maxRegions int, err error) {
	if b.store == nil {
		return 0, 0, 0, nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(b.store.Dir(), &st); err != nil {
		return 0, 0, 0, fmt.Errorf("statfs of the region store %s: %w", b.store.Dir(), err)
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, b.maxRegions, nil
}
