package fuseserve

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FUSE's ring commands (enum fuse_uring_cmd).
const (
	cmdRegister       = 1
	cmdCommitAndFetch = 2
)

// An entry's header area is struct fuse_uring_req_header: in_out (the
// fuse_in_header of a request, the fuse_out_header of a reply), op_in
// (the request's first argument) and fuse_uring_ent_in_out.
const (
	hdrInOut     = 0
	hdrOpIn      = 128
	hdrCommitID  = 264
	hdrPayloadSz = 272
	hdrSize      = 288
	// entStride is an entry's share of the header block: its header
	// and, at entIov, its two iovecs.
	entStride = 512
	entIov    = 384
)

// eventTag is the user_data of the eventfd read that wakes a queue
// when a request served off its thread is answered.
const eventTag = ^uint64(0)

// queue is the ring of one CPU: a goroutine locked to a thread pinned to
// that CPU registers the entries and serves every request the kernel puts
// in them on that thread (the kernel completes a fetch on the thread that
// submitted it; a hop to another thread costs more than the request).
type queue struct {
	s     *Server
	qid   int // the CPU
	n     int // entries of this thread
	r     *ring
	mem   []byte // headers and iovecs; never seen by the GC
	hdrs  []byte
	pays  []byte // the entries' payload buffers, a part of Server.slab
	evfd  int
	evbuf []byte // 8 bytes of mem
	live  int    // entries the kernel still has or will get back
	// retries, entRetries and evRetries count consecutive failures of
	// io_uring_enter, of an entry's command and of the eventfd read.
	retries, entRetries, evRetries int
	early                          []cqe // completions seen during setup, for serve
	in                             [scratchSize / 8]uint64
	// pend holds the READs this thread started and has not answered
	// (PendingRead), oldest first: it serves its other entries meanwhile.
	pend []pendingRead

	mu      sync.Mutex
	done    []completion // answered off the thread, to commit
	pending sync.WaitGroup
}

// pendingRead is a READ in entry ent whose data is on its way.
type pendingRead struct {
	ent    int
	unique uint64
	res    fuse.ReadResult
	dest   []byte
}

// completion is the answer to a request served off the ring's thread.
type completion struct {
	ent    int
	unique uint64
	st     fuse.Status
	n      int
}

func (q *queue) header(i int) []byte  { return q.hdrs[i*entStride : i*entStride+entStride] }
func (q *queue) payload(i int) []byte { p := q.s.payload; return q.pays[i*p : (i+1)*p] }

// run sets the queue up, says so on ready, and serves until the mount is
// gone. The thread stays locked: it exits with the goroutine.
func (q *queue) run(ready chan<- error) {
	defer q.s.wg.Done()
	runtime.LockOSThread()
	if err := q.setup(); err != nil {
		q.teardown()
		ready <- fmt.Errorf("FUSE ring queue %d: %w", q.qid, err)
		return
	}
	ready <- nil
	q.serve()
	q.teardown()
}

func (q *queue) setup() error {
	var set unix.CPUSet
	set.Set(q.qid)
	// A possible CPU that is offline refuses: the queue then runs
	// anywhere (the kernel sends it nothing until the CPU comes up).
	_ = unix.SchedSetaffinity(0, &set)
	n := q.n
	page := os.Getpagesize()
	hdrBytes := (n*entStride + page - 1) / page * page
	var err error
	q.mem, err = unix.Mmap(-1, 0, hdrBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mmap of ring headers: %w", err)
	}
	q.hdrs = q.mem
	q.evbuf = q.hdrs[hdrBytes-8:]
	q.r, err = newRing(uint32(n + 2))
	if err != nil {
		return err
	}
	if err := q.r.registerFile(q.s.fd); err != nil {
		return err
	}
	q.evfd, err = unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		q.evfd = -1
		return fmt.Errorf("eventfd: %w", err)
	}
	for i := range n {
		h := q.header(i)
		iov := (*[2]unix.Iovec)(unsafe.Pointer(&h[entIov]))
		iov[0].Base, iov[0].Len = &h[0], hdrSize
		p := q.payload(i)
		iov[1].Base, iov[1].Len = &p[0], uint64(len(p))
		q.command(i, cmdRegister, 0)
	}
	q.live = n
	q.armEvent()
	if err := q.r.enter(false); err != nil {
		return fmt.Errorf("io_uring_enter(register): %w", err)
	}
	return q.takeSetupCompletions()
}

// takeSetupCompletions looks at what completed while the entries were
// registered. A refused registration completes at once and fails the
// setup. Anything else is kept for serve: once the last queue registered
// the kernel hands requests to the entries at once (those that waited
// for the rings, at mount), and the task work that fills an entry runs
// as this thread returns from io_uring_enter, so a request's completion
// can already be here. Dropping it would leave that request waiting for
// good, its entry out of the queue.
func (q *queue) takeSetupCompletions() error {
	for {
		c, ok := q.r.peek()
		if !ok {
			return nil
		}
		q.r.advance()
		if c.userData != eventTag && c.res < 0 {
			return fmt.Errorf("FUSE_IO_URING_CMD_REGISTER: %w", unix.Errno(-c.res))
		}
		q.early = append(q.early, c)
	}
}

