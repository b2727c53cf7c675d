package fs

import (
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
)

// notifier tells the kernel that something it cached is no longer true.
// Every notification the filesystem sends goes through the mount's
// notifier, so that a FUSE transport other than go-fuse's server can route
// them; goFuseNotifier sends them through go-fuse.
type notifier interface {
	// Entry: name under dir no longer means what the kernel cached (the
	// kernel looks it up again on next use).
	Entry(dir *gofs.Inode, name string) syscall.Errno
}

// goFuseNotifier sends notifications through the go-fuse server that
// serves the inodes.
type goFuseNotifier struct{}

func (goFuseNotifier) Entry(dir *gofs.Inode, name string) syscall.Errno {
	return dir.NotifyEntry(name)
}

// notify returns the mount's notifier.
func (m *mount) notify() notifier {
	if m.notifier != nil {
		return m.notifier
	}
	return goFuseNotifier{}
}

// forget drops name from dir's children and from the kernel's cache: a
// region removed by the filesystem itself, not by an unlink.
func (m *mount) forget(dir *gofs.Inode, name string) {
	dir.RmChild(name)
	if e := m.notify().Entry(dir, name); e != 0 && e != syscall.ENOENT {
		m.logf("invalidating the kernel's entry of %s: %v", name, e)
	}
}
