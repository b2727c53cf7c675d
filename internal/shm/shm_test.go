package shm

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
)

func TestMapSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Map("mem", 8192, 0o640, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Mem[4000:], "persist me")
	// Grow: contents stay.
	r, err = s.Map("mem", 16384, 0o640, -1, -1)
	if err != nil || len(r.Mem) != 16384 || !bytes.Equal(r.Mem[4000:4010], []byte("persist me")) {
		t.Fatalf("resize: %v len %d", err, len(r.Mem))
	}
	s.Close()
	// A new store over the same directory (a restarted daemon) finds it.
	s2, _ := Open(dir)
	names, _ := s2.Names()
	if len(names) != 1 || names[0] != "mem" {
		t.Fatalf("names after reopen: %v", names)
	}
	r2, err := s2.Map("mem", -1, 0, -1, -1)
	if err != nil || len(r2.Mem) != 16384 || string(r2.Mem[4000:4010]) != "persist me" {
		t.Fatalf("reopen: %v", err)
	}
	if mode, _, _, _, _ := s2.Stat("mem"); mode != 0o640 {
		t.Fatalf("mode %v", mode)
	}
	if err := s2.Remove("mem"); err != nil {
		t.Fatal(err)
	}
	if n, _ := s2.Names(); len(n) != 0 {
		t.Fatalf("after remove: %v", n)
	}
	for _, bad := range []string{"", ".x", "a/b", "this-name-is-way-too-long-for-a-region"} {
		if _, err := s2.Map(bad, 10, 0o600, -1, -1); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Map(%q): %v", bad, err)
		}
	}
}
