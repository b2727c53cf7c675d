package fuseserve

import (
	"bytes"
	"reflect"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// FUSE opcodes (include/uapi/linux/fuse.h) that the dispatcher serves.
const (
	opLookup        = 1
	opForget        = 2
	opGetattr       = 3
	opSetattr       = 4
	opReadlink      = 5
	opSymlink       = 6
	opMknod         = 8
	opMkdir         = 9
	opUnlink        = 10
	opRmdir         = 11
	opRename        = 12
	opLink          = 13
	opOpen          = 14
	opRead          = 15
	opWrite         = 16
	opStatfs        = 17
	opRelease       = 18
	opFsync         = 20
	opFlush         = 25
	opInit          = 26
	opOpendir       = 27
	opReaddir       = 28
	opReleasedir    = 29
	opFsyncdir      = 30
	opAccess        = 34
	opCreate        = 35
	opInterrupt     = 36
	opDestroy       = 38
	opIoctl         = 39
	opPoll          = 40
	opBatchForget   = 42
	opFallocate     = 43
	opReaddirplus   = 44
	opRename2       = 45
	opLseek         = 46
	opCopyFileRange = 47
	opCount         = 64
)

// inHeaderSize is sizeof(struct fuse_in_header); outHeaderSize that of
// struct fuse_out_header.
const (
	inHeaderSize  = int(unsafe.Sizeof(fuse.InHeader{}))
	outHeaderSize = 16
	// argArea is how many bytes of first argument a request may carry:
	// the ring's op_in area, and more than any struct the dispatcher reads.
	argArea = 128
	// scratchSize is the size of a request's decoded header and first
	// argument (see request.in).
	scratchSize = inHeaderSize + argArea
)

// argSize[op] is the size of op's first argument (its fixed-size
// struct) on /dev/fuse, where the arguments arrive back to back; on the
// ring the first argument has its own area, so the split is the kernel's.
var argSize [opCount]int

func init() {
	in := func(v any) int { return int(sizeOfValue(v)) - inHeaderSize }
	for op, v := range map[int]any{
		opForget: fuse.ForgetIn{}, opGetattr: fuse.GetAttrIn{}, opSetattr: fuse.SetAttrIn{},
		opMknod: fuse.MknodIn{}, opMkdir: fuse.MkdirIn{}, opRename2: fuse.RenameIn{}, opLink: fuse.LinkIn{},
		opOpen: fuse.OpenIn{}, opRead: fuse.ReadIn{}, opWrite: fuse.WriteIn{}, opRelease: fuse.ReleaseIn{},
		opFsync: fuse.FsyncIn{}, opFlush: fuse.FlushIn{}, opInit: fuse.InitIn{}, opOpendir: fuse.OpenIn{},
		opReaddir: fuse.ReadIn{}, opReleasedir: fuse.ReleaseIn{}, opFsyncdir: fuse.FsyncIn{},
		opAccess: fuse.AccessIn{}, opCreate: fuse.CreateIn{}, opInterrupt: fuse.InterruptIn{},
		opIoctl: fuse.IoctlIn{}, opBatchForget: batchForgetIn{}, opFallocate: fuse.FallocateIn{},
		opReaddirplus: fuse.ReadIn{}, opLseek: fuse.LseekIn{}, opCopyFileRange: fuse.CopyFileRangeIn{},
		opPoll: pollIn{},
	} {
		argSize[op] = in(v)
	}
	argSize[opRename] = 8 // struct fuse_rename_in: newdir only
}

func sizeOfValue(v any) uintptr { return reflect.TypeOf(v).Size() }

// batchForgetIn is struct fuse_batch_forget_in after its header; forgetOne
// is one struct fuse_forget_one of its payload.
type batchForgetIn struct {
	fuse.InHeader
	Count, Dummy uint32
}

type forgetOne struct{ NodeID, Nlookup uint64 }

// request is one decoded FUSE request.
type request struct {
	// in holds the fuse_in_header followed by the first argument, zero
	// past it: scratchSize bytes, 8-byte aligned, so that every *In
	// struct can be read from it.
	in *[scratchSize / 8]uint64
	// payload holds the request's other arguments (names, write data).
	payload []byte
	// out receives the reply's body (its out arguments back to back);
	// on the ring it is the entry's payload buffer, so it may alias
	// payload.
	out    []byte
	cancel <-chan struct{}
	// mayDefer lets a READ whose result is a PendingRead return before
	// its data is there: dispatch leaves it in pending (a ring thread
	// with more entries serves them meanwhile).
	mayDefer bool
	pending  fuse.ReadResult
}

func (r *request) header() *fuse.InHeader { return (*fuse.InHeader)(unsafe.Pointer(r.in)) }
func (r *request) arg() unsafe.Pointer    { return unsafe.Pointer(r.in) }

// outStruct zeroes and returns the first size bytes of out for a reply
// struct.
func (r *request) outStruct(size int) unsafe.Pointer {
	clear(r.out[:size])
	return unsafe.Pointer(&r.out[0])
}

// cstring returns the NUL-terminated string at the start of b and the
// bytes after its NUL.
func cstring(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

// counters counts what dispatch does that costs more than it should.
type counters interface {
	fallbackCopy(n int)
}

// PendingRead is a fuse.ReadResult whose data is still on its way (a
// one-sided READ posted and not yet complete): Ready reports that Bytes
// would not wait. A ring thread with several entries keeps serving its
// ring while such READs are in flight and replies to each once it is
// Ready (or waits in Bytes when it has nothing else to do). Done must
// still be called: it waits for the data if Bytes did not.
type PendingRead interface {
	fuse.ReadResult
	Ready() bool
	// Await waits at most d for the data and reports whether it is there.
	Await(d time.Duration) bool
}

// readReply puts a READ's result in dest and returns the reply's length
// and status; it calls res.Done.
func readReply(res fuse.ReadResult, st fuse.Status, dest []byte, c counters) (int, fuse.Status) {
	defer res.Done()
	if st != fuse.OK {
		return 0, st
	}
	data, st := res.Bytes(dest)
	if st != fuse.OK {
		return 0, st
	}
	if len(data) > len(dest) {
		return 0, fuse.EIO
	}
	if len(data) > 0 && &data[0] != &dest[0] {
		copy(dest, data) // the data did not land in the reply buffer
		c.fallbackCopy(len(data))
	}
	return len(data), fuse.OK
}

// dispatch serves one request with fs and returns the length of the
// reply's body in r.out and its status; noReply says the kernel expects
// none (FORGET). INIT and INTERRUPT are the server's, not dispatch's.
func dispatch(fs fuse.RawFileSystem, r *request, c counters) (n int, st fuse.Status, noReply bool) {
	h := r.header()
	switch h.Opcode {
	case opLookup:
		name, _ := cstring(r.payload)
		out := (*fuse.EntryOut)(r.outStruct(int(unsafe.Sizeof(fuse.EntryOut{}))))
		return int(unsafe.Sizeof(*out)), fs.Lookup(r.cancel, h, name, out), false
	case opForget:
		fs.Forget(h.NodeId, (*fuse.ForgetIn)(r.arg()).Nlookup)
		return 0, fuse.OK, true
	case opBatchForget:
		in := (*batchForgetIn)(r.arg())
		cnt := min(int(in.Count), len(r.payload)/int(unsafe.Sizeof(forgetOne{})))
		for i := range cnt {
			f := (*forgetOne)(unsafe.Pointer(&r.payload[i*int(unsafe.Sizeof(forgetOne{}))]))
			if f.NodeID != pollHackNode {
				fs.Forget(f.NodeID, f.Nlookup)
			}
		}
		return 0, fuse.OK, true
	case opGetattr:
		out := (*fuse.AttrOut)(r.outStruct(int(unsafe.Sizeof(fuse.AttrOut{}))))
		return int(unsafe.Sizeof(*out)), fs.GetAttr(r.cancel, (*fuse.GetAttrIn)(r.arg()), out), false
	case opSetattr:
		out := (*fuse.AttrOut)(r.outStruct(int(unsafe.Sizeof(fuse.AttrOut{}))))
		return int(unsafe.Sizeof(*out)), fs.SetAttr(r.cancel, (*fuse.SetAttrIn)(r.arg()), out), false
	case opReadlink:
		data, st := fs.Readlink(r.cancel, h)
		if st != fuse.OK {
			return 0, st, false
		}
		if len(data) > len(r.out) {
			return 0, fuse.Status(34), false // ERANGE
		}
		return copy(r.out, data), fuse.OK, false
	case opSymlink:
		name, rest := cstring(r.payload)
		target, _ := cstring(rest)
		out := (*fuse.EntryOut)(r.outStruct(int(unsafe.Sizeof(fuse.EntryOut{}))))
		return int(unsafe.Sizeof(*out)), fs.Symlink(r.cancel, h, target, name, out), false
	case opMknod:
		name, _ := cstring(r.payload)
		out := (*fuse.EntryOut)(r.outStruct(int(unsafe.Sizeof(fuse.EntryOut{}))))
		return int(unsafe.Sizeof(*out)), fs.Mknod(r.cancel, (*fuse.MknodIn)(r.arg()), name, out), false
	case opMkdir:
		name, _ := cstring(r.payload)
		out := (*fuse.EntryOut)(r.outStruct(int(unsafe.Sizeof(fuse.EntryOut{}))))
		return int(unsafe.Sizeof(*out)), fs.Mkdir(r.cancel, (*fuse.MkdirIn)(r.arg()), name, out), false
	case opUnlink:
		name, _ := cstring(r.payload)
		return 0, fs.Unlink(r.cancel, h, name), false
	case opRmdir:
		name, _ := cstring(r.payload)
		return 0, fs.Rmdir(r.cancel, h, name), false
	case opRename, opRename2:
		in := (*fuse.RenameIn)(r.arg())
		if h.Opcode == opRename {
			in.Flags, in.Padding = 0, 0 // struct fuse_rename_in has newdir only
		}
		oldName, rest := cstring(r.payload)
		newName, _ := cstring(rest)
		return 0, fs.Rename(r.cancel, in, oldName, newName), false
	case opLink:
		name, _ := cstring(r.payload)
		out := (*fuse.EntryOut)(r.outStruct(int(unsafe.Sizeof(fuse.EntryOut{}))))
		return int(unsafe.Sizeof(*out)), fs.Link(r.cancel, (*fuse.LinkIn)(r.arg()), name, out), false
	case opOpen, opOpendir:
		out := (*fuse.OpenOut)(r.outStruct(int(unsafe.Sizeof(fuse.OpenOut{}))))
		in := (*fuse.OpenIn)(r.arg())
		if h.Opcode == opOpen {
			return int(unsafe.Sizeof(*out)), fs.Open(r.cancel, in, out), false
		}
		return int(unsafe.Sizeof(*out)), fs.OpenDir(r.cancel, in, out), false
	case opCreate:
		name, _ := cstring(r.payload)
		out := (*fuse.CreateOut)(r.outStruct(int(unsafe.Sizeof(fuse.CreateOut{}))))
		return int(unsafe.Sizeof(*out)), fs.Create(r.cancel, (*fuse.CreateIn)(r.arg()), name, out), false
	case opRead:
		in := (*fuse.ReadIn)(r.arg())
		if int(in.Size) > len(r.out) {
			return 0, fuse.EINVAL, false
		}
		dest := r.out[:in.Size]
		res, st := fs.Read(r.cancel, in, dest)
		if res == nil {
			return 0, st, false
		}
		if _, ok := res.(PendingRead); ok && r.mayDefer && st == fuse.OK {
			r.pending = res
			return 0, fuse.OK, false
		}
		n, st := readReply(res, st, dest, c)
		return n, st, false
	case opWrite:
		in := (*fuse.WriteIn)(r.arg())
		if int(in.Size) > len(r.payload) {
			return 0, fuse.EINVAL, false
		}
		written, st := fs.Write(r.cancel, in, r.payload[:in.Size])
		out := (*fuse.WriteOut)(r.outStruct(int(unsafe.Sizeof(fuse.WriteOut{}))))
		out.Size = written
		return int(unsafe.Sizeof(*out)), st, false
	case opStatfs:
		out := (*fuse.StatfsOut)(r.outStruct(int(unsafe.Sizeof(fuse.StatfsOut{}))))
		return int(unsafe.Sizeof(*out)), fs.StatFs(r.cancel, h, out), false
	case opRelease:
		fs.Release(r.cancel, (*fuse.ReleaseIn)(r.arg()))
		return 0, fuse.OK, false
	case opReleasedir:
		fs.ReleaseDir((*fuse.ReleaseIn)(r.arg()))
		return 0, fuse.OK, false
	case opFsync:
		return 0, fs.Fsync(r.cancel, (*fuse.FsyncIn)(r.arg())), false
	case opFsyncdir:
		return 0, fs.FsyncDir(r.cancel, (*fuse.FsyncIn)(r.arg())), false
	case opFlush:
		return 0, fs.Flush(r.cancel, (*fuse.FlushIn)(r.arg())), false
	case opReaddir, opReaddirplus:
		in := (*fuse.ReadIn)(r.arg())
		size := min(int(in.Size), len(r.out))
		list := fuse.NewDirEntryList(r.out[:size], in.Offset)
		var st fuse.Status
		if h.Opcode == opReaddir {
			st = fs.ReadDir(r.cancel, in, list)
		} else {
			st = fs.ReadDirPlus(r.cancel, in, list)
		}
		return len(list.Bytes()), st, false
	case opAccess:
		return 0, fs.Access(r.cancel, (*fuse.AccessIn)(r.arg())), false
	case opDestroy:
		return 0, fuse.OK, false
	case opIoctl:
		in := (*fuse.IoctlIn)(r.arg())
		const outSize = int(unsafe.Sizeof(fuse.IoctlOut{}))
		if int(in.InSize) > len(r.payload) || outSize+int(in.OutSize) > len(r.out) {
			return 0, fuse.EINVAL, false
		}
		// The input may share the reply's buffer (on the ring): take it
		// out of the way of the output first.
		var small [256]byte
		var input []byte
		if int(in.InSize) <= len(small) {
			input = small[:in.InSize]
		} else {
			input = make([]byte, in.InSize)
		}
		copy(input, r.payload)
		outbuf := r.out[outSize : outSize+int(in.OutSize)]
		out := (*fuse.IoctlOut)(r.outStruct(outSize))
		clear(outbuf)
		st := fs.Ioctl(r.cancel, in, input, out, outbuf)
		return outSize + len(outbuf), st, false
	case opFallocate:
		return 0, fs.Fallocate(r.cancel, (*fuse.FallocateIn)(r.arg())), false
	case opLseek:
		out := (*fuse.LseekOut)(r.outStruct(int(unsafe.Sizeof(fuse.LseekOut{}))))
		return int(unsafe.Sizeof(*out)), fs.Lseek(r.cancel, (*fuse.LseekIn)(r.arg()), out), false
	case opCopyFileRange:
		written, st := fs.CopyFileRange(r.cancel, (*fuse.CopyFileRangeIn)(r.arg()))
		out := (*fuse.WriteOut)(r.outStruct(int(unsafe.Sizeof(fuse.WriteOut{}))))
		out.Size = written
		return int(unsafe.Sizeof(*out)), st, false
	case opPoll:
		if p, ok := fs.(Poller); ok {
			out := (*PollOut)(r.outStruct(int(unsafe.Sizeof(PollOut{}))))
			return int(unsafe.Sizeof(*out)), p.Poll(r.cancel, r.header(), &(*pollIn)(r.arg()).PollIn, out), false
		}
	}
	// Extended attributes (krfs has none), locks (not negotiated), POLL
	// (unless fs is a Poller: files are always ready), STATX, TMPFILE,
	// BMAP and anything newer: the kernel remembers ENOSYS and stops
	// asking.
	return 0, fuse.ENOSYS, false
}

// Poller is a file system that answers FUSE_POLL: dispatch calls Poll
// when the file system given to Mount implements it, and Mount then does
// not make the kernel stop asking (see pollhack.go). Every file of the
// mount is then polled through the file system, so a process that opens
// files of a mount it serves itself risks the deadlock pollhack.go
// describes; krfs's daemon opens none.
type Poller interface {
	// Poll fills out.Revents with the events of in.Events that are ready
	// on file handle in.Fh; with PollScheduleNotify in in.Flags, it
	// must later send Notifier.PollWakeup(in.Kh) once the file may have
	// become ready.
	Poll(cancel <-chan struct{}, h *fuse.InHeader, in *PollIn, out *PollOut) fuse.Status
}

// PollScheduleNotify in PollIn.Flags asks for a wake-up.
const PollScheduleNotify = 1

// PollIn is struct fuse_poll_in.
type PollIn struct {
	Fh     uint64
	Kh     uint64
	Flags  uint32
	Events uint32
}

// pollIn is a POLL request's header and argument.
type pollIn struct {
	fuse.InHeader
	PollIn
}

// PollOut is struct fuse_poll_out.
type PollOut struct {
	Revents uint32
	Padding uint32
}
