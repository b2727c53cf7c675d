package fuseserve

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// fakeFS records what the dispatcher hands it.
type fakeFS struct {
	fuse.RawFileSystem
	name, name2 string
	node        uint64
	rename      fuse.RenameIn
	data        []byte
	readInto    func(buf []byte) fuse.ReadResult
	ioctlIn     []byte
	forgets     [][2]uint64
}

func newFakeFS() *fakeFS { return &fakeFS{RawFileSystem: fuse.NewDefaultRawFileSystem()} }

func (f *fakeFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	f.name, f.node = name, h.NodeId
	out.NodeId, out.Attr.Size = 42, 4242
	return fuse.OK
}

func (f *fakeFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	f.rename, f.name, f.name2 = *in, oldName, newName
	return fuse.OK
}

func (f *fakeFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	f.name, f.name2 = name, target
	return fuse.OK
}

func (f *fakeFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	return f.readInto(buf[:in.Size]), fuse.OK
}

func (f *fakeFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	f.data = append([]byte(nil), data...)
	return uint32(len(data)), fuse.OK
}

func (f *fakeFS) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	for i := range outbuf {
		outbuf[i] = 0xee // clobbers the input where they share a buffer
	}
	f.ioctlIn = append([]byte(nil), inbuf...)
	out.Result = 7
	return fuse.OK
}

func (f *fakeFS) Forget(node, nlookup uint64) {
	f.forgets = append(f.forgets, [2]uint64{node, nlookup})
}

type countCopies struct{ n, bytes int }

func (c *countCopies) fallbackCopy(n int) { c.n++; c.bytes += n }

// wire builds a request both ways the kernel delivers it: on /dev/fuse
// (header, first argument and the rest back to back) and in a ring entry
// (header in in_out, first argument in op_in, the rest in the payload).
type wire struct {
	op     uint32
	node   uint64
	arg    []byte // the first argument as the kernel sends it
	rest   []byte
	outCap int
}

func (w wire) header(total int) []byte {
	h := make([]byte, inHeaderSize)
	binary.NativeEndian.PutUint32(h[0:], uint32(total))
	binary.NativeEndian.PutUint32(h[4:], w.op)
	binary.NativeEndian.PutUint64(h[8:], 99)
	binary.NativeEndian.PutUint64(h[16:], w.node)
	return h
}

func (w wire) dev() *request {
	msg := append(append(w.header(inHeaderSize+len(w.arg)+len(w.rest)), w.arg...), w.rest...)
	r, rest := decodeDev(msg)
	r.payload = rest
	r.out = make([]byte, w.outCap)
	return r
}

// ring returns the request as a ring entry holds it; its payload and out
// share the entry's payload buffer, as on the ring.
func (w wire) ring() *request {
	h := make([]byte, hdrSize)
	copy(h[hdrInOut:], w.header(inHeaderSize+len(w.arg)+len(w.rest)))
	// The kernel writes only the first argument's bytes of op_in: the
	// rest is whatever an earlier request left there.
	for i := hdrOpIn; i < hdrOpIn+argArea; i++ {
		h[i] = 0xff
	}
	copy(h[hdrOpIn:], w.arg)
	binary.NativeEndian.PutUint32(h[hdrPayloadSz:], uint32(len(w.rest)))
	p := make([]byte, max(w.outCap, len(w.rest)))
	copy(p, w.rest)
	r := decodeRing(new([scratchSize / 8]uint64), h, p)
	return &r
}

func le64(vs ...uint64) []byte {
	b := make([]byte, 8*len(vs))
	for i, v := range vs {
		binary.NativeEndian.PutUint64(b[8*i:], v)
	}
	return b
}

func both(t *testing.T, w wire, check func(t *testing.T, r *request, f *fakeFS, n int, st fuse.Status)) {
	for _, path := range []string{"dev", "ring"} {
		t.Run(path, func(t *testing.T) {
			f := newFakeFS()
			r := w.dev()
			if path == "ring" {
				r = w.ring()
			}
			n, st, _ := dispatch(f, r, &countCopies{})
			check(t, r, f, n, st)
		})
	}
}

// Rule: LOOKUP's name comes from the request's payload (the kernel sends
// an empty first argument) and the reply is a whole fuse_entry_out.
func TestLookupDecodesTheNameOnBothPaths(t *testing.T) {
	both(t, wire{op: opLookup, node: 5, rest: []byte("peers\x00"), outCap: 256}, func(t *testing.T, r *request, f *fakeFS, n int, st fuse.Status) {
		if st != fuse.OK || f.name != "peers" || f.node != 5 {
			t.Fatalf("Lookup got %q in node %d, status %v", f.name, f.node, st)
		}
		out := (*fuse.EntryOut)(unsafe.Pointer(&r.out[0]))
		if n != 128 || out.NodeId != 42 || out.Attr.Size != 4242 {
			t.Fatalf("reply of %d bytes, %+v", n, out)
		}
	})
}

