package fs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/krfs/krfs/fs/fuseserve"
)

// Options tune a mount.
type Options struct {
	// AllowOther lets users other than the mounting one use the mount.
	AllowOther bool
	// DefaultPermissions makes the kernel check permissions from the
	// files' mode and owner.
	DefaultPermissions bool
	// Timeout bounds every remote operation (default 2 s; reads, writes,
	// atomics and port writes: up to 100 ms more, see deadlines).
	Timeout time.Duration
	// Debug logs every FUSE request.
	Debug bool
	// Name is the fuse.<Name> filesystem type shown in the mount table.
	Name string
	// MaxRegionSize bounds a local region: a truncate or a write past it
	// fails with EFBIG (default DefaultMaxRegionSize). The backend may
	// refuse smaller sizes too (node.Config.MaxRegionSize).
	MaxRegionSize int64
	// MountOptions are generic mount options for the kernel: nosuid,
	// nodev, noexec, suid, dev, exec (nosuid and nodev are the default).
	MountOptions []string
	// IOBufferBytes is the size of the pool of I/O buffers that remote
	// reads land in when the backend is a BufferRegistrar (see IOBuffers):
	// default DefaultIOBufferBytes, rounded down to a multiple of MaxIO; a
	// negative size turns the pool off (reads land in go-fuse's buffers).
	IOBufferBytes int
	// Logf, if set, receives a line for each refused request an operator
	// should see (a region its memory cannot hold).
	Logf func(format string, args ...any)
	// Transport picks how FUSE requests reach the tree (see Transports):
	// TransportAuto (the default when empty), TransportURing or
	// TransportDev.
	Transport string
	// RingBytes bounds the io_uring entries' payload buffers (0:
	// fuseserve.DefaultRingBytes; see fuseserve.Options.RingBytes).
	RingBytes int
	// RingEntriesPerThread is how many of a CPU's ring entries one thread
	// serves (0 or 1: one; see fuseserve.Options.EntriesPerThread).
	RingEntriesPerThread int
	// Poll makes krfs's own server (TransportURing, and TransportAuto
	// when the kernel offers io_uring) answer FUSE_POLL, so that poll,
	// select and epoll wait for a port's messages (go-fuse's server,
	// TransportDev, cannot). Leave it off in
	// a process that opens files of its own mount: see fuseserve.Poller.
	Poll bool
}

// The FUSE transports (Options.Transport):
//   - TransportURing: krfs's own server (package fuseserve) mounts
//     /dev/fuse and serves requests over FUSE over io_uring, one ring per
//     CPU; the mount fails when the kernel does not offer it.
//   - TransportAuto (the default): TransportURing when the kernel offers
//     it, else TransportDev, saying why once in the log.
//   - TransportDev: go-fuse's server, reading /dev/fuse.
const (
	TransportAuto  = "auto"
	TransportURing = "uring"
	TransportDev   = "dev"
)

// Transports lists the valid Options.Transport values.
var Transports = []string{TransportAuto, TransportURing, TransportDev}

// Server is a mounted tree being served.
type Server struct {
	dev  *fuse.Server
	ring *fuseserve.Server
	why  string // why dev, when auto chose it
}

// Unmount unmounts the tree and waits until every request is answered.
func (s *Server) Unmount() error {
	if s.ring != nil {
		return s.ring.Unmount()
	}
	return s.dev.Unmount()
}

// Wait returns once the tree is unmounted and every request answered.
func (s *Server) Wait() {
	if s.ring != nil {
		s.ring.Wait()
		return
	}
	s.dev.Wait()
}

// FuseStats says how the mount is served (stats.json's "fuse").
type FuseStats = fuseserve.Stats

// Stats returns the transport's counters.
func (s *Server) Stats() FuseStats {
	if s.ring != nil {
		return s.ring.Stats()
	}
	return FuseStats{Transport: "dev", Why: s.why}
}

// whyNotURing logs, once per process, why auto did not use io_uring.
var whyNotURing sync.Once

// DefaultMaxRegionSize is Options.MaxRegionSize when left zero: 1 TiB.
const DefaultMaxRegionSize = 1 << 40

