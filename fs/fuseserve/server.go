package fuseserve

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Mode says whether a server may serve requests over io_uring.
type Mode int

const (
	// Auto serves over io_uring when the kernel offers it, else over
	// /dev/fuse.
	Auto Mode = iota
	// Uring serves over io_uring or fails the mount.
	Uring
	// Dev serves over /dev/fuse only.
	Dev
)

// DefaultRingBytes is Options.RingBytes when left zero.
const DefaultRingBytes = 16 << 20

// MaxEntriesPerQueue and MinEntriesPerQueue bound the entries of a queue
// that Options.RingBytes sizes (see entriesPerQueue).
const (
	MaxEntriesPerQueue = 8
	MinEntriesPerQueue = 2
)

// Options tune a server.
type Options struct {
	// Name is the fuse.<Name> type in the mount table; FsName the source.
	Name, FsName string
	// AllowOther and DefaultPermissions are the kernel's mount options.
	AllowOther, DefaultPermissions bool
	// MountOptions are more mount options: nosuid, nodev, noexec, suid,
	// dev and exec become mount flags (nosuid and nodev are the
	// default); others go to the kernel as they are.
	MountOptions []string
	// MaxWrite is the largest READ or WRITE payload (default 1 MiB).
	MaxWrite int
	// Mode picks the transport (Auto, Uring or Dev).
	Mode Mode
	// RingBytes bounds the memory of the ring entries' payload buffers:
	// each queue (one per possible CPU) gets RingBytes / (CPUs *
	// payload) entries, at least MinEntriesPerQueue and at most
	// MaxEntriesPerQueue (default DefaultRingBytes).
	RingBytes int
	// EntriesPerThread is how many of a queue's entries one ring thread
	// serves (0 or 1: one; at most the queue's). A thread with one entry
	// serves one request at a time, so a handler that blocks holds up
	// nothing else; one with several keeps serving while READs it started
	// are on the wire (PendingRead), but a handler that blocks holds up
	// the thread's other entries.
	EntriesPerThread int
	// Notifier, if set, sends the file system's notifications to the
	// kernel once mounted.
	Notifier *Notifier
	// ReplyMemory, if set, is called once with the memory of every ring
	// entry's payload buffer, before the first request can land there:
	// a READ's reply is built in that buffer (the dest of
	// RawFileSystem.Read) and a WRITE's data arrives in it, so a file
	// system that registers it with its NIC moves payloads with no copy
	// of its own. The memory stays valid as long as the Server is
	// referenced. An error leaves the server serving; the file system
	// then copies (counted in FallbackCopies).
	ReplyMemory func(b []byte) error
	// Logf receives lines an operator should see.
	Logf func(format string, args ...any)
}

// Stats count what a server did.
type Stats struct {
	// Transport is "io_uring" or "dev".
	Transport string `json:"transport"`
	// Why says why a server that could have used io_uring does not.
	Why string `json:"why,omitempty"`
	// Queues and EntriesPerQueue describe the rings (0 on dev).
	Queues          int `json:"queues"`
	EntriesPerQueue int `json:"entries_per_queue"`
	// DevRequests came through /dev/fuse; RingRequests through the
	// rings, RingAsync of them served off the ring's thread (requests
	// that may block, like a port read), RingPending of them READs
	// answered after their thread served other entries (PendingRead).
	// go-fuse's server (the dev transport) counts none.
	DevRequests  uint64 `json:"dev_requests"`
	RingRequests uint64 `json:"ring_requests"`
	RingAsync    uint64 `json:"ring_async"`
	RingPending  uint64 `json:"ring_pending"`
	// FallbackCopies counts READ replies whose data did not land in the
	// reply buffer and was copied there; FallbackBytes their bytes.
	FallbackCopies uint64 `json:"fallback_copies"`
	FallbackBytes  uint64 `json:"fallback_bytes"`
	// RingReregistered counts ring entries the kernel refused a command
	// of (other than at unmount) and that were registered again.
	RingReregistered uint64 `json:"ring_reregistered"`
	// Stalls counts the times the kernel held requests for the mount
	// while none was in service or served for 30 s (see stall.go).
	Stalls uint64 `json:"stalls"`
}

