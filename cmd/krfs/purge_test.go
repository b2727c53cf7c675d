package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/krfs/krfs/internal/shm"
)

// Rule: krfs purge DIR removes a region store no daemon holds and refuses
// one that is held, leaving its regions intact.
func TestPurge(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	s, err := shm.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Map("r", 4096, 0o600, -1, -1); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"krfs", "purge", dir}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "in use") {
		t.Fatalf("purge of a held store: exit %d, stderr %q; want a refusal naming it in use", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "r")); err != nil {
		t.Fatalf("a refused purge touched the region: %v", err)
	}
	s.Close()
	out.Reset()
	errb.Reset()
	if code := run([]string{"krfs", "purge", dir}, &out, &errb); code != 0 || !strings.Contains(out.String(), "removed "+dir) {
		t.Fatalf("purge: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the store is still there: %v", err)
	}
}
