// Package shm keeps a node's exported regions in shared-memory files, so
// that local programs can mmap them at memory speed while peers reach them
// over the NIC, and so that their contents survive a daemon crash: a
// restarted daemon opens the same files and registers them again.
//
// A store is a directory (by default under /dev/shm); each region is one
// file in it, mapped MAP_SHARED. A region's owner and mode are the file's
// own, so they persist with it.
package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxSize bounds one region.
const MaxSize = 1 << 40

// Store is a directory of region files.
type Store struct {
	dir string

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

// Open opens (creating it if needed) the store in dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("shm: store %s: %w", dir, err)
	}
	return &Store{dir: dir, regions: map[string]*Region{}}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Names lists the region files present, including those left by an
// earlier run of the daemon.
func (s *Store) Names() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && ValidName(e.Name()) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
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
// remapped (the old Mem becomes invalid).
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
		f, err := os.OpenFile(s.Path(name), os.O_RDWR|os.O_CREATE, mode.Perm())
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
	if r.Mem != nil {
		_ = unix.Munmap(r.Mem)
		r.Mem = nil
	}
	if st.Size() != size {
		if err := r.file.Truncate(size); err != nil {
			return nil, fmt.Errorf("shm: resize %s: %w", name, err)
		}
	}
	if size > 0 {
		m, err := unix.Mmap(int(r.file.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("shm: map %s: %w", name, err)
		}
		r.Mem = m
	}
	s.regions[name] = r
	return r, nil
}

// Stat returns the region file's mode, owner and size.
func (s *Store) Stat(name string) (mode os.FileMode, uid, gid int, size int64, err error) {
	st, err := os.Stat(s.Path(name))
	if err != nil {
		return 0, 0, 0, 0, err
	}
	sys := st.Sys().(*syscall.Stat_t)
	return st.Mode().Perm(), int(sys.Uid), int(sys.Gid), st.Size(), nil
}

// Chmod and Chown change the region file's mode and owner.
func (s *Store) Chmod(name string, mode os.FileMode) error { return os.Chmod(s.Path(name), mode) }
func (s *Store) Chown(name string, uid, gid int) error     { return os.Chown(s.Path(name), uid, gid) }

// Remove unmaps the region and deletes its file.
func (s *Store) Remove(name string) error {
	s.mu.Lock()
	r := s.regions[name]
	delete(s.regions, name)
	s.mu.Unlock()
	if r != nil {
		r.close()
	}
	err := os.Remove(s.Path(name))
	if errors.Is(err, os.ErrNotExist) && r != nil {
		return nil
	}
	return err
}

// Close unmaps every region; the files stay.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, r := range s.regions {
		r.close()
		delete(s.regions, n)
	}
	return nil
}

func (r *Region) close() {
	if r.Mem != nil {
		_ = unix.Munmap(r.Mem)
		r.Mem = nil
	}
	r.file.Close()
}

// DefaultDir is the store directory of node gid under /dev/shm.
func DefaultDir(gid uint32) string {
	base := "/dev/shm"
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = os.TempDir()
	}
	return filepath.Join(base, "krfs-"+strings.TrimSpace(fmt.Sprint(gid)))
}
