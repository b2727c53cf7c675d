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
		// python3's sqlite3 module reads it and writes more.
		if py, err := exec.LookPath("python3"); err == nil {
			out, err := exec.Command(py, "-c", `import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("INSERT INTO t(v) VALUES ('py')")
db.commit()
print(db.execute("SELECT count(*) FROM t").fetchone()[0])`, db).CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "2001" {
				t.Fatalf("python3 sqlite3 (journal_mode=%s): %q %v", mode, out, err)
			}
		}
		// No journal region left behind.
		if _, err := os.Stat(db + "-journal"); !errors.Is(err, os.ErrNotExist) && mode == "delete" {
			t.Fatalf("journal left behind: %v", err)
		}
	}
}

// mmap: the kernel refuses MAP_SHARED of a direct_io file with ENODEV
// (the daemon never sees the call; the mount does not ask for
// FUSE_DIRECT_IO_ALLOW_MMAP), read-only or not; MAP_PRIVATE it allows,
// and each page is then read from the region when first touched (here:
// mlock'ed, so never dropped and read again): a later change on the peer
// is not seen through the mapping, while pread sees it.
func TestMmapOfPeerFiles(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 8192)
	f.setPeerRegion(2, "r", make([]byte, 4096))
	dir := mountFake(t, f)
	if err := os.WriteFile(filepath.Join(dir, "peers/2/mem"), []byte("peer bytes"), 0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"peers/2/mr/r", "regions/mem"} {
		file, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := syscall.Mmap(int(file.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); !errors.Is(err, syscall.ENODEV) {
			t.Errorf("mmap MAP_SHARED PROT_WRITE %s: %v, want ENODEV", name, err)
		}
		file.Close()
	}
	file, err := os.Open(filepath.Join(dir, "peers/2/mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	m, err := syscall.Mmap(int(file.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	faultIn(t, m)
	if string(m[:10]) != "peer bytes" {
		t.Fatalf("MAP_PRIVATE reads %q", m[:10])
	}
	f.mu.Lock()
	peerMem := f.peers[2]["mem"]
	f.mu.Unlock()
	peerMem.mu.Lock()
	copy(peerMem.data, "new  bytes") // the peer writes
	peerMem.mu.Unlock()
	if string(m[:10]) != "peer bytes" {
		t.Errorf("MAP_PRIVATE mapping shows %q after the peer wrote: not the copy read at the first touch", m[:10])
	}
	buf := make([]byte, 10)
	if _, err := file.ReadAt(buf, 0); err != nil || string(buf) != "new  bytes" {
		t.Errorf("pread after the peer wrote: %q %v", buf, err)
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
			faultIn(t, m)
			if name == "peers/2/mem" && string(m[:10]) != "new  bytes" { // a new mapping reads the bytes as they are now
				t.Errorf("MAP_PRIVATE of %s reads %q", name, m[:10])
			}
			syscall.Munmap(m)
		}
		file.Close()
	}
}

// faultIn reads m's pages in and keeps them (mlock) inside a system
// call. A page fault on a mapping of this process's own FUSE mount, taken
// by Go code, blocks its thread where the runtime cannot stop it: a
// garbage collection then waits for it while the FUSE server, stopped by
// the collection, cannot answer the READ (a deadlock). Locked, the pages
// are never dropped and read again, so Go code may read them.
func faultIn(t *testing.T, m []byte) {
	t.Helper()
	if err := syscall.Mlock(m); err != nil {
		t.Fatalf("mlock: %v", err)
	}
	t.Cleanup(func() { syscall.Munlock(m) })
}

// Errnos as Linux tools expect them in regions/: EPERM for link, symlink,
// mknod and mkdir; posix_fallocate's fallocate(mode 0) succeeds (grows a
// region), other modes EOPNOTSUPP; truncate(2) by path resizes;
// O_APPEND of a fixed-size file is refused at open with EINVAL.
func TestRegionErrnos(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	dir := mountFakeWith(t, f, fs.Options{Timeout: time.Second, MaxRegionSize: 1 << 20})
	r := filepath.Join(dir, "regions/r")
	if err := os.WriteFile(r, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(r, filepath.Join(dir, "regions/l")); !errors.Is(err, syscall.EPERM) {
		t.Errorf("link in regions/: %v, want EPERM", err)
	}
	if err := os.Symlink("r", filepath.Join(dir, "regions/s")); !errors.Is(err, syscall.EPERM) {
		t.Errorf("symlink in regions/: %v, want EPERM", err)
	}
	if err := syscall.Mknod(filepath.Join(dir, "regions/n"), syscall.S_IFIFO|0o644, 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("mknod in regions/: %v, want EPERM", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "regions/d"), 0o755); !errors.Is(err, syscall.EPERM) {
		t.Errorf("mkdir in regions/: %v, want EPERM", err)
	}
	// truncate(2), by path.
	if err := os.Truncate(r, 8192); err != nil {
		t.Fatalf("truncate regions/r: %v", err)
	}
	if st, err := os.Stat(r); err != nil || st.Size() != 8192 {
		t.Fatalf("after truncate: %v %v", st, err)
	}
	// fallocate mode 0 (posix_fallocate) grows the region, within it is a
	// no-op; KEEP_SIZE, PUNCH_HOLE...: EOPNOTSUPP.
	file, err := os.OpenFile(r, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if err := syscall.Fallocate(int(file.Fd()), 0, 0, 4096); err != nil {
		t.Errorf("fallocate inside regions/r: %v", err)
	}
	if err := syscall.Fallocate(int(file.Fd()), 0, 8000, 10000); err != nil {
		t.Errorf("fallocate growing regions/r: %v", err)
	}
	if st, _ := file.Stat(); st.Size() != 18000 {
		t.Errorf("size after fallocate to 18000: %d", st.Size())
	}
	if err := syscall.Fallocate(int(file.Fd()), 0, 0, 2<<20); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("fallocate past the largest region: %v, want EFBIG", err)
	}
	const keepSize, punchHole = 1, 2
	if err := syscall.Fallocate(int(file.Fd()), keepSize|punchHole, 0, 4096); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("fallocate PUNCH_HOLE: %v, want EOPNOTSUPP", err)
	}
	// Peer files and mem keep their size: fallocate within succeeds, past
	// the end EFBIG.
	for _, name := range []string{"peers/2/mem", "regions/mem", "peers/1/mr/r"} {
		pf, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Fallocate(int(pf.Fd()), 0, 0, 4096); err != nil {
			t.Errorf("fallocate inside %s: %v", name, err)
		}
		if err := syscall.Fallocate(int(pf.Fd()), 0, 0, 1<<30); !errors.Is(err, syscall.EFBIG) {
			t.Errorf("fallocate past the end of %s: %v, want EFBIG", name, err)
		}
		pf.Close()
		if _, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_APPEND, 0); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("open O_APPEND %s: %v, want EINVAL", name, err)
		}
		// A resize of a fixed-size file: EPERM.
		if err := os.Truncate(filepath.Join(dir, name), 100); !errors.Is(err, syscall.EPERM) {
			t.Errorf("truncate %s to 100: %v, want EPERM", name, err)
		}
	}
	// O_APPEND of a region that grows appends.
	af, err := os.OpenFile(r, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("open O_APPEND regions/r: %v", err)
	}
	if _, err := af.Write([]byte("tail")); err != nil {
		t.Errorf("append to regions/r: %v", err)
	}
	af.Close()
	if st, _ := os.Stat(r); st.Size() != 18004 {
		t.Errorf("size after append: %d, want 18004", st.Size())
	}
}

