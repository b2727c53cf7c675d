package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// One daemon per directory: a second Open fails at once, naming the
// holder; Close releases the lock.
func TestOpenLocksTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir)
	if !errors.Is(err, ErrInUse) || !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second Open: %v; want ErrInUse naming pid %d", err, os.Getpid())
	}
	if err := Purge(dir); !errors.Is(err, ErrInUse) {
		t.Fatalf("Purge of a held store: %v, want ErrInUse", err)
	}
	if _, err := s.Map("r", 4096, 0o600, -1, -1); err != nil {
		t.Fatal(err)
	}
	// The lock file is not a region.
	if names, _ := s.Names(); len(names) != 1 || names[0] != "r" {
		t.Fatalf("Names = %v, want [r]", names)
	}
	s.Close()
	s2, err := Open(dir)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s2.Close()
}

// Discard removes a directory Open created, and only such a directory.
func TestDiscardRemovesOnlyWhatOpenCreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Map("mem", 4096, 0o600, -1, -1); err != nil {
		t.Fatal(err)
	}
	if err := s.Discard(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("created store still there after Discard: %v", err)
	}

	// A store of an earlier run is kept.
	s, _ = Open(dir)
	if _, err := s.Map("kept", 4096, 0o600, -1, -1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Discard(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kept")); err != nil {
		t.Fatalf("an earlier run's region was removed: %v", err)
	}
}

// Purge frees a store no daemon holds and leaves foreign files alone.
func TestPurge(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, _ := Open(dir)
	for _, n := range []string{"a", "b"} {
		if _, err := s.Map(n, 8192, 0o600, -1, -1); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	if err := Purge(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("store after Purge: %v", err)
	}
	if err := Purge(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Purge of nothing: %v", err)
	}
	// A directory with files that are not regions keeps them.
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "Not A Region!"), []byte("x"), 0o600)
	if err := Purge(dir); err == nil {
		t.Fatal("Purge removed a directory holding foreign files")
	}
	if _, err := os.Stat(filepath.Join(dir, "Not A Region!")); err != nil {
		t.Fatalf("foreign file: %v", err)
	}
}
