package fuseserve

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring ABI (include/uapi/linux/io_uring.h), the parts used here.
const (
	setupSQE128   = 1 << 10 // 128-byte SQEs: URING_CMD carries an 80-byte command
	setupCQSize   = 1 << 3
	featSingleMap = 1 << 0

	enterGetEvents = 1 << 0

	registerFiles = 2

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	iouRead     = 22
	iouURingCmd = 46

	sqeFixedFile = 1 << 0

	sqeSize = 128
	cqeSize = 16
)

// ringParams is struct io_uring_params.
type ringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

// ring is one io_uring with 128-byte SQEs, used by one thread only.
type ring struct {
	fd       int
	sqMem    []byte
	cqMem    []byte // aliases sqMem with a single mmap
	sqes     []byte
	sqHead   *uint32
	sqTail   *uint32
	sqMask   uint32
	sqArray  unsafe.Pointer
	cqHead   *uint32
	cqTail   *uint32
	cqMask   uint32
	cqes     unsafe.Pointer
	tail     uint32 // local SQ tail, published by submit
	pending  uint32 // SQEs queued since the last submit
	sqSize   uint32
	released bool
}

// cqe is struct io_uring_cqe.
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

func newRing(entries uint32) (*ring, error) {
	var p ringParams
	p.flags = setupSQE128 | setupCQSize
	p.cqEntries = entries * 2
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ring{fd: int(fd), sqSize: p.sqEntries}
	fail := func(err error) (*ring, error) {
		r.close()
		return nil, err
	}
	sqLen := int(p.sqOff.array + p.sqEntries*4)
	cqLen := int(p.cqOff.cqes + p.cqEntries*cqeSize)
	if p.features&featSingleMap != 0 {
		sqLen = max(sqLen, cqLen)
	}
	var err error
	r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fail(fmt.Errorf("mmap of the SQ ring: %w", err))
	}
	r.cqMem = r.sqMem
	if p.features&featSingleMap == 0 {
		r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fail(fmt.Errorf("mmap of the CQ ring: %w", err))
		}
	}
	r.sqes, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fail(fmt.Errorf("mmap of the SQEs: %w", err))
	}
	sq, cq := unsafe.Pointer(&r.sqMem[0]), unsafe.Pointer(&r.cqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.sqOff.ringMask))
	r.sqArray = unsafe.Add(sq, p.sqOff.array)
	r.cqHead = (*uint32)(unsafe.Add(cq, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.cqOff.ringMask))
	r.cqes = unsafe.Add(cq, p.cqOff.cqes)
	r.tail = atomic.LoadUint32(r.sqTail)
	return r, nil
}

// registerFile registers fd as the ring's fixed file 0.
func (r *ring) registerFile(fd int) error {
	fds := [1]int32{int32(fd)}
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerFiles, uintptr(unsafe.Pointer(&fds[0])), 1, 0, 0)
	if errno != 0 {
		return fmt.Errorf("io_uring_register(files): %w", errno)
	}
	return nil
}

// sqe returns the next free SQE, zeroed, or nil when the SQ is full
// (submit first).
func (r *ring) sqe() []byte {
	head := atomic.LoadUint32(r.sqHead)
	if r.tail-head >= r.sqSize {
		return nil
	}
	idx := r.tail & r.sqMask
	s := r.sqes[int(idx)*sqeSize : int(idx+1)*sqeSize]
	clear(s)
	*(*uint32)(unsafe.Add(r.sqArray, idx*4)) = idx
	r.tail++
	r.pending++
	return s
}

// enter publishes the queued SQEs and, with wait, blocks until a
// completion is there. A signal (Go preempts locked threads) retries.
// SQEs the kernel did not take yet stay queued for the next call.
func (r *ring) enter(wait bool) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	var flags, minDone uintptr
	if wait {
		flags, minDone = enterGetEvents, 1
	}
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.pending), minDone, flags, 0, 0)
		r.pending = r.tail - atomic.LoadUint32(r.sqHead)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
}

// peek returns the oldest completion, if any; call advance after using it.
func (r *ring) peek() (cqe, bool) {
	head := atomic.LoadUint32(r.cqHead)
	if head == atomic.LoadUint32(r.cqTail) {
		return cqe{}, false
	}
	c := *(*cqe)(unsafe.Add(r.cqes, (head&r.cqMask)*cqeSize))
	return c, true
}

func (r *ring) advance() {
	atomic.StoreUint32(r.cqHead, atomic.LoadUint32(r.cqHead)+1)
}

func (r *ring) close() {
	if r.released {
		return
	}
	r.released = true
	if r.sqes != nil {
		_ = unix.Munmap(r.sqes)
	}
	if len(r.cqMem) > 0 && len(r.sqMem) > 0 && &r.cqMem[0] != &r.sqMem[0] {
		_ = unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		_ = unix.Munmap(r.sqMem)
	}
	_ = unix.Close(r.fd)
}

// putU8/putU16/putU32/putU64 write SQE fields (x86-64 and arm64 are
// little-endian; so is the io_uring ABI on them).
func putU8(b []byte, off int, v uint8)   { b[off] = v }
func putU16(b []byte, off int, v uint16) { *(*uint16)(unsafe.Pointer(&b[off])) = v }
func putU32(b []byte, off int, v uint32) { *(*uint32)(unsafe.Pointer(&b[off])) = v }
func putU64(b []byte, off int, v uint64) { *(*uint64)(unsafe.Pointer(&b[off])) = v }
