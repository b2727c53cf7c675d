package fs

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
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

// regions/ holds regions only: no links, symlinks, device nodes, FIFOs or
// directories (EPERM, what Linux tools expect of a filesystem that does
// not support a kind of file).
var (
	_ = (gofs.NodeLinker)((*regionsDir)(nil))
	_ = (gofs.NodeSymlinker)((*regionsDir)(nil))
	_ = (gofs.NodeMknoder)((*regionsDir)(nil))
	_ = (gofs.NodeMkdirer)((*regionsDir)(nil))
)

func (d *regionsDir) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *regionsDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *regionsDir) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *regionsDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// fallocate: mode 0 (posix_fallocate) makes sure [off, off+size) is
// backed. Every byte of a region is reserved already, so inside the
// region it succeeds at once; past the end it grows a region of regions/
// (as truncate would) and fails with EFBIG on a file of fixed size (a
// peer's region, regions/mem). Any other mode (KEEP_SIZE, PUNCH_HOLE,
// ZERO_RANGE...) is EOPNOTSUPP. glibc's posix_fallocate falls back to
// writing a byte per block only on EOPNOTSUPP for mode 0, which this never
// returns.
var (
	_ = (gofs.NodeAllocater)((*localRegionFile)(nil))
	_ = (gofs.NodeAllocater)((*remoteFile)(nil))
)

func (f *localRegionFile) Allocate(ctx context.Context, fh gofs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if mode != 0 {
		return syscall.EOPNOTSUPP
	}
	r, e := f.region()
	if e != 0 {
		return e
	}
	info := r.Info()
	end := off + size
	if end < off || end > 1<<62 {
		return syscall.EFBIG
	}
	if int64(end) <= info.Size {
		return 0
	}
	if f.name == "mem" {
		return syscall.EFBIG
	}
	return f.resize(fh, info, int64(end), "fallocate")
}

func (f *remoteFile) Allocate(ctx context.Context, fh gofs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if mode != 0 {
		return syscall.EOPNOTSUPP
	}
	var cur fuse.AttrOut
	if e := f.Getattr(ctx, fh, &cur); e != 0 {
		return e
	}
	if end := off + size; end < off || end > cur.Size {
		return syscall.EFBIG // a peer's region keeps its size
	}
	return 0
}

// redactRKeys removes every "rkey" member (any case) from a JSON document:
// a region's rkey is the key that lets a peer's NIC at its memory, and
// stats.json is readable by every local user of the mount.
func redactRKeys(b []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // counters stay exact
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if strings.EqualFold(k, "rkey") {
					delete(v, k)
					continue
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	var out bytes.Buffer
	e := json.NewEncoder(&out)
	e.SetIndent("", "  ")
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