// MaxIO is the largest read or write one FUSE request carries (the
// kernel's limit is 256 pages).
const MaxIO = 1 << 20

// MaxMessage is the largest message a port file carries: one write() is
// one message and one read() returns one message only while each fits a
// single FUSE request, and the kernel splits a request at 256 pages of the
// caller's (possibly unaligned) buffer.
const MaxMessage = MaxIO - 4096

// Mount mounts the tree of b at dir and returns the running server; call
// its Unmount to stop it.
func Mount(dir string, b Backend, o Options) (*Server, error) {
	mode := fuseserve.Auto
	switch o.Transport {
	case TransportDev:
		mode = fuseserve.Dev
	case "", TransportAuto:
	case TransportURing:
		mode = fuseserve.Uring
	default:
		return nil, fmt.Errorf("FUSE transport %q: want one of %s", o.Transport, strings.Join(Transports, ", "))
	}
	why := ""
	if mode == fuseserve.Auto {
		if ok, reason := fuseserve.KernelOffersURing(); !ok {
			mode, why = fuseserve.Dev, reason
			whyNotURing.Do(func() {
				if o.Logf != nil {
					o.Logf("FUSE served over /dev/fuse, not io_uring: %s", reason)
				}
			})
		}
	} else if mode == fuseserve.Uring {
		if ok, reason := fuseserve.KernelOffersURing(); !ok {
			return nil, fmt.Errorf("--fuse-transport uring: %s", reason)
		}
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Name == "" {
		o.Name = "krfs"
	}
	if o.MaxRegionSize <= 0 {
		o.MaxRegionSize = DefaultMaxRegionSize
	}
	root := newRoot(b, o)
	if reg, ok := b.(BufferRegistrar); ok && o.IOBufferBytes >= 0 {
		size := o.IOBufferBytes
		if size == 0 {
			size = DefaultIOBufferBytes
		}
		p := NewIOBuffers(size)
		if err := reg.RegisterIOBuffers(p); err != nil {
			return nil, fmt.Errorf("registering %d bytes of I/O buffers: %w", size, err)
		}
		root.m.io = p
	}
	short := time.Second
	opts := &gofs.Options{
		EntryTimeout:    &short,
		AttrTimeout:     &short,
		NegativeTimeout: &short,
		MountOptions: fuse.MountOptions{
			AllowOther:        o.AllowOther,
			FsName:            "krfs",
			Name:              o.Name,
			MaxWrite:          MaxIO,
			DirectMountStrict: true,
			Debug:             o.Debug,
			DisableXAttrs:     true,
			// A 1 MiB request does not fit a pipe: splice would fail and
			// fall back on every large request, logging each time.
			DisableSplice: true,
		},
	}
	if o.DefaultPermissions {
		opts.MountOptions.Options = append(opts.MountOptions.Options, "default_permissions")
	}
	opts.MountOptions.Options = append(opts.MountOptions.Options, o.MountOptions...)
	// Attributes go through attrFiller; READDIRPLUS would hand the kernel
	// attributes past it, so ls -l looks each entry up instead.
	opts.MountOptions.DisableReadDirPlus = true
	if mode != fuseserve.Dev {
		// krfs's own transport: the tree's notifications go to the kernel
		// through the notifier (go-fuse's bridge uses ServerCallbacks
		// when Init, which takes go-fuse's *fuse.Server, is not called).
		notifier := fuseserve.NewNotifier()
		opts.ServerCallbacks = notifier
		var raw fuse.RawFileSystem = &attrFiller{RawFileSystem: uncachedAttrs{gofs.NewNodeFS(root, opts)}, mounted: time.Now(), unmounted: root.m.unmounted}
		if o.Poll {
			root.m.polls = newPortPolls(notifier)
			raw = pollingFS{RawFileSystem: raw, p: root.m.polls}
		}
		fo := fuseserve.Options{
			Name: o.Name, FsName: "krfs", AllowOther: o.AllowOther, DefaultPermissions: o.DefaultPermissions,
			MountOptions: o.MountOptions, MaxWrite: MaxIO, Mode: mode, RingBytes: o.RingBytes, EntriesPerThread: o.RingEntriesPerThread,
			Notifier: notifier, Logf: o.Logf,
		}
		if _, ok := b.(MemoryRegistrar); ok {
			fo.ReplyMemory = root.m.registerReply
		}
		srv, err := fuseserve.Mount(dir, raw, fo)
		if err != nil {
			root.m.unmounted()
			return nil, err
		}
		if st := srv.Stats(); st.Transport != "io_uring" && o.Logf != nil {
			o.Logf("FUSE served over /dev/fuse, not io_uring: %s", st.Why)
		}
		return &Server{ring: srv}, nil
	}
	raw := &attrFiller{RawFileSystem: uncachedAttrs{gofs.NewNodeFS(root, opts)}, mounted: time.Now(), unmounted: root.m.unmounted}
	srv, err := fuse.NewServer(raw, dir, &opts.MountOptions)
	if err != nil {
		root.m.unmounted()
		return nil, err
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		return nil, err
	}
	return &Server{dev: srv, why: why}, nil
}

// attrFiller completes the attributes every node returns with what a
// file's attributes must say and krfs does not track: a link count (1 for
// a file, 2 for a directory) and, when a node sets no times, the mount
// time for mtime, ctime and atime (not 1970).
type attrFiller struct {
	fuse.RawFileSystem
	mounted   time.Time
	unmounted func() // after the server stopped: no request is in flight
}

func (a *attrFiller) OnUnmount() {
	a.RawFileSystem.OnUnmount()
	a.unmounted()
}

func (a *attrFiller) fill(at *fuse.Attr) {
	if at.Nlink == 0 {
		at.Nlink = 1
		if at.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			at.Nlink = 2
		}
	}
	if at.Mtime == 0 && at.Ctime == 0 {
		sec, nsec := uint64(a.mounted.Unix()), uint32(a.mounted.Nanosecond())
		at.Mtime, at.Mtimensec, at.Ctime, at.Ctimensec = sec, nsec, sec, nsec
		if at.Atime == 0 {
			at.Atime, at.Atimensec = sec, nsec
		}
	}
}

