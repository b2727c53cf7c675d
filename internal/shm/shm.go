// Package shm keeps a node's exported regions in shared-memory files, so
// that local programs can mmap them at memory speed while peers reach them
// over the NIC, and so that their contents survive a daemon crash: a
// restarted daemon opens the same files and registers them again.
//
// A store is a directory (by default under /dev/shm); each region is one
// file in it, mapped MAP_SHARED. A region's owner and mode are the file's
// own, so they persist with it.
//
// # Memory that cannot fault
//
// A mapped page of a shared-memory file that the filesystem cannot back
// (a full tmpfs, a sparse file) raises SIGBUS when it is first touched,
// and a Go program dies of it. So Map reserves every byte of a region
// with fallocate before mapping it (when it is created, grown, or found
// from an earlier run): a region the filesystem cannot hold is refused
// with ENOSPC and a message that says how much is free, and nothing is
// left half-grown. CheckFits lets a daemon refuse, before it starts, a
// default region larger than the filesystem of its store. Guard is the
// last line of defence: it turns a fault that happens anyway (a region
// file truncated behind the store's back) into an error.
package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxSize bounds one region.
const MaxSize = 1 << 40

// DefaultMode is the mode of a node's default region "mem" when the daemon
// creates it (owned by the user who mounts): everyone with access to the
// mount may read it (as every member of the cluster can), only its owner
// may write it or act on it with atomics. A region kept from an earlier
// run keeps its own mode; chmod regions/mem changes it.
const DefaultMode = 0o644

// Store is a directory of region files, held by one daemon at a time: Open
// takes an exclusive lock (flock) on the file .lock in it, which records
// the holder's pid, and Close releases it. A second Open of the same
// directory, from this process or another, fails at once with ErrInUse.
type Store struct {
	dir     string
	dirfd   int // the directory, opened once (dirfd.go); -1 once closed
	lock    *os.File
	created bool // Open made the directory

	mu      sync.Mutex // guards regions
	regions map[string]*Region
}

// Region is one mapped region file.
type Region struct {
	Name string
	// Mem is the mapping; valid until the region is resized, removed or
	// closed.
	Mem  []byte
	file *os.File
}

