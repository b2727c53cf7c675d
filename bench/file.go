package bench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/fs"
)

// fileTarget benchmarks a file of a mounted krfs: pread/pwrite at offset
// 0 with page-aligned buffers, the atomic ioctl, write() to a port file,
// open/close for connect.
type fileTarget struct {
	o    *Opts
	f    *os.File
	size int64
	bufs [][]byte
}

func openFileTarget(o *Opts) (*fileTarget, error) {
	f, err := os.OpenFile(o.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: --path %s is not a regular file", ErrUsage, o.Path)
	}
	t := &fileTarget{o: o, f: f}
	if isPort := filepath.Base(filepath.Dir(o.Path)) == "ports"; isPort != (o.Test == "send_lat") {
		f.Close()
		if isPort {
			return nil, fmt.Errorf("%w: --path %s is a port file; only send_lat writes to ports", ErrUsage, o.Path)
		}
		return nil, fmt.Errorf("%w: send_lat needs --path MOUNT/peers/GID/ports/PORT (someone must read MOUNT/ports/PORT on that node)", ErrUsage)
	}
	if o.Test != "send_lat" {
		t.size = st.Size()
		if t.size == 0 {
			f.Close()
			return nil, fmt.Errorf("%s: empty; want a region file such as MOUNT/peers/GID/mem", o.Path)
		}
	}
	return t, nil
}

func (t *fileTarget) describe() string { return t.o.Path }
func (t *fileTarget) limit() int64     { return t.size }

// buf returns page-aligned memory (mmap), as O_DIRECT-style callers use.
func (t *fileTarget) buf(i, size int) []byte {
	for len(t.bufs) <= i {
		t.bufs = append(t.bufs, nil)
	}
	if len(t.bufs[i]) < size {
		if t.bufs[i] != nil {
			_ = unix.Munmap(t.bufs[i])
		}
		pg := os.Getpagesize()
		m, err := unix.Mmap(-1, 0, (size+pg-1)/pg*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			m = make([]byte, size) // not aligned, but usable
		}
		t.bufs[i] = m
	}
	return t.bufs[i]
}

func retryEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != unix.EINTR {
			return n, err
		}
	}
}

func (t *fileTarget) read(p []byte) error {
	n, err := retryEINTR(func() (int, error) { return unix.Pread(int(t.f.Fd()), p, 0) })
	if err == nil && n != len(p) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func (t *fileTarget) write(p []byte) error {
	n, err := retryEINTR(func() (int, error) { return unix.Pwrite(int(t.f.Fd()), p, 0) })
	if err == nil && n != len(p) {
		err = io.ErrShortWrite
	}
	return err
}

func (t *fileTarget) fetchAdd() error {
	var b [fs.AtomicArgSize]byte
	arg := fs.AtomicArg{Offset: 0, A: 1}
	arg.Encode(b[:])
	_, err := retryEINTR(func() (int, error) {
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, t.f.Fd(), uintptr(fs.IoctlFetchAdd), uintptr(unsafe.Pointer(&b[0]))); e != 0 {
			return 0, e
		}
		return 0, nil
	})
	return err
}

func (t *fileTarget) send(p []byte) error {
	n, err := retryEINTR(func() (int, error) { return unix.Write(int(t.f.Fd()), p) })
	if err == nil && n != len(p) {
		err = io.ErrShortWrite
	}
	return err
}

func (t *fileTarget) stream(write bool, size, n, outstanding int, deadline time.Time, done func()) error {
	var next atomic.Int64
	var stop atomic.Bool
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, outstanding)
	for i := range outstanding {
		b := t.bufs[i][:size]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := next.Add(1)
				if stop.Load() || (deadline.IsZero() && k > int64(n)) {
					return
				}
				if !deadline.IsZero() && k%16 == 0 && !time.Now().Before(deadline) {
					stop.Store(true)
					return
				}
				var err error
				if write {
					err = t.write(b)
				} else {
					err = t.read(b)
				}
				if err != nil {
					errs <- err
					stop.Store(true)
					return
				}
				mu.Lock()
				done()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (t *fileTarget) variants(string) []string { return []string{"open+close", "open+pread8+close"} }

func (t *fileTarget) once(_, variant string) (time.Duration, error) {
	b := t.buf(0, 8)[:8]
	t0 := time.Now()
	f, err := os.OpenFile(t.o.Path, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	if variant == "open+pread8+close" {
		_, err = retryEINTR(func() (int, error) { return unix.Pread(int(f.Fd()), b, 0) })
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return time.Since(t0), err
}

func (t *fileTarget) close() error {
	for _, b := range t.bufs {
		_ = unix.Munmap(b)
	}
	return t.f.Close()
}
