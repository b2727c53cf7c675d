package fs

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// mount holds what every node of one mount shares.
type mount struct {
	b  Backend
	o  Options
	io *IOBuffers // registered with b (a BufferRegistrar); nil: none
	// reply is the FUSE ring entries' payload memory, registered with b
	// (a MemoryRegistrar) when the transport is io_uring; nil: none.
	reply atomic.Pointer[[]byte]

	mu    sync.Mutex            // guards ports
	ports map[uint32]*boundPort // bound through ports/

	dl deadlines // the data path's contexts

	notifier notifier   // nil: goFuseNotifier
	polls    *portPolls // nil: FUSE_POLL not answered (Options.Poll)

	times timesTable // regions' times
}

// unmounted releases what the mount holds once no request can come: the
// data path's deadline and the I/O buffers.
func (m *mount) unmounted() {
	m.dl.close()
	m.releaseIO()
	m.releaseReply()
}

// registerReply registers the FUSE transport's reply memory b, so that
// READs land in it (inReply).
func (m *mount) registerReply(b []byte) error {
	r, ok := m.b.(MemoryRegistrar)
	if !ok {
		return errors.New("the backend cannot register memory")
	}
	if err := r.RegisterMemory(b); err != nil {
		return err
	}
	m.reply.Store(&b)
	return nil
}

// releaseReply unregisters the reply memory, once no request can use it.
func (m *mount) releaseReply() {
	b := m.reply.Swap(nil)
	if b == nil {
		return
	}
	if err := m.b.(MemoryRegistrar).UnregisterMemory(*b); err != nil {
		m.logf("unregistering the FUSE ring buffers: %v", err)
	}
}

// inReply reports whether dest lies in the registered reply memory: a
// READ can then land in dest itself.
func (m *mount) inReply(dest []byte) bool {
	r := m.reply.Load()
	if r == nil || len(dest) == 0 || len(*r) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(*r)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(dest)))
	return p >= lo && p+uintptr(len(dest)) <= lo+uintptr(len(*r))
}

// releaseIO unregisters the I/O buffers, once no request can use them.
func (m *mount) releaseIO() {
	if m.io == nil {
		return
	}
	if err := m.b.(BufferRegistrar).UnregisterIOBuffers(m.io); err != nil {
		m.logf("unregistering the I/O buffers: %v", err)
	}
	m.io = nil
}

func (m *mount) logf(format string, args ...any) {
	if m.o.Logf != nil {
		m.o.Logf(format, args...)
	}
}

func (m *mount) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	// FUSE cancels ctx when the calling process gets a signal; a short
	// remote operation is not worth abandoning half way (docs/machine-notes.md), so
	// only the mount's own timeout bounds it.
	return context.WithTimeout(context.WithoutCancel(parent), m.o.Timeout)
}

// root is the mount's root directory.
type root struct {
	gofs.Inode
	syncNode
	readOnlyDir
	m *mount
}

var (
	_ = (gofs.NodeOnAdder)((*root)(nil))
	_ = (gofs.NodeLookuper)((*root)(nil))
)

// fixedEntryTimeout is how long the kernel may keep the entry of a name
// whose meaning cannot change: a fixed child of a directory (the root's
// peers, regions, ports, stats; a peer's mem, mr, ports, info, and a
// port of a peer, ports/<n>). Such a
// name always leads to the same inode for as long as its parent does, so
// a LOOKUP of it only repeats what the kernel knows; with the mount's
// 1 s every new process that opens peers/<gid>/mem more than a second
// after the last one paid a LOOKUP of peers and one of mem per peer (the
// latter a Getattr: a meta lookup or directory READ when the peer is not
// cached). Attributes keep the mount's short timeout: a region's size,
// mode and owner change. peers/<gid> of a node the meta service lists
// gets peerEntryTimeout: a gid's node can leave, and the name must then
// stop resolving within that time (an open of its files fails at once);
// one answered from the last known list (meta service unreachable) keeps
// the mount's.
const fixedEntryTimeout = time.Hour

// peerEntryTimeout is the entry timeout of a live peers/<gid>. The
// meta client already answers a lookup from its DCCache (up to its TTL,
// 30 s by default); 1 s made every RACE bootstrap whose process came
// more than a second after the last one pay a LOOKUP per memory node
// (4 of 15 FUSE requests with 4 nodes).
const peerEntryTimeout = 10 * time.Second