// ValidName reports whether name can name a region: 1 to 32 bytes of
// letters, digits, '.', '_' and '-', not starting with '.'.
func ValidName(name string) bool {
	if len(name) == 0 || len(name) > 32 || name[0] == '.' {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// LockFile is the name of a store's lock file.
const LockFile = ".lock"

// ErrInUse is the error of Open and Purge on a store another daemon holds.
var ErrInUse = errors.New("in use by another krfs daemon")

// Open opens (creating it 0700 if needed) the store in dir and locks it.
// If another daemon holds it, Open fails at once with an error wrapping
// ErrInUse that names that daemon's pid. A directory someone else could
// have prepared (see dirfd.go) is refused with an error wrapping
// ErrUnsafe, and nothing in it is touched.
func Open(dir string) (*Store, error) {
	fd, created, err := openDir(dir, true)
	if err != nil {
		return nil, err
	}
	lock, err := lockDir(fd, dir)
	if err != nil {
		unix.Close(fd)
		if created {
			os.Remove(dir)
		}
		return nil, err
	}
	return &Store{dir: dir, dirfd: fd, lock: lock, created: created, regions: map[string]*Region{}}, nil
}

// lockDir takes the lock of the store whose directory is dirfd without
// waiting and writes this process's pid into the lock file.
func lockDir(dirfd int, dir string) (*os.File, error) {
	f, err := openAt(dirfd, dir, LockFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shm: locking store %s: %w", dir, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		b := make([]byte, 32)
		k, _ := f.ReadAt(b, 0)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := strings.TrimSpace(string(b[:k]))
			if holder == "" {
				holder = "unknown"
			}
			return nil, fmt.Errorf("shm: region directory %s is %w (pid %s); give this node its own --shm-dir: %w",
				dir, ErrInUse, holder, syscall.EBUSY)
		}
		return nil, fmt.Errorf("shm: locking store %s: %w", dir, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
	return f, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Names lists the region files present, including those left by an
// earlier run of the daemon.
func (s *Store) Names() ([]string, error) {
	names, err := readDirFD(s.dirfd)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if st, err := statAt(s.dirfd, n); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && ValidName(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Mapped lists the regions the store has mapped, sorted.
func (s *Store) Mapped() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.regions))
	for n := range s.regions {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Path is the file behind a region, for local programs to mmap.
func (s *Store) Path(name string) string { return filepath.Join(s.dir, name) }

// Get returns the mapped region, or nil.
func (s *Store) Get(name string) *Region {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.regions[name]
}

// Map maps the region name, creating its file with mode, owner and size
// if it does not exist; an existing file keeps its contents, owner and
// mode, and its size when size < 0. A mapped region of another size is
// remapped (the old Mem becomes invalid). Every byte is reserved first
// (see the package doc): a region that does not fit is refused with an
// error wrapping ENOSPC, and a region that was to grow keeps its old size
// and mapping.
func (s *Store) Map(name string, size int64, mode os.FileMode, uid, gid int) (*Region, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("shm: %q: %w", name, syscall.EINVAL)
	}
	if size > MaxSize {
		return nil, fmt.Errorf("shm: %s: %d bytes: %w", name, size, syscall.EFBIG)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regions[name]
	if r == nil {
		f, err := openAt(s.dirfd, s.dir, name, os.O_RDWR|os.O_CREATE, uint32(mode.Perm()))
		if err != nil {
			return nil, fmt.Errorf("shm: %w", err)
		}
		r = &Region{Name: name, file: f}
		if uid >= 0 {
			if st, err := f.Stat(); err == nil && st.Size() == 0 {
				_ = f.Chown(uid, gid)
				_ = f.Chmod(mode.Perm())
			}
		}
	}
	st, err := r.file.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	if size < 0 {
		size = st.Size()
	}
	if r.Mem != nil && int64(len(r.Mem)) == size {
		s.regions[name] = r
		return r, nil
	}
	if r.Mem != nil && size < int64(len(r.Mem)) {
		// Shrink: unmap first, so that no access lands past the new end.
		_ = unix.Munmap(r.Mem)
		r.Mem = nil
	}
	// Grow (or map): reserve first, so that a region that does not fit
	// keeps its old mapping and contents.
	if err := s.reserveLocked(r.file, name, st, size); err != nil {
		if s.regions[name] == nil {
			r.file.Close()
			if st.Size() == 0 {
				// A region this call created and could not hold: leave
				// no empty file behind for a restarted daemon to find.
				_ = unix.Unlinkat(s.dirfd, name, 0)
			}
		}
		return nil, err
	}
	if r.Mem != nil {
		_ = unix.Munmap(r.Mem)
		r.Mem = nil
	}
	if size > 0 {
		m, err := unix.Mmap(int(r.file.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("shm: map %s: %w", name, err)
		}
		// Map every page now, in one call: a page the daemon's NIC first
		// touches while serving a READ costs a page fault each (about
		// 10 us on a VM), which made the first READ of a fresh 16 MiB
		// region 4x slower than the next. The pages are reserved
		// already (fallocate), so this takes no more memory; a region
		// above populateMax is left to fault in (its mapping would
		// delay the daemon's start). An old kernel without
		// MADV_POPULATE_WRITE (5.14) maps them lazily.
		if size <= populateMax {
			_ = unix.Madvise(m, unix.MADV_POPULATE_WRITE)
		}
		r.Mem = m
	}
	s.regions[name] = r
	return r, nil
}

// populateMax is the largest region whose pages are mapped when it is
// mapped (see Store's mapping of a region).
const populateMax = 256 << 20

// reserveLocked sets the file's size to size and makes the filesystem
// allocate every byte of it, so that no page of the mapping can fault. A
// region that does not fit keeps its old size and contents and the error
// wraps ENOSPC.
func (s *Store) reserveLocked(f *os.File, name string, st os.FileInfo, size int64) error {
	old := st.Size()
	if size < old {
		if err := f.Truncate(size); err != nil {
			return fmt.Errorf("shm: resize %s: %w", name, err)
		}
	}
	if size == 0 {
		return nil
	}
	allocated := int64(0)
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		allocated = sys.Blocks * 512
	}
	if free, err := freeBytes(s.dirfd); err == nil && size-allocated > free {
		return fmt.Errorf("shm: region %s: %d bytes do not fit in %s (%d bytes free, %d held by the region): %w",
			name, size, s.dir, free, allocated, syscall.ENOSPC)
	}
	err := fallocate(f, size)
	if err == nil {
		return nil
	}
	if size > old {
		_ = f.Truncate(old) // give back what was reserved in vain
	}
	if errors.Is(err, syscall.ENOSPC) {
		free, _ := freeBytes(s.dirfd)
		return fmt.Errorf("shm: region %s: %d bytes do not fit in %s (%d bytes free): %w", name, size, s.dir, free, err)
	}
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return fmt.Errorf("shm: region %s: the filesystem of %s cannot reserve memory (fallocate unsupported); use a tmpfs such as /dev/shm: %w", name, s.dir, err)
	}
	return fmt.Errorf("shm: reserving region %s: %w", name, err)
}

// fallocate allocates the first size bytes of f, extending it to size.
func fallocate(f *os.File, size int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), 0, 0, size)
		if err != syscall.EINTR {
			return err
		}
	}
}

// freeBytes is the space unprivileged writers may still allocate in the
// filesystem of the directory dirfd.
func freeBytes(dirfd int) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(dirfd, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// CheckFits reports, before a daemon starts, whether a default region of
// size bytes can live in the store directory dir (which need not exist
// yet: its nearest existing parent decides): it must fit the filesystem's
// total size, and, unless dir already holds a region "mem" from an
// earlier run (which is kept), its free space. The error wraps ENOSPC and
// says what is available.
func CheckFits(dir string, size int64) error {
	at := dir
	for {
		if _, err := os.Stat(at); err == nil {
			break
		}
		parent := filepath.Dir(at)
		if parent == at {
			return fmt.Errorf("shm: %s: no existing parent directory", dir)
		}
		at = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil {
		return fmt.Errorf("shm: %s: %w", at, err)
	}
	total, free := int64(st.Blocks)*st.Bsize, int64(st.Bavail)*st.Bsize
	if size > total {
		return fmt.Errorf("shm: %d bytes do not fit in the filesystem of %s (%d bytes in all): %w", size, at, total, syscall.ENOSPC)
	}
	if _, err := os.Lstat(filepath.Join(dir, "mem")); err == nil {
		return nil // the region of an earlier run is kept and holds its own space
	}
	if size > free {
		return fmt.Errorf("shm: %d bytes do not fit in the filesystem of %s (%d bytes free of %d): %w", size, at, free, total, syscall.ENOSPC)
	}
	return nil
}

// Guard runs f, which touches region memory, and turns a memory fault in
// it into an error wrapping EFAULT instead of a crash. Map's reservation
// leaves nothing to fault, unless a region file is truncated behind the
// store's back (its directory is root's alone); Guard keeps the daemon
// alive even then, failing only the operation. f must not hold locks a
// fault would leave held.
func Guard(f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if fault, ok := r.(interface{ Addr() uintptr }); ok {
				err = fmt.Errorf("shm: memory fault at %#x (a region file shrank under its mapping): %w", fault.Addr(), syscall.EFAULT)
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}

// Stat returns the region file's mode, owner and size.
func (s *Store) Stat(name string) (mode os.FileMode, uid, gid int, size int64, err error) {
	st, err := statAt(s.dirfd, name)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	return os.FileMode(st.Mode & 0o777), int(st.Uid), int(st.Gid), st.Size, nil
}

// Chmod and Chown change the region file's mode and owner (never through
// a symbolic link).
func (s *Store) Chmod(name string, mode os.FileMode) error {
	f, err := openAt(s.dirfd, s.dir, name, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return os.Chmod(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), mode)
}

func (s *Store) Chown(name string, uid, gid int) error {
	if err := unix.Fchownat(s.dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "chown", Path: s.Path(name), Err: err}
	}
	return nil
}

// Remove unmaps the region and deletes its file.
func (s *Store) Remove(name string) error {
	s.mu.Lock()
	r := s.regions[name]
	delete(s.regions, name)
	s.mu.Unlock()
	if r != nil {
		r.close()
	}
	err := unix.Unlinkat(s.dirfd, name, 0)
	if errors.Is(err, unix.ENOENT) && r != nil {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "remove", Path: s.Path(name), Err: err}
	}
	return nil
}

// Close unmaps every region and releases the lock; the files stay.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, r := range s.regions {
		r.close()
		delete(s.regions, n)
	}
	if s.lock != nil {
		s.lock.Close() // releases the flock
		s.lock = nil
	}
	if s.dirfd >= 0 {
		unix.Close(s.dirfd)
		s.dirfd = -1
	}
	return nil
}

