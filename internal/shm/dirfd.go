package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// # The store directory is the daemon's alone
//
// The default store's name is predictable (/dev/shm/krfs-GID) and
// /dev/shm is writable by everyone, so a local user can create it first
// and fill it with symbolic links to files of the daemon's user (root):
// a daemon that followed them would write its pid into one (the lock) and
// extend and export another as a region. So the store is opened through a
// file descriptor of its directory, never by path:
//
//   - the directory is created 0700 if absent, and opened with
//     O_NOFOLLOW|O_DIRECTORY (a symlink in its place is refused);
//   - it must belong to the daemon's effective user and be writable by
//     nobody else (no group or other write bit), or Open refuses it with
//     one line that says why and what to do: only its owner can then have
//     put anything in it;
//   - any symbolic link in it refuses the store too;
//   - the lock and region files are opened relative to the directory's
//     descriptor with O_NOFOLLOW, and must be regular files.

// ErrUnsafe is the error of Open (and Purge) for a store directory that
// someone other than the daemon's user could have prepared.
var ErrUnsafe = errors.New("unsafe store directory")

// openDir opens (creating it 0700 if create and absent) the store
// directory dir and checks that it is safe; created tells whether this
// call made it.
func openDir(dir string, create bool) (fd int, created bool, err error) {
	fd, err = openNoFollowDir(dir)
	if errors.Is(err, unix.ENOENT) && create {
		if parent := filepath.Dir(dir); parent != dir {
			if err := os.MkdirAll(parent, 0o755); err != nil {
				return -1, false, fmt.Errorf("shm: store %s: %w", dir, err)
			}
		}
		if err := unix.Mkdir(dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, false, fmt.Errorf("shm: store %s: %w", dir, err)
		} else if err == nil {
			created = true
		}
		fd, err = openNoFollowDir(dir)
	}
	switch {
	case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
		return -1, false, fmt.Errorf("shm: store %s is a symbolic link or not a directory; refusing it (remove it, or give another --shm-dir): %w", dir, ErrUnsafe)
	case err != nil:
		return -1, false, fmt.Errorf("shm: store %s: %w", dir, &os.PathError{Op: "open", Path: dir, Err: err})
	}
	if err := checkDir(fd, dir); err != nil {
		unix.Close(fd)
		if created {
			_ = unix.Rmdir(dir)
		}
		return -1, false, err
	}
	return fd, created, nil
}

func openNoFollowDir(dir string) (int, error) {
	for {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// checkDir refuses a directory not owned by this process's effective
// user, writable by its group or others, or holding a symbolic link.
func checkDir(fd int, dir string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("shm: store %s: %w", dir, err)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fmt.Errorf("shm: store %s belongs to uid %d, not to this daemon's user (uid %d); refusing it (remove it, or give another --shm-dir): %w",
			dir, st.Uid, euid, ErrUnsafe)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("shm: store %s is writable by its group or others (mode %#o); refusing it (chmod 700 it, or give another --shm-dir): %w",
			dir, st.Mode&0o7777, ErrUnsafe)
	}
	names, err := readDirFD(fd)
	if err != nil {
		return fmt.Errorf("shm: store %s: %w", dir, err)
	}
	for _, n := range names {
		var lst unix.Stat_t
		if err := unix.Fstatat(fd, n, &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone meanwhile
		}
		if lst.Mode&unix.S_IFMT == unix.S_IFLNK {
			return fmt.Errorf("shm: store %s holds a symbolic link (%s); refusing it (remove the link): %w", dir, n, ErrUnsafe)
		}
	}
	return nil
}

// readDirFD lists the names in the directory fd (without . and ..).
func readDirFD(fd int) ([]string, error) {
	d, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(d)
	f := os.NewFile(uintptr(d), "store")
	defer f.Close()
	if _, err := f.Seek(0, 0); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}

// openAt opens name in the directory fd without following a symbolic
// link, and checks that it is a regular file.
func openAt(dirfd int, dir, name string, flag int, mode uint32) (*os.File, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(dirfd, name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, mode)
		if err != unix.EINTR {
			break
		}
	}
	path := filepath.Join(dir, name)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link; refusing it: %w", path, ErrUnsafe)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file; refusing it: %w", path, ErrUnsafe)
	}
	// Regular files ignore O_NONBLOCK; it kept a FIFO from blocking the open.
	_ = unix.SetNonblock(fd, false)
	return os.NewFile(uintptr(fd), path), nil
}

// statAt is lstat of name in the directory fd.
func statAt(dirfd int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return st, &os.PathError{Op: "stat", Path: name, Err: err}
	}
	return st, nil
}

// storeFile reports whether name is one of the store's own files besides
// regions: the lock and the node's identity (identity.go).
func storeFile(name string) bool {
	return name == LockFile || name == IdentityFile || name == KeyFile
}