// noNegativeEntry makes a Lookup's ENOENT reach the kernel as an error,
// which it does not cache (with the mount's NegativeTimeout, go-fuse would
// turn it into a negative entry kept that long; it does not when the
// Lookup set an entry timeout of its own, and a kernel that did cache it
// would keep it for a nanosecond).
func noNegativeEntry(out *fuse.EntryOut) { out.SetEntryTimeout(time.Nanosecond) }

// lookupFixed answers a LOOKUP of one of dir's fixed children (added in
// OnAdd) as go-fuse would, with the child's attributes, but with an
// entry timeout of fixedEntryTimeout. A child whose attributes cannot be
// had now (a peer that does not answer) gets the mount's short timeout,
// so that the kernel asks again soon.
func lookupFixed(ctx context.Context, dir *gofs.Inode, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ch := dir.GetChild(name)
	if ch == nil {
		return nil, syscall.ENOENT
	}
	if ga, ok := ch.Operations().(gofs.NodeGetattrer); ok {
		var a fuse.AttrOut
		if ga.Getattr(ctx, nil, &a) != 0 {
			return ch, 0
		}
		out.Attr = a.Attr
	}
	out.SetEntryTimeout(fixedEntryTimeout)
	return ch, 0
}

func (r *root) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return lookupFixed(ctx, r.EmbeddedInode(), name, out)
}

func newRoot(b Backend, o Options) *root {
	return &root{m: &mount{b: b, o: o, ports: map[uint32]*boundPort{}, dl: deadlines{timeout: o.Timeout, now: time.Now}}}
}

func (r *root) OnAdd(ctx context.Context) {
	m := r.m
	add := func(name string, n gofs.InodeEmbedder, mode uint32) {
		r.AddChild(name, r.NewPersistentInode(ctx, n, gofs.StableAttr{Mode: mode}), false)
	}
	add("peers", &peersDir{m: m}, syscall.S_IFDIR)
	add("regions", &regionsDir{m: m}, syscall.S_IFDIR)
	add("ports", &portsDir{m: m}, syscall.S_IFDIR)
	add("stats", &textFile{m: m, render: func(w *bytes.Buffer) error { return m.b.Stats(w, false) }}, syscall.S_IFREG)
	add("stats.json", &textFile{m: m, redact: true, render: func(w *bytes.Buffer) error { return m.b.Stats(w, true) }}, syscall.S_IFREG)
}

// How fresh the files under peers/<gid>/ are. A listing of mr/ reads the
// peer's region directory again; a name it does not know, an open or a
// stat uses a copy at most peerFresh old, and a name that copy lacks is
// looked up in the directory read again (a region created on the peer is
// found at once; the kernel keeps no negative entry under mr/, see
// peerMRDir.Lookup). A read or write that
// fails because the region changed (new rkey, new size, removed) reads
// the directory again and is retried once. An atomic is retried by the
// backend, and only when the peer refused it (it did not act).
const peerFresh = time.Second

func freshRegions(ctx context.Context, conn Conn, maxAge time.Duration) ([]Region, error) {
	if fc, ok := conn.(FreshConn); ok {
		return fc.FreshRegions(ctx, maxAge)
	}
	return conn.Regions(ctx)
}

func freshRegion(ctx context.Context, conn Conn, name string, maxAge time.Duration) (Region, error) {
	if fc, ok := conn.(FreshConn); ok {
		return fc.FreshRegion(ctx, name, maxAge)
	}
	rs, err := conn.Regions(ctx)
	if err != nil {
		return Region{}, err
	}
	for _, r := range rs {
		if r.Name == name {
			return r, nil
		}
	}
	return Region{}, syscall.ENOENT
}

// peersDir lists the live nodes of the cluster. With the meta service
// unreachable it shows the last list it got, and peers on it stay
// reachable by name (their metadata is cached below).
type peersDir struct {
	gofs.Inode
	syncNode
	readOnlyDir
	m *mount

	mu   sync.Mutex // guards last
	last []uint32   // the last list the meta service gave
}