// Server serves one FUSE mount.
type Server struct {
	fs       fuse.RawFileSystem
	dir      string
	fd       int
	o        Options
	maxWrite int
	payload  int // ring entry payload size
	entries  int
	uring    bool
	why      string
	queues   []*queue
	cpus     int
	slab     []byte // every entry's payload buffer, payload bytes each

	wg       sync.WaitGroup // the /dev/fuse loop, its handlers and the queues
	waitOnce sync.Once
	done     chan struct{}
	stop     chan struct{} // closed when the /dev/fuse loop ends: the mount is gone

	devReqs, ringReqs, ringAsync, ringPending, fbCopies, fbBytes, ringReregistered, stalls atomic.Uint64
	inService                                                                              atomic.Int64 // requests taken and not yet answered

	mu      sync.Mutex
	streams map[uint64]bool          // file handles whose I/O may block
	intr    map[uint64]chan struct{} // cancel channels of interruptible requests
	early   []uint64                 // interrupts of requests not seen yet (see interrupt)
	closing bool
}

func (s *Server) fallbackCopy(n int) {
	s.fbCopies.Add(1)
	s.fbBytes.Add(uint64(n))
}

// enableURing is the module parameter that lets FUSE connections use
// io_uring.
const enableURing = "/sys/module/fuse/parameters/enable_uring"

// HowToEnable is what an operator runs to let FUSE use io_uring.
const HowToEnable = "echo Y > " + enableURing + " (at boot: 'options fuse enable_uring=1' in /etc/modprobe.d/fuse.conf, or fuse.enable_uring=1 on the kernel command line when fuse is built in)"

// KernelOffersURing reports whether this kernel lets a new FUSE mount
// use io_uring, and if not, why (in one line, with the command that
// changes it).
func KernelOffersURing() (bool, string) {
	b, err := os.ReadFile(enableURing)
	if err != nil {
		return false, "this kernel has no FUSE over io_uring (no " + enableURing + "; Linux 6.14 or later has it)"
	}
	if v := strings.TrimSpace(string(b)); v != "Y" && v != "1" {
		return false, "FUSE over io_uring is off: " + HowToEnable
	}
	r, err := newRing(2)
	if err != nil {
		return false, fmt.Sprintf("io_uring is unavailable (%v; see sysctl kernel.io_uring_disabled)", err)
	}
	r.close()
	return true, ""
}

// Mount mounts fs at dir and serves it until unmounted.
func Mount(dir string, fs fuse.RawFileSystem, o Options) (*Server, error) {
	if o.MaxWrite <= 0 {
		o.MaxWrite = 1 << 20
	}
	if o.Name == "" {
		o.Name = "krfs"
	}
	if o.FsName == "" {
		o.FsName = o.Name
	}
	if o.RingBytes <= 0 {
		o.RingBytes = DefaultRingBytes
	}
	s := &Server{fs: fs, dir: dir, fd: -1, o: o, maxWrite: o.MaxWrite, done: make(chan struct{}), stop: make(chan struct{}),
		streams: map[uint64]bool{}, intr: map[uint64]chan struct{}{}}
	wantRing := false
	switch o.Mode {
	case Dev:
		s.why = "--fuse-transport dev"
	default:
		ok, why := KernelOffersURing()
		if !ok && o.Mode == Uring {
			return nil, errors.New(why)
		}
		wantRing, s.why = ok, why
	}
	pageSize := os.Getpagesize()
	maxPages := (s.maxWrite + pageSize - 1) / pageSize
	s.payload = max(8192, s.maxWrite, maxPages*pageSize)

	if err := s.mount(); err != nil {
		return nil, err
	}
	buf := make([]byte, s.maxWrite+64<<10)
	if err := s.init(buf, wantRing); err != nil {
		s.abort()
		return nil, err
	}
	if s.o.Notifier != nil {
		s.o.Notifier.fd.Store(int64(s.fd))
	}
	s.wg.Add(1)
	go s.loop(buf)
	if s.uring {
		if err := s.startQueues(); err != nil {
			if o.Mode == Uring {
				s.abort()
				return nil, err
			}
			s.logf("FUSE over io_uring failed (%v): serving /dev/fuse", err)
		}
	}
	if _, ok := fs.(Poller); !ok {
		s.probePoll()
	}
	if s.uring && len(s.queues) > 0 {
		if f := fusectlWaiting(dir); f != "" {
			s.wg.Add(1)
			go s.watchStalls(f)
		}
	}
	return s, nil
}