func (a *attrFiller) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := a.RawFileSystem.Lookup(cancel, h, name, out)
	a.fill(&out.Attr)
	return st
}

func (a *attrFiller) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := a.RawFileSystem.GetAttr(cancel, in, out)
	a.fill(&out.Attr)
	return st
}

func (a *attrFiller) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := a.RawFileSystem.SetAttr(cancel, in, out)
	a.fill(&out.Attr)
	return st
}

func (a *attrFiller) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	st := a.RawFileSystem.Create(cancel, in, name, out)
	a.fill(&out.Attr)
	return st
}

func (a *attrFiller) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	st := a.RawFileSystem.Mknod(cancel, in, name, out)
	a.fill(&out.Attr)
	return st
}

func (a *attrFiller) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	st := a.RawFileSystem.Mkdir(cancel, in, name, out)
	a.fill(&out.Attr)
	return st
}

// errno maps a backend error to the errno a file operation returns.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	var ee interface{ Errno() syscall.Errno }
	if errors.As(err, &ee) {
		return ee.Errno()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT
	case errors.Is(err, os.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, os.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	}
	return syscall.EIO
}

// Atomic ioctls on region files (peers/<gid>/mem, peers/<gid>/mr/<name>,
// regions/<name>). Both take and return an AtomicArg; they are restricted
// ioctls (the size is encoded in the command), so FUSE carries them.
var (
	IoctlFetchAdd       = iowr('k', 1, AtomicArgSize)
	IoctlCompareAndSwap = iowr('k', 2, AtomicArgSize)
)

// AtomicArg is the argument of the atomic ioctls, in host byte order:
//
//	offset  u64  8-byte aligned offset in the region
//	a       u64  FETCH_ADD: the addend; CMP_SWAP: the compare value
//	b       u64  CMP_SWAP: the swap value
//	old     u64  out: the word's value before the operation
type AtomicArg struct {
	Offset, A, B, Old uint64
}