// Discard closes the store and, if Open created its directory, removes
// the directory with every region in it: what a daemon that failed to
// start does, so that it leaves nothing behind. A directory that existed
// before (an earlier run's regions) is kept.
func (s *Store) Discard() error {
	s.mu.Lock()
	for n, r := range s.regions {
		r.close()
		delete(s.regions, n)
	}
	s.mu.Unlock()
	var err error
	if s.created {
		err = removeStore(s.dirfd, s.dir) // still under our lock
	}
	s.Close()
	return err
}

// removeStore deletes the region files and the lock file of the store
// directory dirfd (named dir), then dir itself; files that are not a
// store's are left, and so is dir then. Nothing is followed: a symbolic
// link named like a region is removed itself.
func removeStore(dirfd int, dir string) error {
	names, err := readDirFD(dirfd)
	if err != nil {
		return err
	}
	for _, n := range names {
		st, err := statAt(dirfd, n)
		if err != nil {
			continue
		}
		if t := st.Mode & unix.S_IFMT; (t == unix.S_IFREG || t == unix.S_IFLNK) && (ValidName(n) || storeFile(n)) {
			if err := unix.Unlinkat(dirfd, n, 0); err != nil {
				return &os.PathError{Op: "remove", Path: filepath.Join(dir, n), Err: err}
			}
		}
	}
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("shm: %s holds files that are not regions, kept: %w", dir, err)
	}
	return nil
}

