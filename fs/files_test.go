package fs_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/fusetest"
)

// A local region file behaves like a file: a shell redirection truncates
// it and writes it, a write past the end grows it, a new region is listed
// at once, and peers (peers/<self>/mr/) see the new size.
func TestLocalRegionFilesBehaveLikeFiles(t *testing.T) {
	f := newFake(1)
	dir := mountFakeWith(t, f, fs.Options{Timeout: time.Second, MaxRegionSize: 1 << 20})

	r1 := filepath.Join(dir, "regions/r1")
	if err := os.WriteFile(r1, make([]byte, 4096), 0o644); err != nil {
		t.Fatalf("create r1: %v", err)
	}
	// echo x > regions/r1: O_TRUNC, then a 2-byte write.
	if err := os.WriteFile(r1, []byte("x\n"), 0); err != nil {
		t.Fatalf("echo x > regions/r1: %v", err)
	}
	if b, err := os.ReadFile(r1); err != nil || string(b) != "x\n" {
		t.Fatalf("regions/r1 = %q, %v; want \"x\\n\"", b, err)
	}
	// echo hi > regions/new: created, written, listed at once.
	if err := os.WriteFile(filepath.Join(dir, "regions/new"), []byte("hi\n"), 0o644); err != nil {
		t.Fatalf("echo hi > regions/new: %v", err)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "regions"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range ents {
		names[e.Name()] = true
	}
	if !names["new"] || !names["r1"] || !names["mem"] {
		t.Fatalf("ls regions = %v, want mem, new, r1", names)
	}
	// An empty region is listed too.
	if err := os.WriteFile(filepath.Join(dir, "regions/empty"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "regions")); len(ents) != 4 {
		t.Fatalf("ls regions after creating an empty one: %d entries, want 4", len(ents))
	}
	// Appending grows the region; peers see the new size.
	file, err := os.OpenFile(filepath.Join(dir, "regions/new"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := file.Write([]byte("more\n")); err != nil {
		t.Fatalf("append: %v", err)
	}
	file.Close()
	// A write far past the end grows it with zeros in between.
	file, err = os.OpenFile(filepath.Join(dir, "regions/new"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = file.WriteAt([]byte("end"), 10000)
	file.Close()
	if err != nil {
		t.Fatalf("write past the end: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "peers/1/mr/new"))
	if err != nil || len(b) != 10003 || string(b[:8]) != "hi\nmore\n" || string(b[10000:]) != "end" || b[5000] != 0 {
		t.Fatalf("peers/1/mr/new: %d bytes %q..., %v", len(b), b[:min(8, len(b))], err)
	}
	// Beyond MaxRegionSize: EFBIG, by truncate or by write; a write across
	// it writes the bytes below it.
	if err := os.Truncate(r1, 2<<20); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("truncate past the limit: %v, want EFBIG", err)
	}
	file, err = os.OpenFile(r1, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if n, err := syscall.Pwrite(int(file.Fd()), make([]byte, 8), 1<<20-4); n != 4 || err != nil {
		t.Fatalf("write across the limit: %d, %v; want the 4 bytes below it", n, err)
	}
	if _, err := file.WriteAt([]byte("x"), 1<<20); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("write at the limit: %v, want EFBIG", err)
	}
	if st, err := os.Stat(r1); err != nil || st.Size() != 1<<20 {
		t.Fatalf("r1 after writes at the limit: %v, %v", st, err)
	}
}

// peers/ mirrors the cluster: every change of its entries fails with
// EROFS instead of reporting success and doing nothing.
func TestPeersIsReadOnly(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	dir := mountFake(t, f)
	p := func(s string) string { return filepath.Join(dir, s) }
	if _, err := os.Stat(p("peers/2/mem")); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		what string
		err  error
	}{
		{"rm peers/2/mem", os.Remove(p("peers/2/mem"))},
		{"rm peers/2/info", os.Remove(p("peers/2/info"))},
		{"rmdir peers/2/mr", syscall.Rmdir(p("peers/2/mr"))},
		{"rmdir peers/2", syscall.Rmdir(p("peers/2"))},
		{"mkdir peers/9", os.Mkdir(p("peers/9"), 0o755)},
		{"mkdir peers/2/mr/x", os.Mkdir(p("peers/2/mr/x"), 0o755)},
		{"mv peers/2/mem peers/2/mem2", os.Rename(p("peers/2/mem"), p("peers/2/mem2"))},
		{"touch peers/2/mr/new", func() error { _, err := os.Create(p("peers/2/mr/new")); return err }()},
		{"ln -s peers/2/x", os.Symlink("mem", p("peers/2/x"))},
		{"rm stats", os.Remove(p("stats"))},
		{"rmdir peers", syscall.Rmdir(p("peers"))},
	}
	for _, c := range checks {
		if !errors.Is(c.err, syscall.EROFS) {
			t.Errorf("%s: %v, want EROFS", c.what, c.err)
		}
	}
	if _, err := os.Stat(p("peers/2/mem")); err != nil {
		t.Fatalf("peers/2/mem after refused changes: %v", err)
	}
	if b, err := os.ReadFile(p("peers/2/mem")); err != nil || len(b) != 4096 {
		t.Fatalf("read peers/2/mem: %d, %v", len(b), err)
	}
}

// mountFakeWith mounts b with options o until the test ends.
func mountFakeWith(t *testing.T, b fs.Backend, o fs.Options) string {
	t.Helper()
	return fusetest.Mount(t, b, o)
}

// A port opened with O_NONBLOCK gives EAGAIN when no message is queued,
// and the message once one is; a send to an unbound port is refused.
func TestPortNonBlockingRead(t *testing.T) {
	f := newFake(1)
	dir := mountFake(t, f)
	port := filepath.Join(dir, "ports/9")
	pf, err := os.Create(port)
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	fd, err := syscall.Open(port, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	buf := make([]byte, 64)
	if _, err := syscall.Read(fd, buf); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("non-blocking read of an empty port: %v, want EAGAIN", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "peers/1/ports/9"), []byte("ping"), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := syscall.Read(fd, buf); err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("non-blocking read after a send: %q %v", buf[:max(n, 0)], err)
	}
	if err := os.WriteFile(filepath.Join(dir, "peers/1/ports/10"), []byte("x"), 0); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("send to an unbound port: %v, want ECONNREFUSED", err)
	}
}

// A generated file reports the size of its text to stat before any open,
// and the same size to fstat through a handle, so stat, lstat and fstat
// agree whatever the kernel has cached (fstest compares all three).
func TestGeneratedFileSizeWithoutOpen(t *testing.T) {
	f := newFake(1)
	f.addPeer(2, 4096)
	dir := mountFake(t, f)
	p := filepath.Join(dir, "peers/2/info")
	before, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	text, err := io.ReadAll(fh)
	if err != nil {
		t.Fatal(err)
	}
	opened, err := fh.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if len(text) == 0 || before.Size() != int64(len(text)) || opened.Size() != int64(len(text)) {
		t.Fatalf("info: lstat before open %d, fstat %d, text %d bytes", before.Size(), opened.Size(), len(text))
	}
	if end, err := fh.Seek(0, io.SeekEnd); err != nil || end != int64(len(text)) {
		t.Fatalf("SEEK_END = %d, %v; want %d", end, err, len(text))
	}
}
