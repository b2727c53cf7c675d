package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
)

// What POSIX tools expect of files, beyond read and write.

// syncNode answers fsync, fdatasync and a directory's fsync with success:
// a write through the mount is complete when write() returns (a local
// region's bytes are in its memory; a peer's WRITE was acknowledged by the
// peer, no post is outstanding), so there is nothing left to flush.
// Embedded in every node type.
type syncNode struct{}

var (
	_ = (gofs.NodeFsyncer)((*syncNode)(nil))
)

func (syncNode) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno { return 0 }
