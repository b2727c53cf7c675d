package fs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// File times. krfs keeps them in the daemon's memory (not with the region:
// a restart starts them again at the mount time):
//
//   - regions/<name>: mtime and ctime move on every write, resize and
//     atomic through this mount; ctime also on chmod and chown; utimensat
//     (touch, rsync -t) sets atime and mtime. Writes by peers do not move
//     them: they reach the memory without the daemon.
//   - peers/<gid>/mem and mr/<name>: the time of the last write or atomic
//     through this node to that region, else the mount time; utimensat
//     fails with EPERM (a peer's region has no times this node could set).
//   - ports/<port>: mtime and ctime are the bind time, moved by utimensat.
type fileTimes struct {
	atime, mtime, ctime atomic.Int64 // Unix nanoseconds; 0: the mount time
}

// written records a change of the contents now.
func (t *fileTimes) written(now time.Time) {
	n := now.UnixNano()
	t.mtime.Store(n)
	t.ctime.Store(n)
}

// changed records a change of the attributes now.
func (t *fileTimes) changed(now time.Time) { t.ctime.Store(now.UnixNano()) }

// set applies utimensat's times from in (UTIME_NOW as now); it reports
// whether in carried any.
func (t *fileTimes) set(in *fuse.SetAttrIn, now time.Time) bool {
	a, aok := in.GetATime()
	m, mok := in.GetMTime()
	if !aok && !mok {
		return false
	}
	if aok {
		t.atime.Store(a.UnixNano())
	}
	if mok {
		t.mtime.Store(m.UnixNano())
	}
	t.ctime.Store(now.UnixNano())
	return true
}

// fill writes the times into a (attrFiller puts the mount time in times
// left zero).
func (t *fileTimes) fill(a *fuse.Attr) {
	put := func(ns int64, sec *uint64, nsec *uint32) {
		if ns != 0 {
			*sec, *nsec = uint64(ns/1e9), uint32(ns%1e9)
		}
	}
	m, c := t.mtime.Load(), t.ctime.Load()
	if m == 0 && c == 0 {
		return
	}
	if c == 0 {
		c = m
	}
	if m == 0 {
		m = c
	}
	put(m, &a.Mtime, &a.Mtimensec)
	put(c, &a.Ctime, &a.Ctimensec)
	at := t.atime.Load()
	if at == 0 {
		at = m
	}
	put(at, &a.Atime, &a.Atimensec)
}

// timesTable holds the times of the mount's regions, by name (local
// regions) or gid and name (peers' regions).
type timesTable struct {
	mu    sync.Mutex
	local map[string]*fileTimes
	peer  map[peerRegion]*fileTimes
}

type peerRegion struct {
	gid  uint32
	name string
}

func (tt *timesTable) localTimes(name string) *fileTimes {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if tt.local == nil {
		tt.local = map[string]*fileTimes{}
	}
	t := tt.local[name]
	if t == nil {
		t = &fileTimes{}
		tt.local[name] = t
	}
	return t
}

// dropLocal forgets a removed region's times.
func (tt *timesTable) dropLocal(name string) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	delete(tt.local, name)
}

func (tt *timesTable) peerTimes(gid uint32, name string) *fileTimes {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if tt.peer == nil {
		tt.peer = map[peerRegion]*fileTimes{}
	}
	k := peerRegion{gid, name}
	t := tt.peer[k]
	if t == nil {
		t = &fileTimes{}
		tt.peer[k] = t
	}
	return t
}

// statfs answers statfs (df) for every file of the mount: blocks of 4 KiB,
// the capacity of the region store, the regions' sizes as used, and
// regions as inodes.
func (m *mount) statfs(out *fuse.StatfsOut) syscall.Errno {
	const bsize = 4096
	var used int64
	rs := m.b.Regions()
	for _, r := range rs {
		used += r.Size
	}
	total, free, maxRegions := used, int64(0), len(rs)
	if c, ok := m.b.(CapacityReporter); ok {
		var err error
		if total, free, maxRegions, err = c.Capacity(); err != nil {
			m.logf("statfs: %v", err)
			return errno(err)
		}
	}
	blocks := (total + bsize - 1) / bsize
	usedBlocks := min((used+bsize-1)/bsize, blocks)
	out.Bsize, out.Frsize, out.NameLen = bsize, bsize, 32
	out.Blocks = uint64(blocks)
	out.Bfree = uint64(blocks - usedBlocks)
	out.Bavail = uint64(min(blocks-usedBlocks, free/bsize))
	out.Files = uint64(max(maxRegions, len(rs)))
	out.Ffree = uint64(max(maxRegions-len(rs), 0))
	return 0
}

var (
	_ = (gofs.NodeStatfser)((*root)(nil))
	_ = (gofs.NodeStatfser)((*regionsDir)(nil))
	_ = (gofs.NodeStatfser)((*localRegionFile)(nil))
)

func (r *root) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return r.m.statfs(out)
}
func (d *peersDir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.m.statfs(out)
}
func (d *peerDir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.m.statfs(out)
}
func (d *peerMRDir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.m.statfs(out)
}
func (f *remoteFile) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return f.m.statfs(out)
}
func (d *peerPortsDir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.m.statfs(out)
}
func (f *peerPortFile) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return f.m.statfs(out)
}
func (f *textFile) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return f.m.statfs(out)
}
func (d *regionsDir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.m.statfs(out)
}
func (f *localRegionFile) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return f.m.statfs(out)
}
func (d *portsDir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.m.statfs(out)
}
func (f *localPortFile) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return f.m.statfs(out)
}
