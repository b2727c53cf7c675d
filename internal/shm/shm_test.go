package shm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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

// smallTmpfs mounts a tmpfs of size bytes in a temporary directory (root
// only; skipped otherwise).
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// Rule: every byte of a region is reserved when it is created or grown; a
// region the filesystem cannot hold is refused with ENOSPC and leaves the
// store as it was; what is mapped never faults.
func TestRegionsAreReservedOrRefused(t *testing.T) {
	dir := smallTmpfs(t, "4m")
	s, err := Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Map("a", 3<<20, 0o600, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(s.Path("a"), &st); err != nil || st.Blocks*512 < 3<<20 {
		t.Fatalf("region a holds %d bytes of the filesystem, want all 3 MiB reserved (%v)", st.Blocks*512, err)
	}
	copy(r.Mem[1<<20:], "kept")
	// A new region that does not fit: refused, no file left.
	if _, err := s.Map("b", 2<<20, 0o600, -1, -1); !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "free") {
		t.Fatalf("a 2 MiB region in 1 MiB free: %v, want ENOSPC saying what is free", err)
	}
	if names, _ := s.Names(); len(names) != 1 {
		t.Fatalf("after the refused region, the store holds %v", names)
	}
	// Growing past the filesystem: refused, the old mapping stays usable.
	if _, err := s.Map("a", 5<<20, 0o600, -1, -1); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("growing to 5 MiB on a 4 MiB tmpfs: %v, want ENOSPC", err)
	}
	if got := s.Get("a"); got == nil || len(got.Mem) != 3<<20 || string(got.Mem[1<<20:1<<20+4]) != "kept" {
		t.Fatal("the refused growth lost the region's mapping or contents")
	}
	if _, _, _, size, _ := s.Stat("a"); size != 3<<20 {
		t.Fatalf("the refused growth left the file at %d bytes", size)
	}
	// Every page of what was granted can be written: a fault would kill
	// the test binary.
	for i := 0; i < len(r.Mem); i += 4096 {
		r.Mem[i] = 1
	}
	// A second store fills the rest: the first's pages are really held.
	s2, _ := Open(filepath.Join(dir, "store2"))
	defer s2.Close()
	if _, err := s2.Map("c", 2<<20, 0o600, -1, -1); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("another store's 2 MiB region: %v, want ENOSPC", err)
	}
}

func TestCheckFits(t *testing.T) {
	dir := smallTmpfs(t, "4m")
	store := filepath.Join(dir, "not", "yet")
	if err := CheckFits(store, 64<<30); !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "in all") {
		t.Fatalf("64 GiB on a 4 MiB tmpfs: %v, want ENOSPC saying the size", err)
	}
	if err := CheckFits(store, 2<<20); err != nil {
		t.Fatalf("2 MiB on an empty 4 MiB tmpfs: %v", err)
	}
	s, _ := Open(store)
	defer s.Close()
	if _, err := s.Map("mem", 3<<20, 0o600, -1, -1); err != nil {
		t.Fatal(err)
	}
	// A restart keeps its region: only the total size decides.
	if err := CheckFits(store, 3<<20); err != nil {
		t.Fatalf("a restart with its region present: %v", err)
	}
	if err := CheckFits(filepath.Join(dir, "other"), 3<<20); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("3 MiB more in 1 MiB free: %v, want ENOSPC", err)
	}
}

// Rule: a fault on region memory inside Guard is an error, not a crash.
func TestGuardTurnsAFaultIntoAnError(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Map("r", 1<<16, 0o600, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	if err := Guard(func() { r.Mem[100] = 1 }); err != nil {
		t.Fatalf("a write to reserved memory: %v", err)
	}
	// Shrink the file behind the store's back: the mapping's pages past
	// the new end now fault.
	if err := os.Truncate(s.Path("r"), 4096); err != nil {
		t.Fatal(err)
	}
	err = Guard(func() { r.Mem[1<<15] = 1 })
	if !errors.Is(err, syscall.EFAULT) {
		t.Fatalf("a write past the truncated end: %v, want EFAULT", err)
	}
	// Panics that are not faults pass through.
	defer func() {
		if recover() == nil {
			t.Fatal("Guard swallowed a panic that was not a memory fault")
		}
	}()
	Guard(func() { panic("not a fault") })
}
