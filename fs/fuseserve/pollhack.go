package fuseserve

import (
	"path/filepath"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A Go program that opens a file of a mount it serves itself (tests do)
// can deadlock: the runtime registers every opened file with its
// netpoller, and epoll_ctl on a FUSE file sends a POLL request while its
// thread holds a P; with every P held that way no thread is left to
// answer. krfs answers POLL with ENOSYS, after which the kernel stops
// asking, so Mount makes the kernel learn that at once: it polls a hidden
// file at the root that the transport itself serves (go-fuse's server
// does the same for the dev transport). A file system that is a Poller
// answers POLL itself, and Mount then leaves the kernel asking.
const (
	pollHackName = ".krfs-poll-probe"
	pollHackNode = ^uint64(0) - 1
)

// pollHack answers r if it is about the hidden file.
func pollHack(r *request) (n int, st fuse.Status, handled bool) {
	h := r.header()
	switch {
	case h.Opcode == opLookup && h.NodeId == fuse.FUSE_ROOT_ID:
		if name, _ := cstring(r.payload); name != pollHackName {
			return 0, 0, false
		}
		out := (*fuse.EntryOut)(r.outStruct(int(unsafe.Sizeof(fuse.EntryOut{}))))
		out.NodeId, out.Ino = pollHackNode, pollHackNode
		out.Mode, out.Nlink = syscall.S_IFREG|0o600, 1
		return int(unsafe.Sizeof(*out)), fuse.OK, true
	case h.NodeId != pollHackNode:
		return 0, 0, false
	}
	switch h.Opcode {
	case opGetattr:
		out := (*fuse.AttrOut)(r.outStruct(int(unsafe.Sizeof(fuse.AttrOut{}))))
		out.Ino, out.Mode, out.Nlink = pollHackNode, syscall.S_IFREG|0o600, 1
		return int(unsafe.Sizeof(*out)), fuse.OK, true
	case opOpen:
		out := (*fuse.OpenOut)(r.outStruct(int(unsafe.Sizeof(fuse.OpenOut{}))))
		out.OpenFlags = fuse.FOPEN_DIRECT_IO
		return int(unsafe.Sizeof(*out)), fuse.OK, true
	case opRelease, opFlush, opForget:
		return 0, fuse.OK, true
	}
	return 0, fuse.ENOSYS, true
}

// probePoll polls the hidden file once, from a system call that lets the
// runtime run the server meanwhile.
func (s *Server) probePoll() {
	fd, err := unix.Open(filepath.Join(s.dir, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		s.logf("FUSE poll probe: %v", err)
		return
	}
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
	unix.Close(fd)
}
