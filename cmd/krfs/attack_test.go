package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The attack of issue 31.1 through the command line: nobody prepares the
// store directory of gid 7701 with links to root's files; root's krfs
// mount --gid 7701 refuses it in one line, before anything is mounted,
// and root's files are untouched.
func TestMountRefusesAPreparedStore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to nobody needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	base := t.TempDir()
	os.Chmod(base, 0o1777)
	secrets := t.TempDir()
	victim, secret := filepath.Join(secrets, "config"), filepath.Join(secrets, "shadow")
	os.WriteFile(victim, []byte("root's config\n"), 0o644)
	os.WriteFile(secret, []byte("root's secret\n"), 0o600)
	dir := filepath.Join(base, "krfs-7701")
	os.Mkdir(dir, 0o755)
	os.Chown(dir, 65534, 65534)
	os.Symlink(victim, filepath.Join(dir, ".lock"))
	os.Symlink(secret, filepath.Join(dir, "mem"))
	probe, err := openSoftnic(t, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := probe.Addr().String()
	probe.Close()
	var out, errb bytes.Buffer
	code := run([]string{"krfs", "mount", t.TempDir(), "--gid", "7701", "--shm-dir", dir, "--listen", listen, "--meta", "127.0.0.1:9"}, &out, &errb)
	last := errb.String()[strings.LastIndex(strings.TrimSuffix(errb.String(), "\n"), "\n")+1:]
	if code == 0 || !strings.HasPrefix(last, "krfs mount: ") || !strings.Contains(last, "belongs to uid 65534") {
		t.Fatalf("krfs mount on a prepared store: exit %d, %q", code, errb.String())
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's config\n" {
		t.Fatalf("root's file was written: %q", b)
	}
	if st, _ := os.Stat(secret); st.Size() != int64(len("root's secret\n")) {
		t.Fatalf("root's secret was grown to %d bytes", st.Size())
	}
}
