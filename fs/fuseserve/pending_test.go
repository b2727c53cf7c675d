package fuseserve_test

import (
	"bytes"
	"context"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/krfs/krfs/fs/fuseserve"
	"github.com/krfs/krfs/internal/fusetest"
)

// laterFile answers a read with a fuseserve.PendingRead whose bytes a
// goroutine writes into dest a little later, as a NIC would.
type laterFile struct {
	gofs.Inode
	started, maxPending, pending atomic.Int64
	// hold, if set, holds the READ at offset 0 until it is closed.
	hold chan struct{}
}

func (f *laterFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode, out.Size = 0o644, 1<<20
	return 0
}

func (f *laterFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *laterFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.started.Add(1)
	p := f.pending.Add(1)
	for {
		m := f.maxPending.Load()
		if p <= m || f.maxPending.CompareAndSwap(m, p) {
			break
		}
	}
	r := &laterRead{f: f, dest: dest, done: make(chan struct{})}
	arrive := func() {
		for i := range dest {
			dest[i] = byte(off>>9) ^ byte(i)
		}
		r.ready.Store(true)
		close(r.done)
	}
	if off == 0 && f.hold != nil {
		go func() {
			<-f.hold
			arrive()
		}()
		return r, 0
	}
	time.AfterFunc(time.Duration(off%7)*100*time.Microsecond, arrive)
	return r, 0
}

type laterRead struct {
	f     *laterFile
	dest  []byte
	ready atomic.Bool
	done  chan struct{}
	once  sync.Once
}

func (r *laterRead) Ready() bool { return r.ready.Load() }
func (r *laterRead) Await(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.done:
		return true
	case <-t.C:
		return false
	}
}
func (r *laterRead) Size() int { return len(r.dest) }
func (r *laterRead) Bytes([]byte) ([]byte, fuse.Status) {
	<-r.done
	return r.dest, fuse.OK
}
func (r *laterRead) Done() {
	<-r.done
	r.once.Do(func() { r.f.pending.Add(-1) })
}

var _ fuseserve.PendingRead = (*laterRead)(nil)

type laterDir struct {
	gofs.Inode
	f *laterFile
}

func (d *laterDir) OnAdd(ctx context.Context) {
	d.AddChild("later", d.NewPersistentInode(ctx, d.f, gofs.StableAttr{Mode: syscall.S_IFREG}), false)
}

// TestPendingReadsAnswered: a ring thread with several entries answers
// READs whose data arrives after the handler returned (PendingRead), each
// with its own bytes, while it serves its other entries; with one entry
// per thread every READ is answered before the next is taken.
func TestPendingReadsAnswered(t *testing.T) {
	fusetest.RequireURing(t)
	for _, ept := range []int{1, fuseserve.MaxEntriesPerQueue} {
		t.Run(fmt.Sprint("entries per thread ", ept), func(t *testing.T) {
			f := &laterFile{}
			mnt := t.TempDir()
			sec := time.Second
			raw := gofs.NewNodeFS(&laterDir{f: f}, &gofs.Options{EntryTimeout: &sec, AttrTimeout: &sec})
			srv, err := fuseserve.Mount(mnt, raw, fuseserve.Options{Name: "fuseservetest", Mode: fuseserve.Uring, EntriesPerThread: ept})
			if err != nil {
				t.Skipf("FUSE over io_uring: %v", err)
			}
			defer srv.Unmount()
			fd, err := os.Open(filepath.Join(mnt, "later"))
			if err != nil {
				t.Fatal(err)
			}
			defer fd.Close()
			const readers, reads = 16, 40
			var wg sync.WaitGroup
			errs := make(chan error, readers)
			for g := range readers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					buf := make([]byte, 4096)
					for k := range reads {
						off := int64((g*reads + k) * 4096)
						n, err := fd.ReadAt(buf, off)
						if err != nil || n != len(buf) {
							errs <- fmt.Errorf("read at %d: %d, %v", off, n, err)
							return
						}
						want := make([]byte, len(buf))
						for i := range want {
							want[i] = byte(off>>9) ^ byte(i)
						}
						if !bytes.Equal(buf, want) {
							errs <- fmt.Errorf("read at %d: wrong bytes", off)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := f.started.Load(); got != readers*reads {
				t.Fatalf("%d reads reached the file system, want %d", got, readers*reads)
			}
			if st := srv.Stats(); st.FallbackCopies != 0 {
				t.Fatalf("fallback copies %d", st.FallbackCopies)
			}
			t.Logf("at most %d READs pending at once", f.maxPending.Load())
		})
	}
}

// TestSlowPendingReadHoldsNothingUp: a READ whose data does not come
// holds up neither its ring thread's other requests nor itself: a read
// on the same CPU (so the same ring thread) is answered meanwhile.
func TestSlowPendingReadHoldsNothingUp(t *testing.T) {
	fusetest.RequireURing(t)
	f := &laterFile{hold: make(chan struct{})}
	mnt := t.TempDir()
	sec := time.Second
	raw := gofs.NewNodeFS(&laterDir{f: f}, &gofs.Options{EntryTimeout: &sec, AttrTimeout: &sec})
	srv, err := fuseserve.Mount(mnt, raw, fuseserve.Options{Name: "fuseservetest", Mode: fuseserve.Uring, EntriesPerThread: fuseserve.MaxEntriesPerQueue})
	if err != nil {
		t.Skipf("FUSE over io_uring: %v", err)
	}
	defer srv.Unmount()
	released := false
	defer func() {
		if !released {
			close(f.hold)
		}
	}()
	onCPU0 := func(fn func()) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(0)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				t.Error(err)
				return
			}
			fn()
		}()
		<-done
	}
	path := filepath.Join(mnt, "later")
	slow := make(chan error, 1)
	go onCPU0(func() {
		fd, err := os.Open(path)
		if err != nil {
			slow <- err
			return
		}
		_, err = fd.ReadAt(make([]byte, 4096), 0)
		fd.Close() // before reporting: an open file keeps the mount busy at unmount
		slow <- err
	})
	for f.started.Load() == 0 {
		runtime.Gosched() // the held READ reaches the file system
	}
	onCPU0(func() {
		fd, err := os.Open(path)
		if err != nil {
			t.Error(err)
			return
		}
		defer fd.Close()
		buf := make([]byte, 4096)
		if _, err := fd.ReadAt(buf, 8192); err != nil {
			t.Errorf("read behind the held one: %v", err)
		}
	})
	select {
	case err := <-slow:
		t.Fatalf("the held READ was answered before its data came: %v", err)
	default:
	}
	close(f.hold)
	released = true
	if err := <-slow; err != nil {
		t.Fatalf("the held READ: %v", err)
	}
}