// A refused create or resize leaves nothing behind: truncate -s of a new
// region to a size the backend refuses removes the region it created.
func TestRefusedResizeLeavesNothing(t *testing.T) {
	f := newFake(1)
	f.refuseAbove = 1 << 20
	dir := mountFakeWith(t, f, fs.Options{Timeout: time.Second, MaxRegionSize: 1 << 30})
	for _, tc := range []struct {
		size int64
		want syscall.Errno
	}{{30 << 20, syscall.ENOSPC}, {2 << 30, syscall.EFBIG}} {
		huge := filepath.Join(dir, "regions/huge")
		// truncate(1): open(O_CREAT|O_WRONLY), then ftruncate.
		file, err := os.OpenFile(huge, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		err = file.Truncate(tc.size)
		file.Close()
		if !errors.Is(err, tc.want) {
			t.Errorf("truncate -s %d regions/huge: %v, want %v", tc.size, err, tc.want)
		}
		if _, err := os.Stat(huge); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after a refused truncate -s %d: regions/huge is still there (%v)", tc.size, err)
		}
		ents, _ := os.ReadDir(filepath.Join(dir, "regions"))
		if len(ents) != 1 {
			t.Errorf("ls regions after a refused create: %d entries, want 1 (mem)", len(ents))
		}
	}
	// An existing region whose growth is refused keeps its size and data.
	keep := filepath.Join(dir, "regions/keep")
	if err := os.WriteFile(keep, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	file, err := os.OpenFile(keep, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := file.Truncate(30 << 20); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("growing regions/keep: %v, want ENOSPC", err)
	}
	file.Close()
	if b, err := os.ReadFile(keep); err != nil || string(b) != "kept" {
		t.Errorf("regions/keep after a refused growth: %q %v", b, err)
	}
}

// mtime and ctime move on local writes and resizes; utimensat sets them on
// regions and fails with EPERM on peer files; a peer file's mtime is its
// last write through this node.
func TestTimes(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	dir := mountFake(t, f)
	r := filepath.Join(dir, "regions/r")
	if err := os.WriteFile(r, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	st0, err := os.Stat(r)
	if err != nil {
		t.Fatal(err)
	}
	// utimensat: an explicit time (touch -d, rsync -t).
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(r, old, old); err != nil {
		t.Fatalf("utimensat regions/r: %v", err)
	}
	if st, _ := os.Stat(r); !st.ModTime().Equal(old) {
		t.Fatalf("mtime after utimensat: %v, want %v", st.ModTime(), old)
	}
	// A write moves mtime past the time set and past the creation.
	before := time.Now()
	if err := os.WriteFile(r, []byte("later"), 0); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(r)
	if st.ModTime().Before(before.Add(-time.Second)) || !st.ModTime().After(old) || st.ModTime().Before(st0.ModTime()) {
		t.Fatalf("mtime after a write: %v (created %v, write at %v)", st.ModTime(), st0.ModTime(), before)
	}
	// Peer files: utimensat is EPERM; a write through this node is the mtime.
	pm := filepath.Join(dir, "peers/2/mem")
	if err := os.Chtimes(pm, old, old); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("utimensat peers/2/mem: %v, want EPERM", err)
	}
	mt0, _ := os.Stat(pm)
	w, err := os.OpenFile(pm, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("x"), 10); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if mt1, _ := os.Stat(pm); !mt1.ModTime().After(mt0.ModTime()) {
		t.Fatalf("peers/2/mem mtime %v after a write, was %v", mt1.ModTime(), mt0.ModTime())
	}
}

// statfs reports the region store's capacity and the regions' use, so df
// shows krfs.
func TestStatfs(t *testing.T) {
	f := newFake(1)
	dir := mountFake(t, f)
	if err := os.WriteFile(filepath.Join(dir, "regions/r"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".", "regions/r", "peers", "stats"} {
		var st syscall.Statfs_t
		if err := syscall.Statfs(filepath.Join(dir, p), &st); err != nil {
			t.Fatal(err)
		}
		used := (st.Blocks - st.Bfree) * uint64(st.Bsize)
		if st.Blocks*uint64(st.Bsize) != 64<<20 || used != 1<<20+4096 || st.Bavail*uint64(st.Bsize) != 60<<20 || st.Files != 50 || st.Ffree != 48 {
			t.Errorf("statfs %s: %d blocks of %d, %d used bytes, %d avail blocks, files %d free %d; want 64 MiB, 1 MiB+4 KiB used (mem and r), 60 MiB avail, 50 files, 48 free",
				p, st.Blocks, st.Bsize, used, st.Bavail, st.Files, st.Ffree)
		}
	}
	if out, err := exec.Command("df", "-B1", dir).CombinedOutput(); err != nil || !strings.Contains(string(out), "67108864") {
		t.Errorf("df: %q %v", out, err)
	}
}

// asUser runs a shell command as uid/gid 65534 (nobody) and returns its
// combined output.
func asUser(t *testing.T, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Ports are owned: the binder owns ports/N, 0600, and chmod/chown are
// honoured; a peer's port takes the owner and write bits of the peer's
// default region; stats.json shows rkeys to root only.
func TestPortsAreOwned(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	f.peers[2]["mem"].info.Mode = 0o644
	dir := mountFakeWith(t, f, fs.Options{Timeout: time.Second, AllowOther: true, DefaultPermissions: true})
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	port := filepath.Join(dir, "ports/7")
	if err := os.WriteFile(port, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(port)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("ports/7 bound by root: mode %v uid %d, want 0600 root", st.Mode(), st.Sys().(*syscall.Stat_t).Uid)
	}
	if out, err := asUser(t, "cat "+port); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("nobody reads root's port: %q %v, want Permission denied", out, err)
	}
	if err := os.Chmod(port, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(port, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	st, _ = os.Stat(port)
	if st.Mode().Perm() != 0o644 || st.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Fatalf("after chmod 644, chown nobody: mode %v uid %d", st.Mode(), st.Sys().(*syscall.Stat_t).Uid)
	}
	if out, err := asUser(t, "chmod 600 "+port); err != nil {
		t.Fatalf("the owner's chmod: %q %v", out, err)
	}
	// peers/2/ports/7: peers/2/mem is 0644 root: root sends, nobody does not.
	pp := filepath.Join(dir, "peers/2/ports/7")
	if st, err := os.Stat(pp); err != nil || st.Mode().Perm() != 0o200 {
		t.Fatalf("peers/2/ports/7: %v %v, want mode 0200", st, err)
	}
	if out, err := asUser(t, "echo hi > "+pp); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("nobody sends to a port of a peer whose mem is 0644: %q %v, want Permission denied", out, err)
	}
	// stats.json: root sees the rkeys, nobody does not.
	if b, err := os.ReadFile(filepath.Join(dir, "stats.json")); err != nil || !strings.Contains(string(b), "rkey") {
		t.Fatalf("root's stats.json: %q %v, want the rkeys", b, err)
	}
	if out, err := asUser(t, "cat "+filepath.Join(dir, "stats.json")); err != nil || strings.Contains(out, "rkey") || !strings.Contains(out, "connects") {
		t.Fatalf("nobody's stats.json: %q %v, want no rkey", out, err)
	}
}

// The stale-region rule: a read, a write or an atomic on a peer's region
// that the peer refuses (a region re-registered after a restart: a new
// rkey) reads the directory again and is retried once; a second refusal
// is returned.
func TestStaleRegionRetriedOnce(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	f.setPeerRegion(2, "r", make([]byte, 4096))
	dir := mountFake(t, f)
	file, err := os.OpenFile(filepath.Join(dir, "peers/2/mr/r"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	stale := func(n int) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.stale = n
		return f.dirReads
	}
	dirReads := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.dirReads
	}
	ops := []struct {
		name string
		do   func() error
	}{
		{"write", func() error { _, err := file.WriteAt([]byte("abcdefgh"), 64); return err }},
		{"read", func() error { _, err := file.ReadAt(make([]byte, 8), 64); return err }},
		{"fetch-add", func() error {
			_, err := ioctlAtomic(file, fs.IoctlFetchAdd, &fs.AtomicArg{Offset: 128, A: 1}, &fs.AtomicArg{})
			return err
		}},
		{"compare-and-swap", func() error {
			_, err := ioctlAtomic(file, fs.IoctlCompareAndSwap, &fs.AtomicArg{Offset: 136, A: 0, B: 7}, &fs.AtomicArg{})
			return err
		}},
	}
	for _, op := range ops {
		before := stale(1)
		if err := op.do(); err != nil {
			t.Errorf("%s refused once as stale: %v, want success after one retry", op.name, err)
		}
		if got := dirReads() - before; got != 1 {
			t.Errorf("%s refused once: %d directory reads, want 1", op.name, got)
		}
		stale(2)
		if err := op.do(); !errors.Is(err, syscall.EIO) {
			t.Errorf("%s refused twice: %v, want EIO (one retry only)", op.name, err)
		}
	}
	stale(0)
	// Exactly one FETCH_ADD and one CMP_SWAP acted.
	b := make([]byte, 16)
	if _, err := file.ReadAt(b, 128); err != nil || b[0] != 1 || b[8] != 7 {
		t.Fatalf("words after the atomics: %v %v, want 1 and 7", b, err)
	}
}

// ls peers/G/mr of a peer back from a restart or an outage: a directory
// read refused once (its old key) is read again, not an EIO.
func TestPeerDirectoryRefusedOnceIsReadAgain(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	f.setPeerRegion(2, "r", make([]byte, 100))
	dir := mountFake(t, f)
	f.mu.Lock()
	f.staleDir = 1
	f.mu.Unlock()
	ents, err := os.ReadDir(filepath.Join(dir, "peers/2/mr"))
	if err != nil || len(ents) != 2 {
		t.Fatalf("ls peers/2/mr after a refused directory read: %v %v, want mem and r", ents, err)
	}
	f.mu.Lock()
	f.staleDir = 1
	f.mu.Unlock()
	if st, err := os.Stat(filepath.Join(dir, "peers/2/mr/r")); err != nil || st.Size() != 100 {
		t.Fatalf("stat peers/2/mr/r after a refused directory read: %v %v", st, err)
	}
}
