package fs_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/fs"
)

// fsync and fdatasync succeed on every file a program writes (a write is
// complete when write() returns): regions, peer files, port files.
func TestFsyncSucceeds(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	dir := mountFake(t, f)
	if err := os.WriteFile(filepath.Join(dir, "regions/r"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ports/5"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"regions/r", "regions/mem", "peers/2/mem", "peers/1/mr/r", "peers/2/ports/5"} {
		file, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		if err := file.Sync(); err != nil {
			t.Errorf("fsync %s: %v", name, err)
		}
		if err := syscall.Fdatasync(int(file.Fd())); err != nil {
			t.Errorf("fdatasync %s: %v", name, err)
		}
		file.Close()
	}
	// sync DIR: fsync of a directory.
	for _, name := range []string{"regions", "."} {
		d, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(); err != nil {
			t.Errorf("fsync directory %s: %v", name, err)
		}
		d.Close()
	}
}

// sqlite3 creates, writes and reads back a database kept in a region, in
// its default (rollback journal) mode and with journal_mode=memory.
func TestSqliteDatabaseInARegion(t *testing.T) {
	bin, err := exec.LookPath("sqlite3")
	if err != nil {
		t.Skip("no sqlite3 binary")
	}
	f := newFake(1)
	dir := mountFakeWith(t, f, fs.Options{Timeout: 5 * time.Second})
	for _, mode := range []string{"delete", "memory", "truncate"} {
		db := filepath.Join(dir, "regions", "db-"+mode)
		script := "PRAGMA journal_mode=" + mode + ";" +
			"CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);" +
			"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<2000) INSERT INTO t SELECT i, hex(randomblob(64)) FROM n;" +
			"BEGIN; UPDATE t SET v='x' WHERE k%2=0; COMMIT;" +
			"SELECT count(*), sum(v='x') FROM t;"
		out, err := exec.Command(bin, "-bail", db, script).CombinedOutput()
		if err != nil {
			t.Fatalf("sqlite3 (journal_mode=%s) in regions/: %v\n%s", mode, err, out)
		}
		if !strings.Contains(string(out), "2000|1000") {
			t.Fatalf("sqlite3 (journal_mode=%s): %q, want 2000|1000", mode, out)
		}
		// Read back by a new process: the data is in the region.
		out, err = exec.Command(bin, "-bail", db, "PRAGMA integrity_check; SELECT count(*) FROM t;").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "ok\n2000") {
			t.Fatalf("sqlite3 reopen (journal_mode=%s): %q %v", mode, out, err)
		}
		// No journal region left behind.
		if _, err := os.Stat(db + "-journal"); !errors.Is(err, os.ErrNotExist) && mode == "delete" {
			t.Fatalf("journal left behind: %v", err)
		}
	}
}

// mmap: the kernel refuses MAP_SHARED of a direct_io file with ENODEV
// (the daemon never sees the call); MAP_PRIVATE it allows, and each page
// is then read from the region when first touched.
func TestMmapOfPeerFiles(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 8192)
	dir := mountFake(t, f)
	if err := os.WriteFile(filepath.Join(dir, "peers/2/mem"), []byte("peer bytes"), 0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"peers/2/mem", "regions/mem"} {
		file, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := syscall.Mmap(int(file.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_SHARED); !errors.Is(err, syscall.ENODEV) {
			t.Errorf("mmap MAP_SHARED %s: %v, want ENODEV", name, err)
		}
		m, err := syscall.Mmap(int(file.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_PRIVATE)
		if err != nil {
			t.Errorf("mmap MAP_PRIVATE %s: %v", name, err)
		} else {
			if name == "peers/2/mem" && string(m[:10]) != "peer bytes" {
				t.Errorf("MAP_PRIVATE of %s reads %q", name, m[:10])
			}
			syscall.Munmap(m)
		}
		file.Close()
	}
}
