package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/krfs/krfs/fs"
)

// fuse_noop is the FUSE baseline: pread of a file served from memory by a
// go-fuse filesystem that does nothing else, mounted by the bench process
// itself with the options krfs uses (direct_io, MaxWrite fs.MaxIO). A
// krfs pread costs at least this plus one network round trip.

type noopFile struct {
	gofs.Inode
	data []byte
}

var (
	_ gofs.NodeOpener    = (*noopFile)(nil)
	_ gofs.NodeReader    = (*noopFile)(nil)
	_ gofs.NodeGetattrer = (*noopFile)(nil)
)

func (f *noopFile) Open(context.Context, uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

func (f *noopFile) Read(_ context.Context, _ gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(f.data)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(f.data)))
	return fuse.ReadResultData(f.data[off:end]), 0
}

func (f *noopFile) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o644
	out.Size = uint64(len(f.data))
	return 0
}

type noopRoot struct {
	gofs.Inode
	size int
}

func (r *noopRoot) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, &noopFile{data: make([]byte, r.size)}, gofs.StableAttr{Mode: syscall.S_IFREG})
	r.AddChild("f", ch, false)
}

// mountNoop mounts the no-op filesystem with one file of size bytes and
// returns the file's path and an unmount function.
func mountNoop(size int) (string, func(), error) {
	if os.Geteuid() != 0 {
		return "", nil, errors.New("fuse_noop_lat mounts a FUSE filesystem: run it as root")
	}
	dir, err := os.MkdirTemp("", "krfs-bench-noop")
	if err != nil {
		return "", nil, err
	}
	long := time.Hour
	srv, err := gofs.Mount(dir, &noopRoot{size: size}, &gofs.Options{
		EntryTimeout: &long, AttrTimeout: &long, NegativeTimeout: &long,
		MountOptions: fuse.MountOptions{FsName: NoopFsName(), Name: "krfs-bench-noop", MaxWrite: fs.MaxIO,
			DirectMountStrict: true, DisableXAttrs: true,
			// Same options as krfs's mount; go-fuse's complaint that a
			// 1 MiB reply does not fit a pipe (it falls back to a copy)
			// would flood the output.
			Logger: log.New(io.Discard, "", 0)},
	})
	if err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("mounting the no-op FUSE filesystem: %w", err)
	}
	return filepath.Join(dir, "f"), func() {
		if srv.Unmount() != nil {
			_ = syscall.Unmount(dir, syscall.MNT_DETACH)
		}
		os.Remove(dir)
	}, nil
}

// NoopFsName is the source name fuse_noop_lat's mount shows in the mount
// table: it carries the pid, so that a process can tell its own mount from
// another's.
func NoopFsName() string { return fmt.Sprintf("krfs-bench-noop-%d", os.Getpid()) }