// command queues a ring command for entry i.
func (q *queue) command(i int, op uint32, commitID uint64) {
	sqe := q.r.sqe()
	putU8(sqe, 0, iouURingCmd)
	putU8(sqe, 1, sqeFixedFile)
	putU32(sqe, 4, 0) // fixed file 0: /dev/fuse
	putU32(sqe, 8, op)
	h := q.header(i)
	putU64(sqe, 16, uint64(uintptr(unsafe.Pointer(&h[entIov]))))
	putU32(sqe, 24, 2)
	putU64(sqe, 32, uint64(i))
	putU64(sqe, 56, commitID)
	putU16(sqe, 64, uint16(q.qid))
}

func (q *queue) armEvent() {
	sqe := q.r.sqe()
	putU8(sqe, 0, iouRead)
	putU32(sqe, 4, uint32(q.evfd))
	putU64(sqe, 16, uint64(uintptr(unsafe.Pointer(&q.evbuf[0]))))
	putU32(sqe, 24, 8)
	putU64(sqe, 32, eventTag)
}

// serve waits for completions and handles them until no entry is left.
// A ring that is short of room (EAGAIN, EBUSY: completions waiting to be
// reaped) or memory (ENOMEM) is retried after the completions it holds
// are handled: a queue thread that gave up would take its entries with it
// and leave the requests of its CPU waiting for good.
func (q *queue) serve() {
	early := q.early
	q.early = nil
	for _, c := range early {
		q.complete(c)
	}
	for q.live > 0 {
		// With READs in flight, do not sleep in the ring: answer those
		// that are done, take what arrived, and with nothing else to do
		// wait for the oldest READ (which receives the others' responses
		// too).
		wait := true
		if len(q.pend) > 0 {
			q.answerReady()
			wait = len(q.pend) == 0
		}
		if err := q.r.enter(wait); err != nil {
			if transientEnter(err) && q.retries < maxRetries {
				q.retries++
				q.reap()
				continue
			}
			q.s.logf("FUSE ring queue %d: io_uring_enter: %v", q.qid, err)
			q.answerAll()
			return
		}
		q.retries = 0
		if q.reap() == 0 && !wait {
			// Nothing new: wait for the oldest READ, in slices, so that a
			// slow one (a peer that went silent) does not hold up the
			// requests that arrive meanwhile for more than a slice.
			q.pend[0].res.(PendingRead).Await(awaitSlice)
		}
	}
	q.answerAll()
}

// reap handles every completion the ring holds and returns how many.
func (q *queue) reap() int {
	k := 0
	for {
		c, ok := q.r.peek()
		if !ok {
			return k
		}
		q.r.advance()
		q.complete(c)
		k++
	}
}

// awaitSlice bounds how long a ring thread waits for one of its READs
// before it looks at its ring again.
const awaitSlice = time.Millisecond

// answerReady answers the pending READs whose data is there.
func (q *queue) answerReady() {
	k := 0
	for _, p := range q.pend {
		if p.res.(PendingRead).Ready() {
			q.answer(p)
			continue
		}
		q.pend[k] = p
		k++
	}
	clear(q.pend[k:])
	q.pend = q.pend[:k]
}

// answerOldest waits for the oldest pending READ and answers it.
func (q *queue) answerOldest() {
	p := q.pend[0]
	copy(q.pend, q.pend[1:])
	q.pend[len(q.pend)-1] = pendingRead{}
	q.pend = q.pend[:len(q.pend)-1]
	q.answer(p)
}

// answerAll waits for every pending READ (the mount is going: the NIC
// must be done with the entries' buffers) and answers them.
func (q *queue) answerAll() {
	for len(q.pend) > 0 {
		q.answerOldest()
	}
}

func (q *queue) answer(p pendingRead) {
	n, st := readReply(p.res, fuse.OK, p.dest, q.s)
	q.commit(p.ent, p.unique, st, n)
}

// maxRetries bounds the consecutive failures a queue thread survives (of
// io_uring_enter, of an entry's command, of the eventfd read): a failure
// that does not go away ends the entry rather than spin.
const maxRetries = 8

// transientEnter reports whether io_uring_enter failed for want of room
// or memory, which reaping completions (or time) gives back.
func transientEnter(err error) bool {
	return errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENOMEM)
}

// mountGone reports whether an entry's command failed because the mount
// is gone (unmount, abort, the daemon dying): the entry then ends.
func mountGone(e unix.Errno) bool {
	return e == unix.ENOTCONN || e == unix.ENODEV || e == unix.ECONNABORTED
}

