package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPeerFilesFollowThePeer (issue 12, items 1 and 2): on a host that
// already used a peer, peers/<gid>/mr/ shows a region the peer creates
// afterwards; an open descriptor follows the region as the peer grows,
// shrinks and removes it (reads past the new end give 0 bytes, a removed
// region ENOENT); with the meta service killed, ls peers shows the last
// list, a known peer's files keep working and an unknown peer fails
// within the timeout.
func TestPeerFilesFollowThePeer(t *testing.T) {
	c := newCluster(t, 2)
	h1, h2 := c.mnt(1), c.mnt(2)
	c.mustSh(t, "head -c 8 "+h1+"/peers/2/mem >/dev/null && ls "+h1+"/peers/2/mr >/dev/null")

	t.Run("new region shows", func(t *testing.T) {
		c.mustSh(t, fmt.Sprintf(": > %[1]s/regions/r1 && truncate -s 4096 %[1]s/regions/r1 && printf hello | dd of=%[1]s/regions/r1 conv=notrunc status=none", h2))
		out := c.mustSh(t, "ls "+h1+"/peers/2/mr")
		if !strings.Contains(out, "r1") {
			t.Fatalf("peers/2/mr on host 1 after host 2 created r1: %q", out)
		}
		if out := c.mustSh(t, "head -c 5 "+h1+"/peers/2/mr/r1"); out != "hello" {
			t.Fatalf("r1 read from host 1: %q", out)
		}
	})

	t.Run("open descriptor follows resizes", func(t *testing.T) {
		out := c.mustSh(t, fmt.Sprintf(`python3 - <<'PY'
import errno, os
fd = os.open(%[1]q, os.O_RDWR)
assert os.pread(fd, 5, 0) == b"hello", "first read"
os.truncate(%[2]q, 8192)
with open(%[2]q, "r+b") as f:
    f.seek(6000); f.write(b"grown")
got = os.pread(fd, 5, 6000)
assert got == b"grown", "read past the old end after growth: %%r" %% got
assert os.pread(fd, 16, 8192) == b"", "read at the end"
os.truncate(%[2]q, 4096)
got = os.pread(fd, 16, 4096)
assert got == b"", "read at the new end after shrinking: %%r" %% got
os.unlink(%[2]q)
try:
    os.pread(fd, 5, 0)
    raise SystemExit("read of a removed region succeeded")
except OSError as e:
    assert e.errno == errno.ENOENT, "removed region: %%s" %% e
print("ok")
PY`, h1+"/peers/2/mr/r1", h2+"/regions/r1"))
		if strings.TrimSpace(out) != "ok" {
			t.Fatalf("python: %s", out)
		}
	})

	t.Run("meta service down", func(t *testing.T) {
		before := c.mustSh(t, "ls "+h1+"/peers")
		c.mustSh(t, "kill -9 $(cat "+c.dir+"/meta.pid)")
		after, err := c.sh(10*time.Second, "ls "+h1+"/peers")
		if err != nil || after != before {
			t.Fatalf("ls peers with the meta service down: %q %v, want %q", after, err, before)
		}
		c.mustSh(t, "printf known | dd of="+h1+"/peers/2/mem bs=1 seek=100 conv=notrunc status=none")
		if out := c.mustSh(t, "dd if="+h1+"/peers/2/mem bs=1 skip=100 count=5 status=none"); out != "known" {
			t.Fatalf("read of a known peer with the meta service down: %q", out)
		}
		t0 := time.Now()
		out, err := c.sh(10*time.Second, "cat "+h1+"/peers/77/mem")
		if err == nil {
			t.Fatalf("an unknown peer worked with the meta service down: %q", out)
		}
		if el := time.Since(t0); el > 5*time.Second {
			t.Fatalf("an unknown peer failed after %v, want within the timeout", el)
		}
		t.Logf("unknown peer with the meta service down: %s", strings.TrimSpace(out))
	})
}
