package fs

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// regionsDir is regions/: the regions this node exports. Creating a file
// makes an empty region (listed at once), truncating it or writing past
// its end sets the size, removing it unexports it.
type regionsDir struct {
	gofs.Inode
	syncNode
	m *mount
}

var (
	_ = (gofs.NodeReaddirer)((*regionsDir)(nil))
	_ = (gofs.NodeLookuper)((*regionsDir)(nil))
	_ = (gofs.NodeCreater)((*regionsDir)(nil))
	_ = (gofs.NodeUnlinker)((*regionsDir)(nil))
)

func (d *regionsDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	rs := d.m.b.Regions()
	sort.Slice(rs, func(i, j int) bool { return rs[i].Name < rs[j].Name })
	ents := make([]fuse.DirEntry, len(rs))
	for i, r := range rs {
		ents[i] = fuse.DirEntry{Name: r.Name, Mode: syscall.S_IFREG}
	}
	return gofs.NewListDirStream(ents), 0
}

func (d *regionsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	r, err := d.m.b.LocalRegion(name)
	if err != nil {
		return nil, errno(err)
	}
	fillLocal(&out.Attr, r.Info())
	d.m.times.localTimes(name).fill(&out.Attr)
	return d.NewInode(ctx, &localRegionFile{m: d.m, name: name}, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}

func (d *regionsDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	caller, _ := fuse.FromContext(ctx)
	uid, gid := uint32(0), uint32(0)
	if caller != nil {
		uid, gid = caller.Uid, caller.Gid
	}
	if _, err := d.m.b.LocalRegion(name); err == nil {
		return nil, nil, 0, syscall.EEXIST
	}
	r, err := d.m.b.Export(name, 0, mode&0o7777, uid, gid)
	if err != nil {
		d.m.logf("regions/%s: create: %v", name, err)
		return nil, nil, 0, errno(err)
	}
	t := d.m.times.localTimes(name)
	t.written(time.Now())
	fillLocal(&out.Attr, r)
	t.fill(&out.Attr)
	n := d.NewInode(ctx, &localRegionFile{m: d.m, name: name}, gofs.StableAttr{Mode: syscall.S_IFREG})
	return n, &localHandle{writable: openedForWriting(flags), created: true}, fuse.FOPEN_DIRECT_IO, 0
}

func (d *regionsDir) Unlink(ctx context.Context, name string) syscall.Errno {
	if err := d.m.b.Unexport(name); err != nil {
		return errno(err)
	}
	d.m.times.dropLocal(name)
	return 0
}

func fillLocal(a *fuse.Attr, r Region) {
	a.Size = uint64(r.Size)
	a.Mode = syscall.S_IFREG | r.Mode&0o7777
	a.Uid, a.Gid = r.UID, r.GID
}

// localRegionFile is regions/<name>: the region in this node's memory.
type localRegionFile struct {
	gofs.Inode
	syncNode
	m    *mount
	name string
}

var (
	_ = (gofs.NodeOpener)((*localRegionFile)(nil))
	_ = (gofs.NodeGetattrer)((*localRegionFile)(nil))
	_ = (gofs.NodeSetattrer)((*localRegionFile)(nil))
	_ = (gofs.NodeReader)((*localRegionFile)(nil))
	_ = (gofs.NodeWriter)((*localRegionFile)(nil))
	_ = (gofs.NodeIoctler)((*localRegionFile)(nil))
)

func (f *localRegionFile) region() (LocalRegion, syscall.Errno) {
	r, err := f.m.b.LocalRegion(f.name)
	if err != nil {
		return nil, errno(err)
	}
	return r, 0
}

func (f *localRegionFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	r, e := f.region()
	if e != 0 {
		return e
	}
	fillLocal(&out.Attr, r.Info())
	f.m.times.localTimes(f.name).fill(&out.Attr)
	return 0
}

func (f *localRegionFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	r, e := f.region()
	if e != 0 {
		return e
	}
	info := r.Info()
	caller, _ := fuse.FromContext(ctx)
	owner := caller == nil || caller.Uid == 0 || caller.Uid == info.UID
	if mode, ok := in.GetMode(); ok {
		if !owner {
			return syscall.EPERM
		}
		if err := r.Chmod(mode & 0o7777); err != nil {
			return errno(err)
		}
		f.m.times.localTimes(f.name).changed(time.Now())
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		if caller != nil && caller.Uid != 0 {
			return syscall.EPERM // only root gives a region away
		}
		if !uok {
			uid = info.UID
		}
		if !gok {
			gid = info.GID
		}
		if err := r.Chown(uid, gid); err != nil {
			return errno(err)
		}
		f.m.times.localTimes(f.name).changed(time.Now())
	}
	if sz, ok := in.GetSize(); ok && int64(sz) != info.Size {
		if f.name == "mem" {
			// The default region's size is the daemon's --mem-size. A
			// truncation to zero (a shell's > redirection) is ignored, as
			// on peer files; other sizes are refused.
			if sz == 0 {
				return f.Getattr(ctx, fh, out)
			}
			return syscall.EPERM
		}
		if e := f.resize(fh, info, int64(sz), "resize"); e != 0 {
			return e
		}
	}
	// utimensat (touch, rsync -t); the kernel checked who may.
	f.m.times.localTimes(f.name).set(in, time.Now())
	return f.Getattr(ctx, fh, out)
}

// localHandle is an open regions/<name>: whether it was opened for
// writing (atomics need that) and whether its open created the region.
type localHandle struct {
	writable bool
	created  bool // by this descriptor's open (O_CREAT of a new name)
}

// resize sets the region's size (truncate, a write or fallocate past the
// end: why), up to Options.MaxRegionSize (EFBIG beyond it). A refused
// resize of a region that this descriptor created and that is still empty
// removes the region again (truncate -s 30G regions/new that the node
// cannot hold leaves nothing behind); any other refused resize keeps the
// region as it was (the backend's promise).
func (f *localRegionFile) resize(fh gofs.FileHandle, info Region, size int64, why string) syscall.Errno {
	err := error(syscall.EFBIG)
	if size <= f.m.o.MaxRegionSize {
		_, err = f.m.b.Export(f.name, size, info.Mode, info.UID, info.GID)
		if err == nil {
			f.m.times.localTimes(f.name).written(time.Now())
			return 0
		}
	}
	f.m.logf("regions/%s: %s to %d bytes: %v", f.name, why, size, err)
	if h, ok := fh.(*localHandle); ok && h.created && info.Size == 0 {
		f.m.times.dropLocal(f.name)
		if uerr := f.m.b.Unexport(f.name); uerr != nil {
			f.m.logf("regions/%s: removing the region this refused %s created: %v", f.name, why, uerr)
		} else if _, dir := f.Parent(); dir != nil {
			f.m.forget(dir, f.name)
		}
	}
	return errno(err)
}

func (f *localRegionFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if _, e := f.region(); e != 0 {
		return nil, 0, e
	}
	if flags&syscall.O_APPEND != 0 && f.name == "mem" {
		return nil, 0, syscall.EINVAL // a fixed size: nothing can be appended
	}
	return &localHandle{writable: openedForWriting(flags)}, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

func (f *localRegionFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	r, e := f.region()
	if e != 0 {
		return nil, e
	}
	size := r.Info().Size
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if off >= size {
		return fuse.ReadResultData(nil), 0
	}
	want := int(min(int64(len(dest)), size-off))
	n, err := r.ReadAt(dest[:want], off)
	return readResult(dest, n, want, err)
}

// Write writes at off; a write past the end first grows the region (a
// resize: peers see the new size and a new rkey), up to
// Options.MaxRegionSize: a write across that limit writes the bytes below
// it, a write at or past it fails with EFBIG. The default region mem keeps
// its size (--mem-size): writes past its end are clipped as on peer files.
func (f *localRegionFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	r, e := f.region()
	if e != 0 {
		return 0, e
	}
	if off < 0 {
		return 0, syscall.EINVAL
	}
	info := r.Info()
	size := info.Size
	if end := off + int64(len(data)); end > size && f.name != "mem" && len(data) > 0 {
		if off >= f.m.o.MaxRegionSize {
			return 0, syscall.EFBIG
		}
		if e := f.resize(fh, info, min(end, f.m.o.MaxRegionSize), "grow"); e != 0 {
			return 0, e
		}
		if r, e = f.region(); e != 0 {
			return 0, e
		}
		size = r.Info().Size
	}
	data, e = clipWrite(data, off, size)
	if e != 0 || len(data) == 0 {
		return 0, e
	}
	n, err := r.WriteAt(data, off)
	if n > 0 {
		f.m.times.localTimes(f.name).written(time.Now())
	}
	return writeResult(n, len(data), err)
}

func (f *localRegionFile) Ioctl(ctx context.Context, fh gofs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	if h, ok := fh.(*localHandle); !ok || !h.writable {
		return 0, syscall.EBADF // as on peer files: atomics write
	}
	r, e := f.region()
	if e != 0 {
		return 0, e
	}
	size := r.Info().Size
	f.m.times.localTimes(f.name).written(time.Now())
	return atomicIoctl(cmd, input, output,
		func(off int64, d uint64) (uint64, error) {
			if off+8 > size {
				return 0, syscall.EINVAL
			}
			return r.FetchAdd(off, d)
		},
		func(off int64, cmp, swap uint64) (uint64, error) {
			if off+8 > size {
				return 0, syscall.EINVAL
			}
			return r.CompareAndSwap(off, cmp, swap)
		})
}

// portsDir is ports/: this node's receive ports. Creating ports/<port>
// binds it; each read() of it returns exactly one message; removing it
// unbinds.
type portsDir struct {
	gofs.Inode
	syncNode
	m *mount
}

var (
	_ = (gofs.NodeReaddirer)((*portsDir)(nil))
	_ = (gofs.NodeLookuper)((*portsDir)(nil))
	_ = (gofs.NodeCreater)((*portsDir)(nil))
	_ = (gofs.NodeMknoder)((*portsDir)(nil))
	_ = (gofs.NodeUnlinker)((*portsDir)(nil))
)

func (d *portsDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	ps := d.m.b.Ports()
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	ents := make([]fuse.DirEntry, len(ps))
	for i, p := range ps {
		ents[i] = fuse.DirEntry{Name: fmtUint(p), Mode: syscall.S_IFREG}
	}
	return gofs.NewListDirStream(ents), 0
}

// boundPort is a port bound through ports/: the backend's port and the
// file's owner, mode and times. The binder owns it, 0600: only the binder
// (and root) reads its messages until chmod or chown says otherwise (the
// kernel checks, under --default-permissions).
type boundPort struct {
	Port
	times    fileTimes
	openRead atomic.Int64 // bytes read through descriptors still open
	pollers  pollers      // the kernel's pollers waiting for a message
	gone     atomic.Bool  // unbound

	mu       sync.Mutex // guards mode, uid, gid
	mode     uint32
	uid, gid uint32
}

func (p *boundPort) fill(a *fuse.Attr) {
	p.mu.Lock()
	a.Mode = syscall.S_IFREG | p.mode
	a.Uid, a.Gid = p.uid, p.gid
	p.mu.Unlock()
	p.times.fill(a)
	a.Size = uint64(p.size())
}

// size is the port's st_size: the bytes queued plus the bytes read
// through descriptors still open. It grows by each message that arrives
// and stays put when a message is read, so a tool that follows a file by
// its size (tail -f, which on a FUSE mount polls fstat) reads exactly
// the messages that arrived, and never sees the file shrink below what
// it read itself. Without a StreamPort backend it is 0.
func (p *boundPort) size() int64 {
	sp, ok := p.Port.(StreamPort)
	if !ok {
		return 0
	}
	return p.openRead.Load() + sp.QueuedBytes()
}

// uncachedAttr is the attribute timeout a port's attributes are given:
// the kernel must ask again for every stat, since the size moves with
// each message. go-fuse replaces a zero timeout by the mount's default,
// so a port asks for this one nanosecond and attrFiller makes it zero.
const uncachedAttr = time.Nanosecond

func (d *portsDir) port(name string) (*boundPort, uint32, syscall.Errno) {
	p, ok := parseUint(name)
	if !ok {
		return nil, 0, syscall.ENOENT
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if port := d.m.ports[p]; port != nil {
		return port, p, 0
	}
	return nil, p, syscall.ENOENT
}

func (d *portsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	port, p, e := d.port(name)
	if e != 0 {
		return nil, e
	}
	port.fill(&out.Attr)
	out.SetAttrTimeout(uncachedAttr)
	return d.NewInode(ctx, &localPortFile{m: d.m, num: p, port: port}, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}

func (d *portsDir) bind(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	p, ok := parseUint(name)
	if !ok {
		return nil, syscall.EINVAL
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if d.m.ports[p] != nil {
		return nil, syscall.EEXIST
	}
	port, err := d.m.b.Bind(p)
	if err != nil {
		return nil, errno(err)
	}
	bp := &boundPort{Port: port, mode: 0o600}
	if sp, ok := port.(StreamPort); ok && d.m.polls != nil {
		n := d.m.polls.n
		sp.OnQueue(func() { bp.pollers.wake(n) })
	}
	if caller, ok := fuse.FromContext(ctx); ok && caller != nil {
		bp.uid, bp.gid = caller.Uid, caller.Gid
	}
	bp.times.written(time.Now())
	d.m.ports[p] = bp
	bp.fill(&out.Attr)
	out.SetAttrTimeout(uncachedAttr)
	return d.NewInode(ctx, &localPortFile{m: d.m, num: p, port: bp}, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}

func (d *portsDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	n, e := d.bind(ctx, name, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	lp := n.Operations().(*localPortFile)
	h := &portHandle{port: lp.port, nonblock: flags&syscall.O_NONBLOCK != 0}
	return n, h, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH | fuse.FOPEN_NONSEEKABLE | d.m.polls.open(h), 0
}

func (d *portsDir) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return d.bind(ctx, name, out)
}

func (d *portsDir) Unlink(ctx context.Context, name string) syscall.Errno {
	p, ok := parseUint(name)
	if !ok {
		return syscall.ENOENT
	}
	d.m.mu.Lock()
	port := d.m.ports[p]
	delete(d.m.ports, p)
	d.m.mu.Unlock()
	if port == nil {
		return syscall.ENOENT
	}
	err := port.Close()
	port.gone.Store(true)
	if d.m.polls != nil {
		port.pollers.wake(d.m.polls.n)
	}
	return errno(err)
}

// localPortFile is ports/<port>.
type localPortFile struct {
	gofs.Inode
	syncNode
	m    *mount
	num  uint32
	port *boundPort
}

var (
	_ = (gofs.NodeOpener)((*localPortFile)(nil))
	_ = (gofs.NodeReader)((*localPortFile)(nil))
	_ = (gofs.NodeGetattrer)((*localPortFile)(nil))
	_ = (gofs.NodeSetattrer)((*localPortFile)(nil))
)

// Setattr: chmod (the owner or root) and chown (root) as on regions;
// utimensat sets the times; a truncation (a shell redirection) is ignored.
func (f *localPortFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	p := f.port
	caller, _ := fuse.FromContext(ctx)
	root := caller == nil || caller.Uid == 0
	p.mu.Lock()
	owner := root || caller.Uid == p.uid
	mode, mok := in.GetMode()
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	switch {
	case mok && !owner, (uok || gok) && !root:
		p.mu.Unlock()
		return syscall.EPERM
	}
	if mok {
		p.mode = mode & 0o7777
	}
	if uok {
		p.uid = uid
	}
	if gok {
		p.gid = gid
	}
	p.mu.Unlock()
	if mok || uok || gok {
		p.times.changed(time.Now())
	}
	p.times.set(in, time.Now())
	return f.Getattr(ctx, fh, out)
}

func (f *localPortFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.port.fill(&out.Attr)
	out.SetTimeout(uncachedAttr)
	return 0
}

// portHandle is an open ports/<port>: whether it was opened O_NONBLOCK,
// whether its last read returned a message, and the bytes read through
// it (counted in the port's size while it is open).
type portHandle struct {
	port     *boundPort
	nonblock bool

	mu   sync.Mutex
	more bool // the last read returned a message
	read int64
}

var _ = (gofs.FileReleaser)((*portHandle)(nil))

// Release takes the handle's bytes out of the port's size.
func (h *portHandle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	h.port.openRead.Add(-h.read)
	h.read = 0
	h.mu.Unlock()
	return 0
}

func (f *localPortFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	// FOPEN_NONSEEKABLE: a port is a stream, offsets mean nothing.
	h := &portHandle{port: f.port, nonblock: flags&syscall.O_NONBLOCK != 0}
	return h, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH | fuse.FOPEN_NONSEEKABLE | f.m.polls.open(h), 0
}

// Read returns exactly one message (offsets are ignored: a port is a
// stream of messages). With none queued it waits for one, unless the
// descriptor's last read returned a message: then it returns 0, an end
// of file, so that a tool reading to the end (cat, tail) gets the
// messages queued and stops, and the read after that waits again. A
// signal to the reader interrupts the wait. A descriptor opened with
// O_NONBLOCK gets EAGAIN when no message is queued, never an end of file.
// Only the flag given at open counts, not a later fcntl(F_SETFL) (which
// go-fuse's node API does not pass on): Go's runtime sets O_NONBLOCK on
// every FUSE file it opens, and would spin on EAGAIN where the kernel
// reports the file always ready.
//
// A message taken for a reader that was interrupted meanwhile (its
// caller got a signal, or was killed, before the reply left) goes back
// to the head of the queue (StreamPort.Unrecv) and the read fails with
// EINTR, so a reader that gives up loses no message. Once the reply is
// written the message is the reader's, as with a pipe.
func (f *localPortFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, _ := fh.(*portHandle)
	if h == nil { // not opened through Open or Create: no state kept
		h = &portHandle{port: &boundPort{Port: f.port.Port}}
	}
	h.mu.Lock()
	more := h.more
	h.mu.Unlock()
	var n int
	var err error
	if h.nonblock || more {
		n, err = f.port.TryRecv(ctx, dest)
	} else {
		n, err = f.port.Recv(ctx, dest)
	}
	if err != nil {
		if more && !h.nonblock && errors.Is(err, syscall.EAGAIN) {
			h.mu.Lock()
			h.more = false
			h.mu.Unlock()
			return fuse.ReadResultData(nil), 0
		}
		if errors.Is(err, context.Canceled) {
			return nil, syscall.EINTR
		}
		return nil, errno(err)
	}
	if ctx.Err() != nil {
		if sp, ok := f.port.Port.(StreamPort); ok {
			sp.Unrecv(dest[:n])
			return nil, syscall.EINTR
		}
	}
	h.mu.Lock()
	h.more = true
	h.read += int64(n)
	f.port.openRead.Add(int64(n))
	h.mu.Unlock()
	return fuse.ReadResultData(dest[:n]), 0
}