// lastKnown reports whether gid was on the last list.
func (d *peersDir) lastKnown(gid uint32) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := sort.Search(len(d.last), func(i int) bool { return d.last[i] >= gid })
	return i < len(d.last) && d.last[i] == gid
}

// unavailable reports whether err says the meta service (or the peer)
// did not answer, as opposed to a definite answer such as ENOENT.
func unavailable(err error) bool {
	switch errno(err) {
	case syscall.EHOSTDOWN, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.EIO:
		return true
	}
	return false
}

var _ = (gofs.NodeReaddirer)((*peersDir)(nil))
var _ = (gofs.NodeLookuper)((*peersDir)(nil))

func (d *peersDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	c, cancel := d.m.ctx(ctx)
	defer cancel()
	gids, err := d.m.b.Peers(c)
	d.mu.Lock()
	switch {
	case err == nil:
		sort.Slice(gids, func(i, j int) bool { return gids[i] < gids[j] })
		d.last = gids
	case d.last != nil && unavailable(err):
		d.m.logf("peers: meta service unavailable (%v): listing the last known peers", err)
		gids = d.last
	default:
		d.mu.Unlock()
		return nil, errno(err)
	}
	d.mu.Unlock()
	ents := make([]fuse.DirEntry, len(gids))
	for i, g := range gids {
		ents[i] = fuse.DirEntry{Name: fmtUint(g), Mode: syscall.S_IFDIR}
	}
	return gofs.NewListDirStream(ents), 0
}