func (s *Server) logf(format string, args ...any) {
	if s.o.Logf != nil {
		s.o.Logf(format, args...)
	}
}

// mount opens /dev/fuse and mounts it at s.dir.
func (s *Server) mount() error {
	var st unix.Stat_t
	if err := unix.Stat(s.dir, &st); err != nil {
		return fmt.Errorf("mount point %s: %w", s.dir, err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("/dev/fuse: %w", err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	data := []string{"fd=" + strconv.Itoa(fd), fmt.Sprintf("rootmode=%o", st.Mode&unix.S_IFMT),
		"user_id=" + strconv.Itoa(os.Geteuid()), "group_id=" + strconv.Itoa(os.Getegid()),
		"max_read=" + strconv.Itoa(s.maxWrite)}
	for _, opt := range s.o.MountOptions {
		switch opt {
		case "nodev":
			flags |= unix.MS_NODEV
		case "dev":
			flags &^= unix.MS_NODEV
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "suid":
			flags &^= unix.MS_NOSUID
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "exec":
			flags &^= unix.MS_NOEXEC
		default:
			data = append(data, opt)
		}
	}
	if s.o.AllowOther {
		data = append(data, "allow_other")
	}
	if s.o.DefaultPermissions {
		data = append(data, "default_permissions")
	}
	if err := unix.Mount(s.o.FsName, s.dir, "fuse."+s.o.Name, flags, strings.Join(data, ",")); err != nil {
		unix.Close(fd)
		return fmt.Errorf("mount(%s): %w", s.dir, err)
	}
	s.fd = fd
	return nil
}

// abort takes a half-made mount away.
func (s *Server) abort() {
	_ = unix.Unmount(s.dir, unix.MNT_DETACH)
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// Capabilities asked of the kernel (those it offers): go-fuse's set for
// krfs's options (no READDIRPLUS, no locks, no xattrs).
const wantFlags = fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_PARALLEL_DIROPS | fuse.CAP_MAX_PAGES |
	fuse.CAP_AUTO_INVAL_DATA

// minURingMinor is the protocol version that brought FUSE over io_uring.
const minURingMinor = 42

// init answers the kernel's INIT, the first request of a mount.
func (s *Server) init(buf []byte, wantRing bool) error {
	var n int
	var err error
	for {
		n, err = unix.Read(s.fd, buf)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("reading FUSE INIT: %w", err)
	}
	if n < inHeaderSize+16 {
		return fmt.Errorf("FUSE INIT: short message (%d bytes)", n)
	}
	var in fuse.InitIn
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in)), buf[:n])
	if in.Opcode != opInit {
		return fmt.Errorf("FUSE: first request is opcode %d, not INIT", in.Opcode)
	}
	var out fuse.InitOut
	st := fuse.OK
	if in.Major != 7 || in.Minor < 31 {
		st = fuse.Status(unix.EPROTO)
	}
	offered := in.Flags64()
	if in.Flags&fuse.CAP_INIT_EXT == 0 {
		offered &= 0xffffffff
	}
	flags := offered & wantFlags
	s.uring = false
	if wantRing {
		switch {
		case offered&fuse.CAP_OVER_IO_URING == 0 || in.Minor < minURingMinor:
			s.why = "the kernel did not offer FUSE over io_uring at INIT (" + HowToEnable + ")"
		default:
			flags |= fuse.CAP_OVER_IO_URING
			s.uring = true
		}
	}
	if !s.uring && s.o.Mode == Uring {
		st = fuse.Status(unix.EPROTO)
	}
	out = fuse.InitOut{
		Major: 7, Minor: min(in.Minor, 45), MaxReadAhead: in.MaxReadAhead,
		Flags: uint32(flags) | fuse.CAP_INIT_EXT, Flags2: uint32(flags >> 32),
		MaxBackground: 12, CongestionThreshold: 9, MaxWrite: uint32(s.maxWrite), TimeGran: 1,
		MaxPages: uint16(s.payload / os.Getpagesize()),
	}
	body := unsafe.Slice((*byte)(unsafe.Pointer(&out)), unsafe.Sizeof(out))
	if st != fuse.OK {
		body = nil
	}
	if err := s.reply(in.Unique, st, body); err != nil {
		return fmt.Errorf("answering FUSE INIT: %w", err)
	}
	if st != fuse.OK {
		if s.o.Mode == Uring {
			return errors.New(s.why)
		}
		return fmt.Errorf("FUSE protocol %d.%d is too old", in.Major, in.Minor)
	}
	return nil
}

// reply writes a reply to /dev/fuse.
func (s *Server) reply(unique uint64, st fuse.Status, body []byte) error {
	var hdr [outHeaderSize]byte
	if st != fuse.OK {
		body = nil
	}
	putU32(hdr[:], 0, uint32(outHeaderSize+len(body)))
	putU32(hdr[:], 4, uint32(-int32(st)))
	putU64(hdr[:], 8, unique)
	iov := [][]byte{hdr[:]}
	if len(body) > 0 {
		iov = append(iov, body)
	}
	for {
		_, err := unix.Writev(s.fd, iov)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ENOENT {
			return nil // the request was interrupted meanwhile
		}
		return err
	}
}

// loop reads /dev/fuse until the mount goes away: what the kernel sends
// there (FORGET, INTERRUPT, and every request while the rings are not up
// or not used).
func (s *Server) loop(buf []byte) {
	defer s.wg.Done()
	defer close(s.stop)
	defer s.cancelAll()
	for {
		n, err := unix.Read(s.fd, buf)
		switch err {
		case nil:
		case unix.EINTR, unix.EAGAIN, unix.ENOENT:
			continue
		case unix.ENODEV:
			return // unmounted
		default:
			s.logf("reading /dev/fuse: %v", err)
			return
		}
		if n < inHeaderSize {
			continue
		}
		s.devReqs.Add(1)
		s.devRequest(buf[:n])
	}
}

// devRequest serves one request read from /dev/fuse: FORGETs and
// INTERRUPTs at once, anything else on its own goroutine (it may block,
// and the loop must keep reading).
func (s *Server) devRequest(msg []byte) {
	r, rest := decodeDev(msg)
	op := r.header().Opcode
	h := r.header()
	switch op {
	case opInterrupt:
		s.interrupt((*fuse.InterruptIn)(r.arg()).Unique)
		return
	case opForget, opBatchForget:
		r.payload = rest
		if op == opForget && r.header().NodeId == pollHackNode {
			return
		}
		dispatch(s.fs, r, s)
		return
	case opInit:
		_ = s.reply(h.Unique, fuse.Status(unix.EPROTO), nil)
		return
	}
	r.payload = append([]byte(nil), rest...)
	r.out = make([]byte, replyCap(r))
	r.cancel = s.interruptible(h.Unique)
	s.wg.Add(1)
	s.inService.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.inService.Add(-1)
		n, st := s.serve(r)
		s.endInterruptible(h.Unique)
		if err := s.reply(h.Unique, st, r.out[:n]); err != nil && err != unix.ENODEV {
			s.logf("FUSE reply to opcode %d: %v", h.Opcode, err)
		}
	}()
}

