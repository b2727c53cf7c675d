package baseline

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/netip"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The FUSE floor: what a pread through FUSE that crosses the network costs
// at the least. FUSEFloor is a go-fuse filesystem, mounted with krfs's
// options (direct_io, FOPEN_NOFLUSH, MaxWrite 1 MiB, no splice), with one
// file "f" whose every read makes exactly one raw UDP round trip to an
// echo server (a RemoteServer on the peer host) and answers with what came
// back: a krfs pread of a peer's memory does the same work plus krfs's own.
// Run it in its own process, as krfs's daemon is, so that the reader pays
// the same cross-process wake-ups (see ServeFUSEFloor).

// FUSEFloorMaxEcho bounds the bytes one read sends and receives: larger
// reads are answered with the echo repeated (one Ethernet datagram keeps
// the round trip a single unfragmented packet each way).
const FUSEFloorMaxEcho = 1400

// FUSEFloor is a mounted floor filesystem.
type FUSEFloor struct {
	dir string
	srv *fuse.Server
	f   *floorFile
}

type floorFile struct {
	gofs.Inode
	local netip.Addr
	echo  sockaddr
	size  int64

	mu    sync.Mutex // guards socks
	socks []*udpSock // idle sockets; one per concurrent read
}

var (
	_ gofs.NodeOpener    = (*floorFile)(nil)
	_ gofs.NodeReader    = (*floorFile)(nil)
	_ gofs.NodeGetattrer = (*floorFile)(nil)
)

func (f *floorFile) Open(context.Context, uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

func (f *floorFile) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	out.Size = uint64(f.size)
	return 0
}

func (f *floorFile) Read(_ context.Context, _ gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= f.size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(int64(len(dest)), f.size-off)]
	if len(dest) == 0 {
		return fuse.ReadResultData(dest), 0
	}
	s, err := f.sock()
	if err != nil {
		return nil, syscall.EIO
	}
	n := min(len(dest), FUSEFloorMaxEcho)
	if err := sendto(s.fd, dest[:n], &f.echo); err != nil {
		s.close()
		return nil, syscall.EIO
	}
	got, err := recvfrom(s.fd, dest[:n], nil)
	if err != nil || got != n {
		s.close() // a late echo must not answer the next read
		return nil, syscall.EIO
	}
	for k := n; k < len(dest); k += n {
		copy(dest[k:], dest[:n])
	}
	f.mu.Lock()
	f.socks = append(f.socks, s)
	f.mu.Unlock()
	return fuse.ReadResultData(dest), 0
}

func (f *floorFile) sock() (*udpSock, error) {
	f.mu.Lock()
	if k := len(f.socks); k > 0 {
		s := f.socks[k-1]
		f.socks = f.socks[:k-1]
		f.mu.Unlock()
		return s, nil
	}
	f.mu.Unlock()
	return openUDP(f.local, 0)
}

type floorRoot struct {
	gofs.Inode
	f *floorFile
}

func (r *floorRoot) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, r.f, gofs.StableAttr{Mode: syscall.S_IFREG})
	r.AddChild("f", ch, false)
}

// MountFUSEFloor mounts the floor filesystem at dir (an empty directory;
// needs root and /dev/fuse). Its file "f" is size bytes long; reads make
// their round trip from a socket bound to local to echo.
func MountFUSEFloor(dir string, local netip.Addr, echo netip.AddrPort, size int64) (*FUSEFloor, error) {
	f := &floorFile{local: local, size: size}
	f.echo.set(echo)
	timeout := time.Second // krfs's entry and attribute timeouts
	srv, err := gofs.Mount(dir, &floorRoot{f: f}, &gofs.Options{
		EntryTimeout: &timeout, AttrTimeout: &timeout, NegativeTimeout: &timeout,
		MountOptions: fuse.MountOptions{FsName: "krfs-floor", Name: "krfs-floor",
			MaxWrite: 1 << 20, DirectMountStrict: true, DisableXAttrs: true, DisableSplice: true,
			Logger: log.New(io.Discard, "", 0)},
	})
	if err != nil {
		return nil, fmt.Errorf("baseline: mounting the FUSE floor at %s: %w", dir, err)
	}
	return &FUSEFloor{dir: dir, srv: srv, f: f}, nil
}

// Path is the floor file's path.
func (m *FUSEFloor) Path() string { return filepath.Join(m.dir, "f") }

// Unmount unmounts it (lazily if busy) and closes its sockets.
func (m *FUSEFloor) Unmount() error {
	err := m.srv.Unmount()
	if err != nil {
		err = unix.Unmount(m.dir, unix.MNT_DETACH)
	}
	m.f.mu.Lock()
	for _, s := range m.f.socks {
		s.close()
	}
	m.f.socks = nil
	m.f.mu.Unlock()
	return err
}

// ServeFUSEFloor mounts the floor and serves it until stop is closed; for
// a helper process (the bench re-executes itself under nsenter to run it
// on the reader's host). ready is called with the file's path once it is
// mounted.
func ServeFUSEFloor(dir string, local netip.Addr, echo netip.AddrPort, size int64, ready func(path string), stop <-chan struct{}) error {
	m, err := MountFUSEFloor(dir, local, echo, size)
	if err != nil {
		return err
	}
	ready(m.Path())
	<-stop
	return m.Unmount()
}

// PreadLatency times iters preads of size bytes at offset 0 of path (after
// a few untimed ones).
func PreadLatency(path string, iters, size int) (Latencies, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, size)
	lat := make(Latencies, 0, iters)
	for i := -Warmup; i < iters; i++ {
		t0 := time.Now()
		n, err := unix.Pread(fd, buf, 0)
		d := time.Since(t0)
		if err != nil || n != size {
			return nil, fmt.Errorf("baseline: pread %s: %d bytes, %v", path, n, err)
		}
		if i >= 0 {
			lat = append(lat, d)
		}
	}
	return lat, nil
}

// PreadRate runs threads goroutines, each doing preads of size bytes on
// its own descriptor of path, for about d, and returns preads per second.
func PreadRate(path string, threads, size int, d time.Duration) (float64, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	var firstErr error
	start := time.Now()
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
				return
			}
			defer unix.Close(fd)
			buf := make([]byte, size)
			var k int64
			for time.Since(start) < d {
				if _, err := unix.Pread(fd, buf, 0); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				k++
			}
			mu.Lock()
			total += k
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, fmt.Errorf("baseline: pread %s: %w", path, firstErr)
	}
	return float64(total) / time.Since(start).Seconds(), nil
}
