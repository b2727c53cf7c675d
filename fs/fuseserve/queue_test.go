package fuseserve

import (
	"encoding/binary"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// lastSQE returns the opcode and command of the SQE queued last on r.
func lastSQE(r *ring) (opcode uint8, cmdOp uint32, userData uint64) {
	idx := (r.tail - 1) & r.sqMask
	s := r.sqes[int(idx)*sqeSize : int(idx+1)*sqeSize]
	return s[0], binary.LittleEndian.Uint32(s[8:]), binary.LittleEndian.Uint64(s[32:])
}

// testQueue is a queue of one entry on a real ring that is never entered:
// what complete queues can be read back from the SQ.
func testQueue(t *testing.T) *queue {
	t.Helper()
	r, err := newRing(4)
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	t.Cleanup(r.close)
	s := &Server{}
	q := &queue{s: s, qid: 0, n: 1, r: r, live: 1, hdrs: make([]byte, entStride), evbuf: make([]byte, 8)}
	return q
}

// Rule: an entry whose command the kernel refused while the mount is
// alive (ENOENT for a commit it no longer knows) is registered again, so
// the CPU's queue keeps its entries; after maxRetries refusals in a row
// the entry is given up rather than retried forever. At unmount
// (ENOTCONN) the entry just ends.
func TestRefusedEntryIsRegisteredAgain(t *testing.T) {
	q := testQueue(t)
	q.complete(cqe{userData: 0, res: -int32(unix.ENOENT)})
	if q.live != 1 {
		t.Fatalf("live entries %d after a refused commit, want 1", q.live)
	}
	op, cmd, ud := lastSQE(q.r)
	if q.r.pending != 1 || op != iouURingCmd || cmd != cmdRegister || ud != 0 {
		t.Fatalf("queued %d SQEs, last opcode %d cmd %d entry %d; want one REGISTER of entry 0", q.r.pending, op, cmd, ud)
	}
	if got := q.s.Stats().RingReregistered; got != 1 {
		t.Errorf("RingReregistered %d, want 1", got)
	}
	for range maxRetries - 1 {
		q.r.pending, q.r.tail = 0, q.r.tail-1 // as if submitted
		q.complete(cqe{userData: 0, res: -int32(unix.ECANCELED)})
	}
	if q.live != 1 {
		t.Fatalf("live %d after %d refusals, want 1", q.live, maxRetries)
	}
	q.r.pending, q.r.tail = 0, q.r.tail-1
	q.complete(cqe{userData: 0, res: -int32(unix.ECANCELED)})
	if q.live != 0 || q.r.pending != 0 {
		t.Fatalf("after %d refusals in a row: live %d, %d SQEs queued; want the entry given up", maxRetries+1, q.live, q.r.pending)
	}

	q = testQueue(t)
	q.complete(cqe{userData: 0, res: -int32(unix.ENOTCONN)})
	if q.live != 0 || q.r.pending != 0 {
		t.Fatalf("at unmount: live %d, %d SQEs queued; want the entry ended", q.live, q.r.pending)
	}
}

// Rule: the eventfd read that brings answers served off the ring's thread
// is armed again after it completes, also when it failed.
func TestEventReadStaysArmed(t *testing.T) {
	for _, res := range []int32{8, -int32(unix.ECANCELED)} {
		q := testQueue(t)
		q.evfd = 99
		q.complete(cqe{userData: eventTag, res: res})
		op, _, ud := lastSQE(q.r)
		if q.r.pending != 1 || op != iouRead || ud != eventTag {
			t.Errorf("eventfd read completed with %d: %d SQEs queued (opcode %d, tag %x), want it read again", res, q.r.pending, op, ud)
		}
	}
}

// Rule: a completion that arrives while the entries are registered (the
// kernel hands a request that waited for the rings to an entry at once,
// and its task work runs as the thread returns from io_uring_enter) is
// kept for serve, not dropped with the registration's own; a refused
// registration still fails the setup. A NOP stands in for the request's
// completion, a READ of a bad descriptor for a refused registration.
func TestCompletionDuringSetupIsKept(t *testing.T) {
	q := testQueue(t)
	sqe := q.r.sqe()
	putU8(sqe, 0, 0) // IORING_OP_NOP
	putU64(sqe, 32, 0)
	if err := q.r.enter(false); err != nil {
		t.Fatal(err)
	}
	if err := q.takeSetupCompletions(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if len(q.early) != 1 || q.early[0].userData != 0 || q.early[0].res != 0 {
		t.Fatalf("kept %+v, want the entry 0 completion", q.early)
	}

	q = testQueue(t)
	sqe = q.r.sqe()
	putU8(sqe, 0, iouRead)
	putU32(sqe, 4, ^uint32(0)) // fd -1
	putU64(sqe, 32, 0)
	if err := q.r.enter(false); err != nil {
		t.Fatal(err)
	}
	if err := q.takeSetupCompletions(); err == nil {
		t.Fatal("a refused registration did not fail the setup")
	}
}

// Rule: the ring entries' payload buffers are written once before any
// request lands in them (warm), so that a request does not pay for the
// first write of a page: every page of the block is resident after it.
func TestPayloadBuffersAreWarmed(t *testing.T) {
	const size = 4 << 20
	b := pageAligned(size)
	resident := func() int {
		vec := make([]byte, size/os.Getpagesize())
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
		if errno != 0 {
			t.Fatalf("mincore: %v", errno)
		}
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	before := resident()
	warm(b)
	if got, want := resident(), size/os.Getpagesize(); got != want {
		t.Fatalf("%d of %d pages resident after warm (%d before)", got, want, before)
	}
}
