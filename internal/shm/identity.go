package shm

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// # A node's identity
//
// A store remembers the node that holds it, so that a node restarted
// without --gid is the same node again (cmd/krfs, node): IdentityFile
// holds its gid and listen address (text: "gid N" and "listen ADDR"
// lines), KeyFile its Ed25519 private key (the hex of the 32-byte seed),
// both mode 0600 and, like every file of the store, opened through the
// directory's descriptor without following links.

// IdentityFile and KeyFile are the store's record of the node that holds
// it: its gid and listen address, and its private key.
const (
	IdentityFile = ".identity"
	KeyFile      = ".node-key"
)

// Identity is what a store remembers of its node.
type Identity struct {
	GID    uint32
	Listen string             // the NIC's address, IP:PORT
	Key    ed25519.PrivateKey // nil: none recorded
}

// SaveIdentity records id in the store (replacing what it held).
func (s *Store) SaveIdentity(id Identity) error {
	text := fmt.Sprintf("gid %d\nlisten %s\n", id.GID, id.Listen)
	if err := s.writeFile(IdentityFile, []byte(text)); err != nil {
		return err
	}
	if id.Key != nil {
		return s.writeFile(KeyFile, []byte(hex.EncodeToString(id.Key.Seed())+"\n"))
	}
	return nil
}

func (s *Store) writeFile(name string, b []byte) error {
	f, err := openAt(s.dirfd, s.dir, name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	defer f.Close()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	return nil
}

// ReadIdentity returns what the store in dir remembers of its node,
// without locking it (a daemon may hold it). The directory must pass
// Open's checks. An error wrapping os.ErrNotExist means it remembers
// nothing (or dir does not exist).
func ReadIdentity(dir string) (Identity, error) {
	fd, _, err := openDir(dir, false)
	if err != nil {
		return Identity{}, err
	}
	defer unix.Close(fd)
	return readIdentity(fd, dir)
}

func readIdentity(fd int, dir string) (Identity, error) {
	var id Identity
	text, err := readSmall(fd, dir, IdentityFile)
	if err != nil {
		return id, err
	}
	seenGID := false
	for _, line := range strings.Split(strings.TrimSpace(string(text)), "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch k {
		case "gid":
			g, err := strconv.ParseUint(v, 10, 32)
			if err != nil || g == 0 {
				return id, fmt.Errorf("shm: %s: bad gid %q", filepath.Join(dir, IdentityFile), v)
			}
			id.GID, seenGID = uint32(g), true
		case "listen":
			id.Listen = v
		}
	}
	if !seenGID {
		return id, fmt.Errorf("shm: %s: no gid", filepath.Join(dir, IdentityFile))
	}
	seed, err := readSmall(fd, dir, KeyFile)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return id, nil
	case err != nil:
		return id, err
	}
	b, err := hex.DecodeString(string(bytes.TrimSpace(seed)))
	if err != nil || len(b) != ed25519.SeedSize {
		return id, fmt.Errorf("shm: %s: not a node key", filepath.Join(dir, KeyFile))
	}
	id.Key = ed25519.NewKeyFromSeed(b)
	return id, nil
}

// readSmall reads a file of the store (at most 4 KiB).
func readSmall(fd int, dir, name string) ([]byte, error) {
	f, err := openAt(fd, dir, name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4096))
}

// StoreInfo describes a store under the default base.
type StoreInfo struct {
	Dir      string
	Identity Identity  // zero if it remembers none
	HeldBy   string    // the pid of the daemon holding it; "" if free
	Bytes    int64     // bytes its region files hold
	Saved    time.Time // when its node last recorded its identity (a start)
	Err      error     // why it could not be read (an unsafe directory...)
}

// List describes every store under the default base (krfs-*).
func List() ([]StoreInfo, error) {
	dirs, err := Stores()
	if err != nil {
		return nil, err
	}
	out := make([]StoreInfo, 0, len(dirs))
	for _, d := range dirs {
		out = append(out, describe(d))
	}
	return out, nil
}

func describe(dir string) StoreInfo {
	si := StoreInfo{Dir: dir}
	fd, _, err := openDir(dir, false)
	if err != nil {
		si.Err = err
		return si
	}
	defer unix.Close(fd)
	if id, err := readIdentity(fd, dir); err == nil {
		si.Identity = id
		if st, err := statAt(fd, IdentityFile); err == nil {
			si.Saved = time.Unix(st.Mtim.Unix())
		}
	}
	si.HeldBy = holder(fd, dir)
	names, _ := readDirFD(fd)
	for _, n := range names {
		if st, err := statAt(fd, n); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && ValidName(n) {
			si.Bytes += st.Blocks * 512
		}
	}
	return si
}

// holder is the pid a daemon holding the store wrote, or "" if no daemon
// holds it.
func holder(fd int, dir string) string {
	f, err := openAt(fd, dir, LockFile, os.O_RDONLY, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, 32))
	if p := strings.TrimSpace(string(b)); p != "" {
		return p
	}
	return "unknown"
}

// FindIdentity returns the free store under the default base whose node
// listened at listen (the store a node restarted without --gid had), and
// what it remembers. ok is false if there is none; with several (a node
// that once had to take another gid), the one its node started with
// last.
func FindIdentity(listen string) (si StoreInfo, ok bool) {
	all, err := List()
	if err != nil {
		return si, false
	}
	for _, s := range all {
		if s.Err != nil || s.HeldBy != "" || s.Identity.GID == 0 || s.Identity.Listen != listen {
			continue
		}
		if !ok || s.Saved.After(si.Saved) || s.Saved.Equal(si.Saved) && s.Identity.GID < si.Identity.GID {
			si, ok = s, true
		}
	}
	return si, ok
}