// decodeDev splits a request read from /dev/fuse, where the arguments
// come back to back, into its header and first argument (copied) and the
// rest (in msg).
func decodeDev(msg []byte) (*request, []byte) {
	r := &request{in: new([scratchSize / 8]uint64)}
	op := binary.NativeEndian.Uint32(msg[4:])
	arg := 0
	if op < opCount {
		arg = argSize[op]
	}
	arg = min(arg, len(msg)-inHeaderSize, argArea)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(r.in)), scratchSize), msg[:inHeaderSize+arg])
	return r, msg[inHeaderSize+arg:]
}

// replyCap is how large r's reply body may be.
func replyCap(r *request) int {
	switch r.header().Opcode {
	case opRead, opReaddir, opReaddirplus:
		return int((*fuse.ReadIn)(r.arg()).Size)
	case opIoctl:
		return int(unsafe.Sizeof(fuse.IoctlOut{})) + int((*fuse.IoctlIn)(r.arg()).OutSize)
	case opReadlink:
		return 4096
	}
	return 256
}

// serve dispatches r and keeps the table of stream handles: files
// opened FOPEN_NONSEEKABLE (krfs's ports) may block a read for as long
// as no message comes, so their I/O is not served on a ring's thread.
func (s *Server) serve(r *request) (int, fuse.Status) {
	h := r.header()
	switch h.Opcode {
	case opRelease:
		fh := (*fuse.ReleaseIn)(r.arg()).Fh
		s.mu.Lock()
		delete(s.streams, fh)
		s.mu.Unlock()
	}
	n, st, handled := pollHack(r)
	if !handled {
		n, st, _ = dispatch(s.fs, r, s)
	}
	if st != fuse.OK {
		n = 0
	}
	if (h.Opcode == opOpen || h.Opcode == opCreate) && st == fuse.OK {
		var out *fuse.OpenOut
		if h.Opcode == opOpen {
			out = (*fuse.OpenOut)(unsafe.Pointer(&r.out[0]))
		} else {
			out = &(*fuse.CreateOut)(unsafe.Pointer(&r.out[0])).OpenOut
		}
		if out.OpenFlags&fuse.FOPEN_NONSEEKABLE != 0 {
			s.mu.Lock()
			s.streams[out.Fh] = true
			s.mu.Unlock()
		}
	}
	return n, st
}

