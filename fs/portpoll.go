package fs

import (
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/krfs/krfs/fs/fuseserve"
)

// Polling ports (Options.Poll, on krfs's own FUSE transport): the kernel
// sends FUSE_POLL for a file that poll, select or epoll watch, naming
// the file by the handle go-fuse's bridge gave its open. portPolls learns
// which handles are ports when they are opened: localPortFile.Open and
// portsDir.Create return, in bits 16-31 of the open flags (which no
// FOPEN_ flag uses), the number of the port handle they made, and
// pollingFS takes it out of the flags before the kernel sees them and
// files the port handle under the bridge's handle, until release. A
// port handle is ready when a message is queued, when its next read
// returns 0 (see localPortFile.Read) or when the port is unbound; the
// kernel's wake-up handle (kh) is kept with the port until a message
// comes, and then woken with FUSE_NOTIFY_POLL. Every other file is
// always ready, as without Poll.
type portPolls struct {
	n *fuseserve.Notifier

	mu      sync.Mutex
	next    uint32
	pending map[uint32]*portHandle // opens in progress, by number
	handles map[uint64]*portHandle // by the bridge's file handle
}

// openMark is where an open's flags carry a port handle's number.
const (
	openMarkShift = 16
	openMarkMask  = 0xffff << openMarkShift
)

func newPortPolls(n *fuseserve.Notifier) *portPolls {
	return &portPolls{n: n, pending: map[uint32]*portHandle{}, handles: map[uint64]*portHandle{}}
}

// open numbers port handle h, opened by the request in progress, and
// returns the number shifted into the open flags (0 without Poll).
func (p *portPolls) open(h *portHandle) uint32 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for range 1 << 16 {
		p.next = (p.next + 1) & 0xffff
		if p.next != 0 && p.pending[p.next] == nil {
			p.pending[p.next] = h
			return p.next << openMarkShift
		}
	}
	return 0 // 65,535 opens in progress: this one is not polled
}

// opened files the port handle numbered in *flags, if any, under the
// bridge's handle fh, and clears the number from *flags.
func (p *portPolls) opened(st fuse.Status, flags *uint32, fh uint64) {
	id := *flags >> openMarkShift
	*flags &^= openMarkMask
	if id == 0 {
		return
	}
	p.mu.Lock()
	if h := p.pending[id]; h != nil {
		delete(p.pending, id)
		if st == fuse.OK {
			p.handles[fh] = h
		}
	}
	p.mu.Unlock()
}

// pollers holds the kernel's wake-up handles of one port.
type pollers struct {
	mu  sync.Mutex
	khs map[uint64]struct{}
}

func (w *pollers) add(kh uint64) {
	w.mu.Lock()
	if w.khs == nil {
		w.khs = map[uint64]struct{}{}
	}
	w.khs[kh] = struct{}{}
	w.mu.Unlock()
}

// wake sends each waiting poller its wake-up, once.
func (w *pollers) wake(n *fuseserve.Notifier) {
	w.mu.Lock()
	khs := w.khs
	w.khs = nil
	w.mu.Unlock()
	for kh := range khs {
		n.PollWakeup(kh)
	}
}

// pollingFS answers FUSE_POLL (fuseserve.Poller) for the tree it wraps.
type pollingFS struct {
	fuse.RawFileSystem
	p *portPolls
}

var _ fuseserve.Poller = pollingFS{}

func (f pollingFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := f.RawFileSystem.Open(cancel, in, out)
	f.p.opened(st, &out.OpenFlags, out.Fh)
	return st
}

func (f pollingFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	st := f.RawFileSystem.Create(cancel, in, name, out)
	f.p.opened(st, &out.OpenFlags, out.Fh)
	return st
}

func (f pollingFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	f.p.mu.Lock()
	delete(f.p.handles, in.Fh) // before the bridge may give fh out again
	f.p.mu.Unlock()
	f.RawFileSystem.Release(cancel, in)
}

const (
	pollIn  = 0x1 | 0x40           // POLLIN | POLLRDNORM
	pollAll = pollIn | 0x4 | 0x100 // and POLLOUT | POLLWRNORM
	pollErr = 0x8
)

func (f pollingFS) Poll(cancel <-chan struct{}, h *fuse.InHeader, in *fuseserve.PollIn, out *fuseserve.PollOut) fuse.Status {
	f.p.mu.Lock()
	ph := f.p.handles[in.Fh]
	f.p.mu.Unlock()
	if ph == nil {
		out.Revents = in.Events & pollAll
		return fuse.OK
	}
	bp := ph.port
	if in.Flags&fuseserve.PollScheduleNotify != 0 {
		bp.pollers.add(in.Kh) // before looking: a message that comes after the look wakes it
	}
	switch {
	case bp.gone.Load():
		out.Revents = in.Events&pollIn | pollErr
	case ph.readable():
		out.Revents = in.Events & pollIn
	}
	return fuse.OK
}

// readable says whether h's next read returns at once: a message is
// queued, or the read returns 0 (its last read returned a message).
func (h *portHandle) readable() bool {
	h.mu.Lock()
	more := h.more
	h.mu.Unlock()
	if more {
		return true
	}
	sp, ok := h.port.Port.(StreamPort)
	return ok && sp.QueuedBytes() > 0
}