// Rule: RENAME's first argument is struct fuse_rename_in (newdir only):
// the names that follow it on /dev/fuse are not read as RENAME2's flags.
func TestRenameHasNoFlagsAndTwoNames(t *testing.T) {
	both(t, wire{op: opRename, node: 1, arg: le64(9), rest: []byte("old\x00new\x00"), outCap: 64}, func(t *testing.T, r *request, f *fakeFS, n int, st fuse.Status) {
		if st != fuse.OK || f.rename.Newdir != 9 || f.rename.Flags != 0 || f.name != "old" || f.name2 != "new" {
			t.Fatalf("Rename(%+v, %q, %q) = %v", f.rename, f.name, f.name2, st)
		}
	})
	both(t, wire{op: opRename2, node: 1, arg: append(le64(9), 1, 0, 0, 0, 0, 0, 0, 0), rest: []byte("a\x00b\x00"), outCap: 64}, func(t *testing.T, r *request, f *fakeFS, n int, st fuse.Status) {
		if f.rename.Newdir != 9 || f.rename.Flags != 1 || f.name != "a" || f.name2 != "b" {
			t.Fatalf("Rename2(%+v, %q, %q)", f.rename, f.name, f.name2)
		}
	})
}

// Rule: SYMLINK carries the link's name, then its target.
func TestSymlinkNameThenTarget(t *testing.T) {
	both(t, wire{op: opSymlink, node: 1, rest: []byte("link\x00/some/target\x00"), outCap: 256}, func(t *testing.T, r *request, f *fakeFS, n int, st fuse.Status) {
		if f.name != "link" || f.name2 != "/some/target" {
			t.Fatalf("Symlink name %q target %q", f.name, f.name2)
		}
	})
}

func readIn(fh, off uint64, size uint32) []byte {
	b := make([]byte, argSize[opRead])
	binary.NativeEndian.PutUint64(b[0:], fh)
	binary.NativeEndian.PutUint64(b[8:], off)
	binary.NativeEndian.PutUint32(b[16:], size)
	return b
}

// Rule: a READ whose data the file system put in the reply buffer is not
// copied; data returned elsewhere is copied into it and counted.
func TestReadCopiesOnlyDataOutsideTheReplyBuffer(t *testing.T) {
	for _, inPlace := range []bool{true, false} {
		f := newFakeFS()
		other := []byte("elsewhere")
		f.readInto = func(buf []byte) fuse.ReadResult {
			if inPlace {
				copy(buf, "in place!")
				return fuse.ReadResultData(buf[:9])
			}
			return fuse.ReadResultData(other)
		}
		r := wire{op: opRead, node: 3, arg: readIn(1, 0, 9), outCap: 64}.ring()
		var c countCopies
		n, st, _ := dispatch(f, r, &c)
		want := "in place!"
		if !inPlace {
			want = "elsewhere"
		}
		if st != fuse.OK || string(r.out[:n]) != want {
			t.Fatalf("inPlace %v: reply %q, %v", inPlace, r.out[:n], st)
		}
		if inPlace && c.n != 0 || !inPlace && (c.n != 1 || c.bytes != 9) {
			t.Fatalf("inPlace %v: %d fallback copies of %d bytes", inPlace, c.n, c.bytes)
		}
	}
}

// Rule: a READ larger than the reply buffer is refused, not overrun.
func TestReadLargerThanTheBufferIsRefused(t *testing.T) {
	f := newFakeFS()
	f.readInto = func(buf []byte) fuse.ReadResult { t.Fatal("read served"); return nil }
	r := wire{op: opRead, node: 3, arg: readIn(1, 0, 4096), outCap: 64}.ring()
	if _, st, _ := dispatch(f, r, &countCopies{}); st != fuse.EINVAL {
		t.Fatalf("status %v", st)
	}
}

// Rule: WRITE hands over exactly its Size bytes of payload and replies
// with the count written.
func TestWriteDataAndReply(t *testing.T) {
	arg := make([]byte, argSize[opWrite])
	binary.NativeEndian.PutUint32(arg[16:], 5) // size
	both(t, wire{op: opWrite, node: 3, arg: arg, rest: []byte("hello"), outCap: 64}, func(t *testing.T, r *request, f *fakeFS, n int, st fuse.Status) {
		if st != fuse.OK || string(f.data) != "hello" || n != 8 || binary.NativeEndian.Uint32(r.out) != 5 {
			t.Fatalf("wrote %q, reply %d bytes %v, %v", f.data, n, r.out[:n], st)
		}
	})
}