func (d *peersDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	gid, ok := parseUint(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	c, cancel := d.m.ctx(ctx)
	defer cancel()
	_, err := d.m.b.PeerInfo(c, gid)
	if err != nil && !(unavailable(err) && d.lastKnown(gid)) {
		return nil, errno(err)
	}
	out.Mode = syscall.S_IFDIR | 0o755
	if err == nil {
		out.SetEntryTimeout(peerEntryTimeout)
	}
	// The same inode as long as the kernel holds it: a new one at every
	// revalidation (an entry times out after 1 s) would change the
	// dentry's node id, which makes the kernel drop it and look the name
	// up a second time, and re-create mem, mr, ports and info under it.
	if ch := d.GetChild(name); ch != nil {
		if _, ok := ch.Operations().(*peerDir); ok {
			return ch, 0
		}
	}
	return d.NewInode(ctx, &peerDir{m: d.m, gid: gid}, gofs.StableAttr{Mode: syscall.S_IFDIR}), 0
}

// peerDir is peers/<gid>/: mem, mr/, ports/, info.
type peerDir struct {
	gofs.Inode
	syncNode
	readOnlyDir
	m   *mount
	gid uint32
}

var (
	_ = (gofs.NodeOnAdder)((*peerDir)(nil))
	_ = (gofs.NodeLookuper)((*peerDir)(nil))
)

// Lookup: mem, mr, ports and info never change meaning under a peer.
func (d *peerDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return lookupFixed(ctx, d.EmbeddedInode(), name, out)
}

func (d *peerDir) OnAdd(ctx context.Context) {
	add := func(name string, n gofs.InodeEmbedder, mode uint32) {
		d.AddChild(name, d.NewPersistentInode(ctx, n, gofs.StableAttr{Mode: mode}), false)
	}
	add("mem", &remoteFile{m: d.m, gid: d.gid, region: "mem"}, syscall.S_IFREG)
	add("mr", &peerMRDir{m: d.m, gid: d.gid}, syscall.S_IFDIR)
	add("ports", &peerPortsDir{m: d.m, gid: d.gid}, syscall.S_IFDIR)
	add("info", &textFile{m: d.m, render: func(w *bytes.Buffer) error {
		c, cancel := d.m.ctx(context.Background())
		defer cancel()
		s, err := d.m.b.PeerInfo(c, d.gid)
		w.WriteString(s)
		return err
	}}, syscall.S_IFREG)
}

// peerMRDir lists a peer's exported regions.
type peerMRDir struct {
	gofs.Inode
	syncNode
	readOnlyDir
	m   *mount
	gid uint32
}

var _ = (gofs.NodeReaddirer)((*peerMRDir)(nil))
var _ = (gofs.NodeLookuper)((*peerMRDir)(nil))

// conn opens a VQP to the peer for one directory operation.
func (d *peerMRDir) withConn(ctx context.Context, f func(c context.Context, conn Conn) error) error {
	c, cancel := d.m.ctx(ctx)
	defer cancel()
	conn, err := d.m.b.Connect(c, d.gid)
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(c, conn)
}

// Readdir reads the peer's region directory again: regions created or
// removed on the peer show at once.
func (d *peerMRDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	var rs []Region
	err := d.withConn(ctx, func(c context.Context, conn Conn) (err error) {
		rs, err = freshRegions(c, conn, 0)
		if staleErr(err) {
			// The stale-region rule (retryStale), for the directory
			// itself: a peer back from a restart or an outage refuses
			// the directory READ of its old incarnation once.
			rs, err = freshRegions(c, conn, 0)
		}
		return err
	})
	if err != nil {
		return nil, errno(err)
	}
	ents := make([]fuse.DirEntry, 0, len(rs))
	for _, r := range rs {
		ents = append(ents, fuse.DirEntry{Name: r.Name, Mode: syscall.S_IFREG})
	}
	return gofs.NewListDirStream(ents), 0
}

// Lookup finds a region in a copy of the directory at most peerFresh
// old; a name that copy lacks is looked up in the directory read again
// (a region just created on the peer). A name the peer does not have is
// ENOENT with no negative entry: the kernel asks again at the next
// lookup, so a region created on the peer right after a failed lookup is
// found at once. (Each such lookup costs a FUSE LOOKUP and a directory
// READ; the names under peers/<gid>/ itself never change and keep the
// mount's negative entries.)
func (d *peerMRDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var r Region
	err := d.withConn(ctx, func(c context.Context, conn Conn) (err error) {
		r, err = freshRegion(c, conn, name, peerFresh)
		if errno(err) == syscall.ENOENT || staleErr(err) {
			r, err = freshRegion(c, conn, name, 0) // as in Readdir
		}
		return err
	})
	if err != nil {
		e := errno(err)
		if e == syscall.ENOENT {
			noNegativeEntry(out)
		}
		return nil, e
	}
	f := &remoteFile{m: d.m, gid: d.gid, region: name}
	f.fill(&out.Attr, r)
	d.m.times.peerTimes(d.gid, name).fill(&out.Attr)
	return d.NewInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}

// remoteFile is a peer's region; each open is one virtual QP.
type remoteFile struct {
	gofs.Inode
	syncNode
	m      *mount
	gid    uint32
	region string
}

var (
	_ = (gofs.NodeOpener)((*remoteFile)(nil))
	_ = (gofs.NodeGetattrer)((*remoteFile)(nil))
	_ = (gofs.NodeReader)((*remoteFile)(nil))
	_ = (gofs.NodeWriter)((*remoteFile)(nil))
	_ = (gofs.NodeIoctler)((*remoteFile)(nil))
	_ = (gofs.NodeReleaser)((*remoteFile)(nil))
	_ = (gofs.NodeSetattrer)((*remoteFile)(nil))
)

// remoteHandle is an open remote file: its VQP, the region size as last
// seen (at open, then refreshed when an operation meets the end or a
// change) and whether it was opened for writing (atomics need that).
type remoteHandle struct {
	conn     Conn
	times    *fileTimes // the region's, moved by writes and atomics
	size     atomic.Int64
	writable bool
}

// refresh reads the region's size again from a directory copy at most
// maxAge old. A removed region is ENOENT.
func (h *remoteHandle) refresh(ctx context.Context, region string, maxAge time.Duration) error {
	r, err := freshRegion(ctx, h.conn, region, maxAge)
	if err != nil {
		return err
	}
	h.size.Store(r.Size)
	return nil
}

// The stale-region retry rule, the one place that has it: an operation on
// a peer's region (a read, a write, an atomic) that fails because the
// region may have changed under the handle (staleErr: the peer restarted
// or re-registered the region: a new rkey, a new size, removed) reads the
// peer's directory again (refresh, one re-lookup: qpcore looks the peer
// itself up again when its keys changed) and runs once more. A second
// failure is returned as it is. Such a failure means the operation did not
// act (the peer refused it, or it was never sent), so an atomic is retried
// by the same rule; an atomic whose outcome is unknown fails with
// ETIMEDOUT, which is never retried.
//
// retryStale runs op(0) and, if it reports a stale failure, refreshes the
// handle's view of region and runs op(1). It returns the refresh's error,
// if that failed (op's outcome is then the first failure's).
func (h *remoteHandle) retryStale(ctx context.Context, region string, op func(try int) (stale bool)) error {
	if !op(0) {
		return nil
	}
	if err := h.refresh(ctx, region, 0); err != nil {
		return err
	}
	op(1)
	return nil
}

// staleErr reports whether a data operation's error may come from a
// region that changed under the handle (a new rkey, a new size, removed):
// worth reading the directory again and retrying once. A silent peer or
// an expired deadline is not.
func staleErr(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	switch errno(err) {
	case syscall.EIO, syscall.EFBIG, syscall.ENOENT, syscall.ESTALE:
		return true
	}
	return false
}

func (f *remoteFile) fill(a *fuse.Attr, r Region) {
	a.Size = uint64(r.Size)
	a.Mode = syscall.S_IFREG | r.Mode&0o7777
	a.Uid, a.Gid = r.UID, r.GID
}

func (f *remoteFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	c, cancel := f.m.ctx(ctx)
	defer cancel()
	var conn Conn
	h, open := fh.(*remoteHandle)
	if open {
		conn = h.conn
	} else {
		var err error
		if conn, err = f.m.b.Connect(c, f.gid); err != nil {
			return errno(err)
		}
		defer conn.Close()
	}
	r, err := freshRegion(c, conn, f.region, peerFresh)
	if err != nil {
		return errno(err)
	}
	if open {
		h.size.Store(r.Size)
	}
	f.fill(&out.Attr, r)
	f.m.times.peerTimes(f.gid, f.region).fill(&out.Attr)
	return 0
}

// Setattr accepts only a size equal to the region's or 0 (so O_TRUNC of a
// shell redirection is harmless: ignored, with the times it carries);
// anything else (a resize, chmod, chown, utimensat) is EPERM: a peer's
// region is the peer's.
func (f *remoteFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetMode(); ok {
		return syscall.EPERM
	}
	if _, ok := in.GetUID(); ok {
		return syscall.EPERM
	}
	if _, ok := in.GetGID(); ok {
		return syscall.EPERM
	}
	sz, sizeOK := in.GetSize()
	_, aok := in.GetATime()
	_, mok := in.GetMTime()
	if (aok || mok) && !sizeOK {
		return syscall.EPERM
	}
	if sizeOK {
		var cur fuse.AttrOut
		if e := f.Getattr(ctx, fh, &cur); e != 0 {
			return e
		}
		if sz != cur.Size && sz != 0 {
			return syscall.EPERM // a peer's region keeps its size
		}
	}
	return f.Getattr(ctx, fh, out)
}

func (f *remoteFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_APPEND != 0 {
		return nil, 0, syscall.EINVAL // a fixed size: nothing can be appended
	}
	c, cancel := f.m.ctx(ctx)
	defer cancel()
	conn, err := f.m.b.Connect(c, f.gid)
	if err != nil {
		return nil, 0, errno(err)
	}
	h := &remoteHandle{conn: conn, writable: openedForWriting(flags), times: f.m.times.peerTimes(f.gid, f.region)}
	var err2 error
	if sc, ok := conn.(SizeConn); ok {
		var n int64
		if n, err2 = sc.FreshSize(c, f.region, peerFresh); err2 == nil {
			h.size.Store(n)
		}
	} else {
		err2 = h.refresh(c, f.region, peerFresh)
	}
	if err2 != nil {
		conn.Close()
		return nil, 0, errno(err2)
	}
	// direct_io: every read reaches the peer; no readahead of 128 KiB for
	// an 8-byte read.
	return h, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

func (f *remoteFile) Release(ctx context.Context, fh gofs.FileHandle) syscall.Errno {
	if h, ok := fh.(*remoteHandle); ok {
		h.conn.Close()
	}
	return 0
}

func (f *remoteFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := fh.(*remoteHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	if off < 0 {
		return nil, syscall.EINVAL
	}
	c := f.m.dl.get()
	if off >= h.size.Load() {
		// The end as last seen: the region may have grown since (one
		// directory READ per read at the end, so a sequential reader
		// pays it once).
		if err := h.refresh(c, f.region, 0); err != nil {
			return nil, errno(err)
		}
		if off >= h.size.Load() {
			return fuse.ReadResultData(nil), 0
		}
	}
	var res fuse.ReadResult
	var e syscall.Errno
	rerr := h.retryStale(c, f.region, func(try int) bool {
		if try > 0 && off >= h.size.Load() {
			res, e = fuse.ReadResultData(nil), 0 // the region shrank below off
			return false
		}
		n := min(int64(len(dest)), h.size.Load()-off)
		// The READ response lands in dest when dest is a FUSE ring
		// entry's registered payload buffer (io_uring); else in a block
		// of the registered I/O buffers, which go-fuse replies from;
		// without a free block, in dest, the buffer go-fuse would reply
		// from.
		if !f.m.inReply(dest[:n]) {
			if buf := f.m.io.get(int(n)); buf != nil {
				got, err := h.conn.ReadAt(c, f.region, buf, off)
				if try == 0 && staleErr(err) {
					f.m.io.Put(buf)
					return true
				}
				if err == nil && got == int(n) {
					res, e = &poolRead{p: f.m.io, b: buf}, 0
					return false
				}
				f.m.io.Put(buf)
				res, e = readResult(dest, got, int(n), err)
				return false
			}
		}
		if rs, ok := h.conn.(ReadStarter); ok && try == 0 && f.m.inReply(dest[:n]) {
			// A FUSE ring entry's buffer: post the READ and let the
			// ring's thread serve its other entries until it is done.
			sr, err := rs.ReadStart(c, f.region, dest[:n], off)
			switch {
			case err == nil:
				res, e = &startedReply{f: f, h: h, ctx: c, sr: sr, dest: dest, n: int(n), off: off}, 0
				return false
			case staleErr(err):
				return true
			case !errors.Is(err, errors.ErrUnsupported):
				res, e = nil, errno(err)
				return false
			}
		}
		got, err := h.conn.ReadAt(c, f.region, dest[:n], off)
		if try == 0 && staleErr(err) {
			return true
		}
		res, e = readResult(dest, got, int(n), err)
		return false
	})
	if rerr != nil {
		return nil, errno(rerr)
	}
	return res, e
}

// startedReply is the reply to a READ into a FUSE ring entry's buffer
// that was posted and not waited for (a fuseserve.PendingRead): the
// ring's thread serves its other entries meanwhile, and takes the bytes
// with Bytes once Ready (Bytes and Done wait for them otherwise). Only
// that thread calls its methods.
type startedReply struct {
	f    *remoteFile
	h    *remoteHandle
	ctx  context.Context
	sr   StartedRead
	dest []byte // the reply buffer; the READ fills dest[:n]
	n    int
	off  int64

	done bool
	data []byte
	st   fuse.Status
}

func (r *startedReply) Ready() bool { return r.done || r.sr.Ready() }

func (r *startedReply) Await(d time.Duration) bool { return r.done || r.sr.Await(d) }

func (r *startedReply) Size() int { return r.n }

func (r *startedReply) Bytes([]byte) ([]byte, fuse.Status) {
	r.finish()
	return r.data, r.st
}

// Done waits for the READ if Bytes did not: the NIC must be done with the
// entry's buffer before the entry serves another request.
func (r *startedReply) Done() { r.finish() }

func (r *startedReply) finish() {
	if r.done {
		return
	}
	r.done = true
	got, err := r.sr.Wait(r.ctx)
	if staleErr(err) {
		// The region changed under the handle (retryStale's rule): read
		// its directory again and read once more, waiting this time.
		if rerr := r.h.refresh(r.ctx, r.f.region, 0); rerr != nil {
			r.st = fuse.ToStatus(errno(rerr))
			return
		}
		if r.off >= r.h.size.Load() {
			r.st = fuse.OK // the region shrank below off
			return
		}
		r.n = int(min(int64(len(r.dest)), r.h.size.Load()-r.off))
		got, err = r.h.conn.ReadAt(r.ctx, r.f.region, r.dest[:r.n], r.off)
	}
	switch {
	case err != nil:
		r.st = fuse.ToStatus(errno(err))
	case got != r.n:
		r.st = fuse.EIO
	default:
		r.data, r.st = r.dest[:got], fuse.OK
	}
}

func (f *remoteFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	h, ok := fh.(*remoteHandle)
	if !ok {
		return 0, syscall.EBADF
	}
	if off < 0 {
		return 0, syscall.EINVAL
	}
	c := f.m.dl.get()
	if len(data) > 0 && off+int64(len(data)) > h.size.Load() {
		// Past the end as last seen: the region may have grown since.
		if err := h.refresh(c, f.region, 0); err != nil {
			return 0, errno(err)
		}
	}
	var written uint32
	var e syscall.Errno
	rerr := h.retryStale(c, f.region, func(try int) bool {
		clipped, ce := clipWrite(data, off, h.size.Load())
		if ce != 0 || len(clipped) == 0 {
			written, e = 0, ce
			return false
		}
		// Sent straight from the FUSE request buffer.
		n, err := h.conn.WriteAt(c, f.region, clipped, off)
		if n > 0 {
			h.times.written(time.Now())
		}
		if try == 0 && n == 0 && staleErr(err) {
			return true
		}
		written, e = writeResult(n, len(clipped), err)
		return false
	})
	if rerr != nil {
		return 0, errno(rerr)
	}
	return written, e
}

func (f *remoteFile) Ioctl(ctx context.Context, fh gofs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	h, ok := fh.(*remoteHandle)
	if !ok || !h.writable {
		// An atomic writes: like write(2), it needs a descriptor opened
		// for writing, whatever the file's mode.
		return 0, syscall.EBADF
	}
	c := f.m.dl.get()
	h.times.written(time.Now())
	// atomic runs one under the stale-region rule (retryStale): a failure
	// other than ETIMEDOUT means it did not act, so running it again after
	// a re-lookup cannot apply it twice.
	atomic := func(off int64, do func() (uint64, error)) (old uint64, err error) {
		rerr := h.retryStale(c, f.region, func(try int) bool {
			if off+8 > h.size.Load() {
				old, err = 0, syscall.EINVAL
				return false
			}
			old, err = do()
			return try == 0 && staleErr(err)
		})
		if rerr != nil {
			return 0, rerr
		}
		return old, err
	}
	return atomicIoctl(cmd, input, output,
		func(off int64, d uint64) (uint64, error) {
			return atomic(off, func() (uint64, error) { return h.conn.FetchAdd(c, f.region, off, d) })
		},
		func(off int64, cmp, swap uint64) (uint64, error) {
			return atomic(off, func() (uint64, error) { return h.conn.CompareAndSwap(c, f.region, off, cmp, swap) })
		})
}

// peerPortsDir holds peers/<gid>/ports/<port>: each write() sends one
// message to that port on the peer.
type peerPortsDir struct {
	gofs.Inode
	syncNode
	readOnlyDir
	m   *mount
	gid uint32
}

var _ = (gofs.NodeLookuper)((*peerPortsDir)(nil))
var _ = (gofs.NodeReaddirer)((*peerPortsDir)(nil))

func (d *peerPortsDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	return gofs.NewListDirStream(nil), 0
}

func (d *peerPortsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	port, ok := parseUint(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	f := &peerPortFile{m: d.m, gid: d.gid, port: port}
	if e := f.attr(ctx, &out.Attr); e != 0 {
		return nil, e
	}
	// A port number always means that port of this peer: a fresh
	// process that sends to it (a serverless function) needs no LOOKUP
	// when another did before it. The attributes (those of the peer's
	// mem) keep the mount's short timeout.
	out.SetEntryTimeout(fixedEntryTimeout)
	return d.NewInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}

type peerPortFile struct {
	gofs.Inode
	syncNode
	m    *mount
	gid  uint32
	port uint32
}

var (
	_ = (gofs.NodeOpener)((*peerPortFile)(nil))
	_ = (gofs.NodeWriter)((*peerPortFile)(nil))
	_ = (gofs.NodeReleaser)((*peerPortFile)(nil))
	_ = (gofs.NodeGetattrer)((*peerPortFile)(nil))
	_ = (gofs.NodeSetattrer)((*peerPortFile)(nil))
)

// attr describes a peer's port with the owner and the write bits of the
// peer's default region: who may write peers/<gid>/mem may send to the
// peer's ports (the same rule, checked by the kernel under
// --default-permissions), and nobody reads them from here.
func (f *peerPortFile) attr(ctx context.Context, a *fuse.Attr) syscall.Errno {
	c, cancel := f.m.ctx(ctx)
	defer cancel()
	conn, err := f.m.b.Connect(c, f.gid)
	if err != nil {
		return errno(err)
	}
	defer conn.Close()
	r, err := freshRegion(c, conn, "mem", peerFresh)
	if err != nil {
		return errno(err)
	}
	a.Mode = syscall.S_IFREG | r.Mode&0o222
	a.Uid, a.Gid = r.UID, r.GID
	return 0
}

func (f *peerPortFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return f.attr(ctx, &out.Attr)
}

// Setattr ignores a truncation (a shell redirection: meaningless and
// harmless) and refuses the rest (EPERM): the port is the peer's.
func (f *peerPortFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	_, mok := in.GetMode()
	_, uok := in.GetUID()
	_, gok := in.GetGID()
	_, sok := in.GetSize()
	_, aok := in.GetATime()
	_, tok := in.GetMTime()
	if mok || uok || gok || (aok || tok) && !sok {
		return syscall.EPERM
	}
	return f.attr(ctx, &out.Attr)
}

func (f *peerPortFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	c, cancel := f.m.ctx(ctx)
	defer cancel()
	conn, err := f.m.b.Connect(c, f.gid)
	if err != nil {
		return nil, 0, errno(err)
	}
	return &remoteHandle{conn: conn}, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

func (f *peerPortFile) Release(ctx context.Context, fh gofs.FileHandle) syscall.Errno {
	if h, ok := fh.(*remoteHandle); ok {
		h.conn.Close()
	}
	return 0
}

func (f *peerPortFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	h, ok := fh.(*remoteHandle)
	if !ok {
		return 0, syscall.EBADF
	}
	if len(data) > MaxMessage {
		return 0, syscall.EMSGSIZE
	}
	c := f.m.dl.get()
	if err := h.conn.Send(c, f.port, data); err != nil {
		return 0, errno(err)
	}
	return uint32(len(data)), 0
}

// textFile renders text at open; reads come from that snapshot. Its size
// is that of the snapshot for a stat through an open handle (fstat), and
// that of a rendering made now otherwise: a file whose text does not
// change (peers/<gid>/info) reports one size to stat, lstat and fstat,
// however long the kernel keeps a cached attribute.
type textFile struct {
	gofs.Inode
	syncNode
	m      *mount
	redact bool // JSON whose rkeys only root may see (stats.json)
	render func(w *bytes.Buffer) error
}

var (
	_ = (gofs.NodeOpener)((*textFile)(nil))
	_ = (gofs.NodeReader)((*textFile)(nil))
	_ = (gofs.NodeGetattrer)((*textFile)(nil))
)

type textHandle struct{ b []byte }

func (f *textFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	if h, ok := fh.(*textHandle); ok {
		out.Size = uint64(len(h.b))
		return 0
	}
	// A rendering that fails (the peer is gone) leaves the size 0: the
	// error belongs to open and read, not to stat.
	if b, err := f.text(ctx); err == nil {
		out.Size = uint64(len(b))
	}
	return 0
}

// text renders the file for the caller in ctx: without the rkeys of
// regions unless the caller is root (redactRKeys).
func (f *textFile) text(ctx context.Context) ([]byte, error) {
	var b bytes.Buffer
	if err := f.render(&b); err != nil {
		return nil, err
	}
	if f.redact {
		if caller, ok := fuse.FromContext(ctx); ok && caller != nil && caller.Uid != 0 {
			return redactRKeys(b.Bytes())
		}
	}
	return b.Bytes(), nil
}

func (f *textFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	b, err := f.text(ctx)
	if err != nil {
		return nil, 0, errno(err)
	}
	return &textHandle{b: b}, fuse.FOPEN_DIRECT_IO, 0
}

func (f *textFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h := fh.(*textHandle)
	if off >= int64(len(h.b)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(h.b[off:min(int64(len(h.b)), off+int64(len(dest)))]), 0
}
