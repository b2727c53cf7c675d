package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// readOnlyDir refuses every change to a directory's entries with EROFS.
// Embedded in the directories whose entries mirror the cluster (the root,
// peers/ and everything under it): go-fuse answers an unlink or rmdir on a
// directory without an Unlinker or Rmdirer with success and drops the
// entry from its cache, so `rm peers/2/mem` would report 0 and remove
// nothing.
type readOnlyDir struct{}

var (
	_ = (gofs.NodeUnlinker)((*readOnlyDir)(nil))
	_ = (gofs.NodeRmdirer)((*readOnlyDir)(nil))
	_ = (gofs.NodeRenamer)((*readOnlyDir)(nil))
	_ = (gofs.NodeMkdirer)((*readOnlyDir)(nil))
	_ = (gofs.NodeCreater)((*readOnlyDir)(nil))
	_ = (gofs.NodeMknoder)((*readOnlyDir)(nil))
	_ = (gofs.NodeSymlinker)((*readOnlyDir)(nil))
	_ = (gofs.NodeLinker)((*readOnlyDir)(nil))
)

func (readOnlyDir) Unlink(ctx context.Context, name string) syscall.Errno { return syscall.EROFS }
func (readOnlyDir) Rmdir(ctx context.Context, name string) syscall.Errno  { return syscall.EROFS }

func (readOnlyDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EROFS
}

func (readOnlyDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (readOnlyDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}

func (readOnlyDir) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (readOnlyDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (readOnlyDir) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}
