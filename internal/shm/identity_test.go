package shm

import (
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Rule (issue 31.6/31.10): a store remembers its node's gid, address and
// key (the key file 0600), never through a link; FindIdentity finds the
// free store of an address, not a held one.
func TestStoreRemembersItsNode(t *testing.T) {
	testBase = t.TempDir()
	defer func() { testBase = "" }()
	dir := DefaultDir(7)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(nil)
	if err := s.SaveIdentity(Identity{GID: 7, Listen: "10.0.0.7:4791", Key: key}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st.Mode(), err)
	}
	id, err := ReadIdentity(dir)
	if err != nil || id.GID != 7 || id.Listen != "10.0.0.7:4791" || !id.Key.Equal(key) {
		t.Fatalf("ReadIdentity: %+v %v", id, err)
	}
	if _, ok := FindIdentity("10.0.0.7:4791"); ok {
		t.Fatal("FindIdentity returned a store a daemon holds")
	}
	s.Close()
	si, ok := FindIdentity("10.0.0.7:4791")
	if !ok || si.Dir != dir || si.Identity.GID != 7 {
		t.Fatalf("FindIdentity: %+v %v", si, ok)
	}
	if _, ok := FindIdentity("10.0.0.8:4791"); ok {
		t.Fatal("FindIdentity matched another address")
	}
	// Regions only: the identity files are not regions.
	s, _ = Open(dir)
	if names, _ := s.Names(); len(names) != 0 {
		t.Fatalf("Names: %v", names)
	}
	s.Close()
	// A missing identity is ErrNotExist; a linked one is refused.
	other := DefaultDir(8)
	s, _ = Open(other)
	s.Close()
	if _, err := ReadIdentity(other); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no identity: %v", err)
	}
	os.Symlink(filepath.Join(dir, IdentityFile), filepath.Join(other, IdentityFile))
	if _, err := ReadIdentity(other); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("linked identity: %v", err)
	}
	if err := Purge(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Purge left the identity behind: %v", err)
	}
}