// Rule: an ioctl's input reaches the file system intact even where it
// shares the ring entry's buffer with the output.
func TestIoctlInputSurvivesTheSharedBuffer(t *testing.T) {
	arg := make([]byte, argSize[opIoctl])
	binary.NativeEndian.PutUint32(arg[28:], 32) // in_size
	binary.NativeEndian.PutUint32(arg[24:], 32) // out_size
	input := bytes.Repeat([]byte{1, 2, 3, 4}, 8)
	both(t, wire{op: opIoctl, node: 3, arg: arg, rest: input, outCap: 64}, func(t *testing.T, r *request, f *fakeFS, n int, st fuse.Status) {
		if !bytes.Equal(f.ioctlIn, input) {
			t.Fatalf("ioctl input %v", f.ioctlIn)
		}
		if n != 16+32 || binary.NativeEndian.Uint32(r.out) != 7 || r.out[16] != 0xee {
			t.Fatalf("reply of %d bytes: %v", n, r.out[:n])
		}
	})
}

// Rule: BATCH_FORGET forgets every listed node, no more than the payload
// holds, and needs no reply.
func TestBatchForget(t *testing.T) {
	arg := make([]byte, 8)
	binary.NativeEndian.PutUint32(arg, 3) // claims 3, carries 2
	r := wire{op: opBatchForget, arg: arg, rest: le64(10, 1, 11, 2), outCap: 16}.dev()
	f := newFakeFS()
	_, _, noReply := dispatch(f, r, &countCopies{})
	if !noReply || len(f.forgets) != 2 || f.forgets[0] != [2]uint64{10, 1} || f.forgets[1] != [2]uint64{11, 2} {
		t.Fatalf("forgets %v, noReply %v", f.forgets, noReply)
	}
}

// Rule: an opcode the dispatcher does not serve gets ENOSYS.
func TestUnknownOpcodeIsENOSYS(t *testing.T) {
	for _, op := range []uint32{21, 22, 31, 40, 52, 99, 4000} {
		r := wire{op: op, node: 1, outCap: 64}.dev()
		if _, st, _ := dispatch(newFakeFS(), r, &countCopies{}); st != fuse.ENOSYS {
			t.Errorf("opcode %d: %v", op, st)
		}
	}
}

// streamFS opens every file as a stream.
type streamFS struct{ *fakeFS }

func (s streamFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	out.Fh, out.OpenFlags = 77, fuse.FOPEN_NONSEEKABLE
	return fuse.OK
}

// Rule: I/O on a handle opened FOPEN_NONSEEKABLE (a port) may block and
// is served off the ring's thread, until the handle is released.
func TestStreamHandlesMayBlockUntilReleased(t *testing.T) {
	s := &Server{fs: streamFS{newFakeFS()}, streams: map[uint64]bool{}, intr: map[uint64]chan struct{}{}}
	read := wire{op: opRead, node: 3, arg: readIn(77, 0, 8), outCap: 64}
	if s.mayBlock(read.ring()) {
		t.Fatal("a read of a handle never opened may block")
	}
	if _, st := s.serve(wire{op: opOpen, node: 3, arg: make([]byte, 8), outCap: 64}.ring()); st != fuse.OK {
		t.Fatal(st)
	}
	if !s.mayBlock(read.ring()) {
		t.Fatal("a read of a stream handle is served on the ring's thread")
	}
	rel := make([]byte, argSize[opRelease])
	binary.NativeEndian.PutUint64(rel, 77)
	s.serve(wire{op: opRelease, node: 3, arg: rel, outCap: 64}.ring())
	if s.mayBlock(read.ring()) {
		t.Fatal("a released stream handle still counts")
	}
}

// Rule: INTERRUPT closes the cancel channel of the request it names, and
// only that one; stopping closes the rest and any made later.
func TestInterrupts(t *testing.T) {
	s := &Server{intr: map[uint64]chan struct{}{}}
	a, b := s.interruptible(1), s.interruptible(2)
	s.interrupt(1)
	s.interrupt(3)
	select {
	case <-a:
	default:
		t.Fatal("interrupted request not cancelled")
	}
	select {
	case <-b:
		t.Fatal("the other request was cancelled")
	default:
	}
	s.cancelAll()
	<-b
	<-s.interruptible(4)
}

// Rule: queues get RingBytes / (CPUs * payload) entries within
// [MinEntriesPerQueue, MaxEntriesPerQueue].
func TestEntriesPerQueue(t *testing.T) {
	for _, c := range []struct{ bytes, cpus, payload, want int }{
		{32 << 20, 2, 1 << 20, 8}, {32 << 20, 8, 1 << 20, 4}, {32 << 20, 64, 1 << 20, 2}, {1 << 20, 1, 1 << 20, 2},
	} {
		if got := entriesPerQueue(c.bytes, c.cpus, c.payload); got != c.want {
			t.Errorf("entriesPerQueue(%d, %d, %d) = %d, want %d", c.bytes, c.cpus, c.payload, got, c.want)
		}
	}
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string]int{"0-1\n": 2, "0": 1, "0-3,5": 6, "0,2-7": 8} {
		if got, err := parseCPUList(in); err != nil || got != want {
			t.Errorf("parseCPUList(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "0-y"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) accepted", bad)
		}
	}
}
