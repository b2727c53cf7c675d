package shm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The attack of issue 31: a local user (nobody) creates the predictable
// store directory first, with a lock file and a region that are symbolic
// links to root's files; root's daemon then opens the store. Open must
// refuse it in one line and leave root's files as they were.
func TestOpenRefusesAStorePreparedByAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to nobody needs root")
	}
	const nobody = 65534
	base := t.TempDir()
	if err := os.Chmod(base, 0o1777); err != nil { // like /dev/shm
		t.Fatal(err)
	}
	secrets := t.TempDir()
	pidVictim := filepath.Join(secrets, "config")
	secret := filepath.Join(secrets, "shadow")
	os.WriteFile(pidVictim, []byte("root's config\n"), 0o644)
	os.WriteFile(secret, []byte("root's secret\n"), 0o600)

	dir := filepath.Join(base, "krfs-7701")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(dir, nobody, nobody)
	for name, target := range map[string]string{LockFile: pidVictim, "mem": secret} {
		link := filepath.Join(dir, name)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		os.Lchown(link, nobody, nobody)
	}
	s, err := Open(dir)
	if err == nil {
		s.Map("mem", 1<<20, 0o644, -1, -1)
		s.Close()
		t.Fatal("Open accepted a store directory owned by nobody")
	}
	if !errors.Is(err, ErrUnsafe) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("error: %v (want one line wrapping ErrUnsafe naming the owner)", err)
	}
	if b, _ := os.ReadFile(pidVictim); !bytes.Equal(b, []byte("root's config\n")) {
		t.Fatalf("root's file was written: %q", b)
	}
	if st, _ := os.Stat(secret); st.Size() != int64(len("root's secret\n")) || st.Mode().Perm() != 0o600 {
		t.Fatalf("root's secret was touched: %v", st.Mode())
	}

	// The same directory handed to root (chown) is still refused: it holds
	// links.
	os.Chown(dir, 0, 0)
	os.Chmod(dir, 0o700)
	if _, err := Open(dir); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("a store holding symlinks: %v", err)
	}
	// Purge removes the links themselves, never what they point at.
	if err := Purge(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("purged store: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "root's secret\n" {
		t.Fatalf("Purge followed a link: %q", b)
	}
}

// A store writable by others, or a symlink in place of the store, is
// refused; a new store is made 0700.
func TestOpenRefusesUnsafeDirectories(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	if _, err := Open(open); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "writable") {
		t.Fatalf("a world-writable store: %v", err)
	}
	elsewhere := t.TempDir()
	link := filepath.Join(base, "link")
	os.Symlink(elsewhere, link)
	if _, err := Open(link); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("a store that is a symlink: %v", err)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Fatalf("Open wrote through a symlinked store: %v", ents)
	}
	fresh := filepath.Join(base, "a", "fresh")
	s, err := Open(fresh)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st, _ := os.Stat(fresh); st.Mode().Perm() != 0o700 {
		t.Fatalf("new store mode %v, want 0700", st.Mode().Perm())
	}
	// A region file replaced by a link behind the store's back is not
	// followed.
	os.Symlink(filepath.Join(elsewhere, "x"), filepath.Join(fresh, "sneaky"))
	if _, err := s.Map("sneaky", 4096, 0o600, -1, -1); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("Map through a symlink: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(elsewhere, "x")); err == nil {
		t.Fatal("Map created the link's target")
	}
}

// Chmod, Chown and Stat act on the region file through the directory's
// descriptor.
func TestChmodChownThroughTheDirectory(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Map("r", 4096, 0o600, -1, -1); err != nil {
		t.Fatal(err)
	}
	if err := s.Chmod("r", 0o640); err != nil {
		t.Fatal(err)
	}
	if err := s.Chown("r", os.Getuid(), 0); err != nil {
		t.Fatal(err)
	}
	if mode, uid, gid, size, err := s.Stat("r"); err != nil || mode != 0o640 || uid != os.Getuid() || gid != 0 || size != 4096 {
		t.Fatalf("Stat: %v %d %d %d %v", mode, uid, gid, size, err)
	}
	if err := s.Chmod("missing", 0o600); err == nil {
		t.Fatal("Chmod of a missing region")
	}
}
