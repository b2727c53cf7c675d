package fuseserve

import (
	"sync/atomic"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Notifier sends a file system's notifications (invalidations) to the
// kernel through /dev/fuse, where the kernel takes them on every
// transport. It implements go-fuse's fs.ServerCallbacks: give it to
// fs.NewNodeFS in fs.Options.ServerCallbacks, and the tree's
// Inode.NotifyEntry, NotifyContent and NotifyDelete reach the kernel.
// Before the mount and after it, a notification fails with ENOTCONN.
type Notifier struct {
	fd atomic.Int64
}

// NewNotifier returns a Notifier to hand to Mount in Options.Notifier.
func NewNotifier() *Notifier {
	n := &Notifier{}
	n.fd.Store(-1)
	return n
}

// Notification codes (enum fuse_notify_code).
const (
	notifyPoll       = 1
	notifyInvalInode = 2
	notifyInvalEntry = 3
	notifyDelete     = 6
)

func (n *Notifier) send(code int32, body []byte) fuse.Status {
	fd := int(n.fd.Load())
	if fd < 0 {
		return fuse.Status(unix.ENOTCONN)
	}
	var hdr [outHeaderSize]byte
	putU32(hdr[:], 0, uint32(outHeaderSize+len(body)))
	putU32(hdr[:], 4, uint32(code))
	for {
		_, err := unix.Writev(fd, [][]byte{hdr[:], body})
		switch err {
		case nil:
			return fuse.OK
		case unix.EINTR:
			continue
		}
		return fuse.ToStatus(err)
	}
}

// nameBody is a notification's fixed part (fixed bytes) followed by name
// and its NUL.
func nameBody(fixed int, name string) []byte {
	b := make([]byte, fixed+len(name)+1)
	copy(b[fixed:], name)
	return b
}

// EntryNotify invalidates the kernel's entry name in directory parent.
func (n *Notifier) EntryNotify(parent uint64, name string) fuse.Status {
	b := nameBody(16, name)
	putU64(b, 0, parent)
	putU32(b, 8, uint32(len(name)))
	return n.send(notifyInvalEntry, b)
}

// DeleteNotify tells the kernel that name in parent, inode child, is gone.
func (n *Notifier) DeleteNotify(parent uint64, child uint64, name string) fuse.Status {
	b := nameBody(24, name)
	putU64(b, 0, parent)
	putU64(b, 8, child)
	putU32(b, 16, uint32(len(name)))
	return n.send(notifyDelete, b)
}

// InodeNotify invalidates the kernel's attributes of node and its cached
// data from off for length bytes (length < 0: to the end; off < 0: none).
func (n *Notifier) InodeNotify(node uint64, off int64, length int64) fuse.Status {
	b := make([]byte, 24)
	putU64(b, 0, node)
	putU64(b, 8, uint64(off))
	putU64(b, 16, uint64(length))
	return n.send(notifyInvalInode, b)
}

// PollWakeup tells the kernel that the file it polled with handle kh
// (PollIn.Kh) may be ready: its pollers poll again.
func (n *Notifier) PollWakeup(kh uint64) fuse.Status {
	b := make([]byte, 8)
	putU64(b, 0, kh)
	return n.send(notifyPoll, b)
}

// InodeRetrieveCache is not supported: krfs caches no file data in the
// kernel.
func (n *Notifier) InodeRetrieveCache(node uint64, offset int64, dest []byte) (int, fuse.Status) {
	return 0, fuse.ENOSYS
}

// InodeNotifyStoreCache is not supported (see InodeRetrieveCache).
func (n *Notifier) InodeNotifyStoreCache(node uint64, offset int64, data []byte) fuse.Status {
	return fuse.ENOSYS
}