func (q *queue) complete(c cqe) {
	if c.userData == eventTag {
		q.mu.Lock()
		done := q.done
		q.done = nil
		q.mu.Unlock()
		for _, d := range done {
			q.commit(d.ent, d.unique, d.st, d.n)
		}
		// The eventfd read stays armed, also after a failure (a
		// cancelled read): without it answers served off the thread
		// would never be committed.
		if c.res >= 0 || q.evRetries < maxRetries {
			if c.res < 0 {
				q.evRetries++
				q.s.logf("FUSE ring queue %d: eventfd read: %v; reading again", q.qid, unix.Errno(-c.res))
			} else {
				q.evRetries = 0
			}
			q.armEvent()
		}
		return
	}
	i := int(c.userData)
	if c.res < 0 {
		e := unix.Errno(-c.res)
		if mountGone(e) || q.entRetries >= maxRetries {
			if !mountGone(e) {
				q.s.logf("FUSE ring queue %d entry %d: %v; giving the entry up", q.qid, i, e)
			}
			q.live--
			return
		}
		// The kernel refused the entry's command (a commit of a request
		// it no longer knows, ENOENT; a cancelled command): the kernel
		// keeps that entry out of the queue for good, so register the
		// buffers again as a new entry, or the CPU's queue shrinks by
		// one each time until its requests wait forever.
		q.entRetries++
		q.s.ringReregistered.Add(1)
		q.s.logf("FUSE ring queue %d entry %d: %v; registering it again", q.qid, i, e)
		q.command(i, cmdRegister, 0)
		return
	}
	q.entRetries = 0
	r := decodeRing(&q.in, q.header(i), q.payload(i))
	unique := r.header().Unique
	q.s.ringReqs.Add(1)
	q.s.inService.Add(1)
	if q.s.mayBlock(&r) {
		q.async(i, r)
		return
	}
	r.mayDefer = q.n > 1
	n, st := q.s.serve(&r)
	if r.pending != nil {
		in := (*fuse.ReadIn)(r.arg())
		q.pend = append(q.pend, pendingRead{ent: i, unique: unique, res: r.pending, dest: r.out[:in.Size]})
		q.s.ringPending.Add(1)
		return
	}
	q.commit(i, unique, st, n)
}

// decodeRing reads the request in a ring entry's header area h and
// payload buffer p; in receives its header and first argument.
func decodeRing(in *[scratchSize / 8]uint64, h, p []byte) request {
	b := unsafe.Slice((*byte)(unsafe.Pointer(in)), scratchSize)
	copy(b[:inHeaderSize], h[hdrInOut:])
	// op_in holds the first argument's bytes and, past them, whatever an
	// earlier request left: take the argument's size only, as on
	// /dev/fuse.
	arg := argArea
	if op := binary.NativeEndian.Uint32(h[hdrInOut+4:]); op < opCount {
		arg = argSize[op]
	}
	n := copy(b[inHeaderSize:], h[hdrOpIn:hdrOpIn+arg])
	clear(b[inHeaderSize+n:])
	size := int(binary.NativeEndian.Uint32(h[hdrPayloadSz:]))
	return request{in: in, payload: p[:min(size, len(p))], out: p}
}

// async serves r on its own goroutine; the answer comes back through
// the eventfd and is committed on the ring's thread.
func (q *queue) async(i int, r request) {
	in := *r.in
	r.in = &in
	unique := r.header().Unique
	r.cancel = q.s.interruptible(unique)
	q.s.ringAsync.Add(1)
	q.pending.Add(1)
	go func() {
		defer q.pending.Done()
		n, st := q.s.serve(&r)
		q.s.endInterruptible(unique)
		q.mu.Lock()
		q.done = append(q.done, completion{ent: i, unique: unique, st: st, n: n})
		q.mu.Unlock()
		var one [8]byte
		one[0] = 1
		_, _ = unix.Write(q.evfd, one[:])
	}()
}

// commit answers the request in entry i and fetches the next.
func (q *queue) commit(i int, unique uint64, st fuse.Status, n int) {
	q.s.inService.Add(-1)
	h := q.header(i)
	if st != fuse.OK {
		n = 0
	}
	putU32(h, hdrInOut, uint32(outHeaderSize+n))
	putU32(h, hdrInOut+4, uint32(-int32(st)))
	putU64(h, hdrInOut+8, unique)
	putU32(h, hdrPayloadSz, uint32(n))
	putU64(h, hdrCommitID, unique)
	q.command(i, cmdCommitAndFetch, unique)
}

// teardown waits for the requests served off the thread (the mount is
// gone: their cancel channels are closed) and frees the ring.
func (q *queue) teardown() {
	q.pending.Wait()
	if q.r != nil {
		q.r.close()
	}
	if q.evfd > 0 {
		unix.Close(q.evfd)
	}
	if q.mem != nil {
		_ = unix.Munmap(q.mem)
	}
}