// AtomicArgSize is the encoded size of AtomicArg.
const AtomicArgSize = 32

// Encode writes a into b (AtomicArgSize bytes).
func (a *AtomicArg) Encode(b []byte) {
	e := binary.NativeEndian
	e.PutUint64(b[0:], a.Offset)
	e.PutUint64(b[8:], a.A)
	e.PutUint64(b[16:], a.B)
	e.PutUint64(b[24:], a.Old)
}

// Decode reads a from b.
func (a *AtomicArg) Decode(b []byte) error {
	if len(b) < AtomicArgSize {
		return syscall.EINVAL
	}
	e := binary.NativeEndian
	a.Offset, a.A, a.B, a.Old = e.Uint64(b[0:]), e.Uint64(b[8:]), e.Uint64(b[16:]), e.Uint64(b[24:])
	return nil
}

func iowr(typ byte, nr uint32, size uint32) uint32 {
	const read, write = 2, 1
	return (read|write)<<30 | size<<16 | uint32(typ)<<8 | nr
}

// atomicIoctl decodes an atomic ioctl and runs it with fa or cas.
func atomicIoctl(cmd uint32, input, output []byte,
	fa func(off int64, delta uint64) (uint64, error),
	cas func(off int64, cmp, swap uint64) (uint64, error)) (int32, syscall.Errno) {
	var arg AtomicArg
	if cmd != IoctlFetchAdd && cmd != IoctlCompareAndSwap {
		return 0, syscall.ENOTTY
	}
	if err := arg.Decode(input); err != nil || len(output) < AtomicArgSize {
		return 0, syscall.EINVAL
	}
	if arg.Offset%8 != 0 || arg.Offset > 1<<62 {
		return 0, syscall.EINVAL
	}
	var err error
	if cmd == IoctlFetchAdd {
		arg.Old, err = fa(int64(arg.Offset), arg.A)
	} else {
		arg.Old, err = cas(int64(arg.Offset), arg.A, arg.B)
	}
	if err != nil {
		return 0, errno(err)
	}
	arg.Encode(output)
	return 0, 0
}

// openedForWriting reports whether open flags allow writing.
func openedForWriting(flags uint32) bool {
	return flags&syscall.O_ACCMODE != syscall.O_RDONLY
}

// clipWrite bounds a write at off to a region of size bytes: a write that
// starts inside and runs past the end writes (and reports) the bytes in
// range, so that the caller's next write, at the end, gets EFBIG; a write
// that starts at or past the end fails with EFBIG at once.
func clipWrite(data []byte, off, size int64) ([]byte, syscall.Errno) {
	switch {
	case off < 0:
		return nil, syscall.EINVAL
	case len(data) == 0:
		return data, 0
	case off >= size:
		return nil, syscall.EFBIG
	case int64(len(data)) > size-off:
		return data[:size-off], 0
	}
	return data, 0
}

// writeResult is the reply to a write of want bytes of which the backend
// reports n written: the count of the prefix that landed, or the error
// when nothing did. A count is never more than was asked.
func writeResult(n, want int, err error) (uint32, syscall.Errno) {
	if n > 0 && n <= want {
		return uint32(n), 0 // exactly the prefix that landed
	}
	if err != nil {
		return 0, errno(err)
	}
	if n != want {
		return 0, syscall.EIO // a count the backend cannot have meant
	}
	return uint32(n), 0
}

// readResult is the reply to a read of want bytes into dest: all of them,
// or an error. A failed read returns nothing (a read has no effect to
// report, and a short count would look like the end of the region); so
// does a backend that reports fewer bytes than asked without an error.
func readResult(dest []byte, n, want int, err error) (fuse.ReadResult, syscall.Errno) {
	if err != nil {
		return nil, errno(err)
	}
	if n != want {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// parseUint parses a decimal name (a gid or a port).
func parseUint(name string) (uint32, bool) {
	v, err := strconv.ParseUint(name, 10, 32)
	if err != nil || v == 0 || strconv.FormatUint(v, 10) != name {
		return 0, false
	}
	return uint32(v), true
}

func fmtUint(v uint32) string { return fmt.Sprint(v) }