// mayBlock reports whether r is I/O on a stream handle.
func (s *Server) mayBlock(r *request) bool {
	var fh uint64
	switch r.header().Opcode {
	case opRead:
		fh = (*fuse.ReadIn)(r.arg()).Fh
	case opWrite:
		fh = (*fuse.WriteIn)(r.arg()).Fh
	case opIoctl:
		fh = (*fuse.IoctlIn)(r.arg()).Fh
	case opFsync, opFlush:
		fh = (*fuse.FsyncIn)(r.arg()).Fh
	default:
		return false
	}
	s.mu.Lock()
	b := s.streams[fh]
	s.mu.Unlock()
	return b
}

// interruptible returns the cancel channel of request unique, closed
// when the kernel interrupts it (the caller got a signal) or the server
// stops.
func (s *Server) interruptible(unique uint64) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	if s.closing || s.interruptedEarly(unique) {
		close(ch)
	} else {
		s.intr[unique] = ch
	}
	s.mu.Unlock()
	return ch
}

// maxEarly bounds the interrupts kept for requests not seen yet.
const maxEarly = 64

// interruptedEarly reports (and forgets) whether unique's INTERRUPT came
// before the request itself. s.mu is held.
func (s *Server) interruptedEarly(unique uint64) bool {
	for i, u := range s.early {
		if u == unique {
			s.early = append(s.early[:i], s.early[i+1:]...)
			return true
		}
	}
	return false
}

func (s *Server) endInterruptible(unique uint64) {
	s.mu.Lock()
	delete(s.intr, unique)
	s.mu.Unlock()
}

// interrupt cancels request unique (the kernel sent FUSE_INTERRUPT).
// An INTERRUPT comes through /dev/fuse, its request may come through a
// ring, whose thread may not have taken it yet: an interrupt of a request
// not known is kept (the last maxEarly of them), and the request starts
// interrupted when it comes. Without that, a port read whose caller was
// killed would wait for a message and hand it to the dead caller. (A
// kept interrupt of a request already answered, or of one served on the
// ring's thread, which is not interruptible, is never claimed; it ages
// out.)
func (s *Server) interrupt(unique uint64) {
	s.mu.Lock()
	if ch, ok := s.intr[unique]; ok {
		close(ch)
		delete(s.intr, unique)
	} else {
		if len(s.early) == maxEarly {
			s.early = s.early[1:]
		}
		s.early = append(s.early, unique)
	}
	s.mu.Unlock()
}

// cancelAll interrupts every interruptible request (the mount is gone).
func (s *Server) cancelAll() {
	s.mu.Lock()
	s.closing = true
	for u, ch := range s.intr {
		close(ch)
		delete(s.intr, u)
	}
	s.mu.Unlock()
}

// Stats returns what the server did so far.
func (s *Server) Stats() Stats {
	st := Stats{Transport: "dev", Why: s.why, DevRequests: s.devReqs.Load(), RingRequests: s.ringReqs.Load(),
		RingAsync: s.ringAsync.Load(), RingPending: s.ringPending.Load(), FallbackCopies: s.fbCopies.Load(), FallbackBytes: s.fbBytes.Load(),
		RingReregistered: s.ringReregistered.Load(), Stalls: s.stalls.Load()}
	if s.uring && len(s.queues) > 0 {
		st.Transport, st.Why = "io_uring", ""
		st.Queues, st.EntriesPerQueue = s.cpus, s.entries
	}
	return st
}