// Purge frees the memory of the store in dir: it deletes every region
// file, the lock and the directory. It refuses (ErrInUse) while a daemon
// holds the store. The regions' contents are lost.
func Purge(dir string) error {
	if st, err := os.Lstat(dir); err != nil {
		return fmt.Errorf("shm: purge %s: %w", dir, err)
	} else if !st.IsDir() {
		return fmt.Errorf("shm: purge %s: not a directory: %w", dir, syscall.ENOTDIR)
	}
	fd, err := openNoFollowDir(dir)
	if err != nil {
		return fmt.Errorf("shm: purge %s: %w", dir, err)
	}
	defer unix.Close(fd)
	// A store someone else prepared has no lock of a daemon to respect
	// (no daemon opens it) and may hold links: its files are removed
	// without being opened or followed.
	if checkDir(fd, dir) == nil {
		lock, err := lockDir(fd, dir)
		if err != nil {
			return err
		}
		defer lock.Close()
	}
	return removeStore(fd, dir)
}

// Stores lists the store directories under the default base (the
// directories DefaultDir names: krfs-*), held or not.
func Stores() ([]string, error) {
	base := defaultBase()
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "krfs-") {
			out = append(out, filepath.Join(base, e.Name()))
		}
	}
	return out, nil
}

func (r *Region) close() {
	if r.Mem != nil {
		_ = unix.Munmap(r.Mem)
		r.Mem = nil
	}
	r.file.Close()
}

// DefaultDir is the store directory of node gid under /dev/shm (or the
// temporary directory where /dev/shm does not exist): krfs-GID.
func DefaultDir(gid uint32) string {
	return filepath.Join(defaultBase(), fmt.Sprintf("krfs-%d", gid))
}

// testBase replaces the default base in tests.
var testBase string

func defaultBase() string {
	if testBase != "" {
		return testBase
	}
	base := "/dev/shm"
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = os.TempDir()
	}
	return base
}
