package main

import (
	"bytes"
	"fmt"
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

// Rule (issue 31.6): krfs purge --list shows every store under /dev/shm
// with the gid and address it remembers, its memory and whether a daemon
// holds it.
func TestPurgeList(t *testing.T) {
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		t.Skip("no /dev/shm")
	}
	gid := uint32(16000000 + os.Getpid()%700000)
	dir := shm.DefaultDir(gid)
	s, err := shm.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); shm.Purge(dir) })
	if _, err := s.Map("mem", 8192, 0o600, -1, -1); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveIdentity(shm.Identity{GID: gid, Listen: "10.9.8.7:4791"}); err != nil {
		t.Fatal(err)
	}
	list := func() string {
		var out, errb bytes.Buffer
		if code := run([]string{"krfs", "purge", "--list"}, &out, &errb); code != 0 {
			t.Fatalf("purge --list: exit %d, %q", code, errb.String())
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(line, dir+" ") {
				return strings.Join(strings.Fields(line), " ")
			}
		}
		t.Fatalf("purge --list lacks %s:\n%s", dir, out.String())
		return ""
	}
	want := fmt.Sprintf("%s %d 10.9.8.7:4791 8192 in use by pid %d", dir, gid, os.Getpid())
	if got := list(); got != want {
		t.Fatalf("held store: %q, want %q", got, want)
	}
	s.Close()
	if got := list(); got != fmt.Sprintf("%s %d 10.9.8.7:4791 8192 free", dir, gid) {
		t.Fatalf("free store: %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "mem")); err != nil {
		t.Fatalf("--list removed something: %v", err)
	}
}