// Unmount unmounts the file system and waits until the server stopped.
func (s *Server) Unmount() error {
	var err error
	for range 3 {
		err = unix.Unmount(s.dir, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", s.dir, err)
	}
	s.Wait()
	return nil
}

// Wait returns once the mount is gone and every request is answered.
func (s *Server) Wait() {
	s.waitOnce.Do(func() {
		go func() {
			s.wg.Wait()
			if s.o.Notifier != nil {
				s.o.Notifier.fd.Store(-1)
			}
			unix.Close(s.fd)
			s.fs.OnUnmount()
			close(s.done)
		}()
	})
	<-s.done
}

// warm has the kernel write every page of b once (reads of /dev/zero)
// before any request can land there. On the VMs krfs is measured on, the
// first time a page is written through the kernel costs far more than
// later writes (the hypervisor maps it): a 1 MiB READ landing in an
// entry's buffer for the first time took 2-3 ms more, which the
// serverless hand-off of a 1 MiB object paid on most hand-offs (0.94-1.05x
// TCP against 0.51-0.67x warmed). The buffers are then resident from the
// mount on; they count in the daemon's memory either way.
func warm(b []byte) {
	f, err := os.Open("/dev/zero")
	if err != nil {
		return // unwarmed buffers only cost their first use more
	}
	defer f.Close()
	for off := 0; off < len(b); {
		n, err := f.Read(b[off:min(len(b), off+1<<20)])
		if err != nil || n == 0 {
			return
		}
		off += n
	}
}

// pageAligned returns n zeroed bytes that start on a page boundary.
func pageAligned(n int) []byte {
	page := os.Getpagesize()
	b := make([]byte, n+page-1)
	off := (page - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(page))) % page
	return b[off : off+n : off+n]
}

// possibleCPUs is the number of CPUs the kernel gives a FUSE ring queue
// each (/sys/devices/system/cpu/possible: "0-N").
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	return parseCPUList(string(b))
}

// parseCPUList returns 1 + the highest CPU of a list like "0-3,5".
func parseCPUList(list string) (int, error) {
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(list), ",") {
		_, hi, found := strings.Cut(part, "-")
		if !found {
			hi = part
		}
		h, err := strconv.Atoi(hi)
		if err != nil || h < 0 {
			return 0, fmt.Errorf("CPU list %q: want N or N-M, comma-separated", list)
		}
		n = max(n, h+1)
	}
	return n, nil
}

// entriesPerQueue sizes the queues: RingBytes / (CPUs * payload), within
// [MinEntriesPerQueue, MaxEntriesPerQueue].
func entriesPerQueue(ringBytes, cpus, payload int) int {
	return min(MaxEntriesPerQueue, max(MinEntriesPerQueue, ringBytes/(cpus*payload)))
}

// startQueues starts the rings and waits until every one registered its
// entries: from then on the kernel uses them. Each possible CPU's queue
// gets s.entries entries, each on a thread of its own pinned to that CPU
// with its own ring: the kernel gives a request to a free entry of the
// caller's CPU, so a request that blocks (a slow peer) holds one thread,
// not the queue, and every request is still answered on the thread it
// arrived on.
func (s *Server) startQueues() error {
	cpus, err := possibleCPUs()
	if err != nil {
		return err
	}
	s.entries = entriesPerQueue(s.o.RingBytes, cpus, s.payload)
	// The payload buffers are ordinary Go memory, page-aligned (the GC
	// never moves it, and does not scan bytes): it outlives the rings
	// for whoever registered it (ReplyMemory), so that a NIC writing late
	// into a buffer never meets an unmapped page.
	s.slab = pageAligned(cpus * s.entries * s.payload)
	warm(s.slab)
	if s.o.ReplyMemory != nil {
		if err := s.o.ReplyMemory(s.slab); err != nil {
			s.logf("FUSE ring payload buffers not registered (%v): READ replies are copied into them", err)
		}
	}
	ready := make(chan error, cpus*s.entries)
	var qs []*queue
	ept := min(max(s.o.EntriesPerThread, 1), s.entries)
	k := 0
	for cpu := range cpus {
		for e := 0; e < s.entries; e += ept {
			n := min(ept, s.entries-e)
			q := &queue{s: s, qid: cpu, n: n, pays: s.slab[k*s.payload : (k+n)*s.payload : (k+n)*s.payload]}
			k += n
			qs = append(qs, q)
			s.wg.Add(1)
			go q.run(ready)
		}
	}
	var first error
	for range qs {
		if err := <-ready; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	s.queues = qs
	s.cpus = cpus
	return nil
}
