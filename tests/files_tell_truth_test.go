package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/node"
)

// Local regions are files, peers/ is read-only, ports push back per port,
// and a second daemon on one region directory is refused: as a user sees
// them across hosts (issue 12, items 3, 4, 5, 6).
func TestFilesTellTheTruth(t *testing.T) {
	c := newCluster(t, 2)
	h1, h2 := c.mnt(1), c.mnt(2)

	t.Run("local regions are files", func(t *testing.T) {
		c.mustSh(t, "echo hi > "+h1+"/regions/new")
		if out := c.mustSh(t, "ls "+h1+"/regions"); !strings.Contains(out, "new") {
			t.Fatalf("ls regions right after echo hi > regions/new: %q", out)
		}
		if out := c.mustSh(t, "cat "+h2+"/peers/1/mr/new"); out != "hi\n" {
			t.Fatalf("host 2 reads peers/1/mr/new = %q, want \"hi\\n\"", out)
		}
		// O_TRUNC then 2 bytes: a 2-byte region.
		c.mustSh(t, "echo x > "+h1+"/regions/new")
		if out := c.mustSh(t, "stat -c %s "+h1+"/regions/new; cat "+h1+"/regions/new"); out != "2\nx\n" {
			t.Fatalf("after echo x > regions/new: %q, want size 2 and \"x\\n\"", out)
		}
		// A write past the end grows it.
		c.mustSh(t, "printf end | dd of="+h1+"/regions/new bs=1 seek=10000 conv=notrunc status=none")
		if out := c.mustSh(t, "stat -c %s "+h1+"/regions/new"); strings.TrimSpace(out) != "10003" {
			t.Fatalf("size after a write at 10000: %q, want 10003", out)
		}
		// A bad name is refused and leaves nothing.
		if out, err := c.sh(10*time.Second, "echo x > '"+h1+"/regions/bad name'"); err == nil {
			t.Fatalf("a region named 'bad name' was created: %s", out)
		}
		if _, err := os.Stat(filepath.Join(c.dir, "shm-h1", "bad name")); !os.IsNotExist(err) {
			t.Fatalf("refused region left a file: %v", err)
		}
	})

	t.Run("peers is read-only", func(t *testing.T) {
		for _, line := range []string{
			"rm " + h1 + "/peers/2/mem",
			"rmdir " + h1 + "/peers/2/mr",
			"mkdir " + h1 + "/peers/2/mr/x",
			"mv " + h1 + "/peers/2/info " + h1 + "/peers/2/info2",
			"touch " + h1 + "/peers/2/mr/new",
		} {
			out, err := c.sh(10*time.Second, line)
			if err == nil || !strings.Contains(out, "Read-only file system") {
				t.Errorf("%s: %v %q, want a Read-only file system error", line, err, out)
			}
		}
		if out := c.mustSh(t, "stat -c %s "+h1+"/peers/2/mem"); strings.TrimSpace(out) == "" {
			t.Fatal("peers/2/mem gone")
		}
	})

	t.Run("ports push back per port", func(t *testing.T) {
		c.mustSh(t, "touch "+h1+"/ports/5 "+h1+"/ports/6")
		for i := range 16 { // the default depth
			c.mustSh(t, fmt.Sprintf("printf m%d > %s/peers/1/ports/5", i, h2))
		}
		// Port 5 is full: the next write retries until the timeout, then
		// EAGAIN; port 6 works meanwhile.
		done := make(chan string, 1)
		go func() {
			out, err := c.sh(30*time.Second, "printf more > "+h2+"/peers/1/ports/5")
			done <- fmt.Sprintf("%v: %s", err, out)
		}()
		c.mustSh(t, "printf other > "+h2+"/peers/1/ports/6")
		py := fmt.Sprintf(`import os
fd = os.open(%q, os.O_RDONLY)
print(os.read(fd, 100).decode())`, h1+"/ports/6")
		if out := c.mustSh(t, "python3 -c '"+py+"'"); strings.TrimSpace(out) != "other" {
			t.Fatalf("port 6 while port 5 is full: %q", out)
		}
		if res := <-done; !strings.Contains(res, "Resource temporarily unavailable") {
			t.Fatalf("write to a full port: %s, want EAGAIN", res)
		}
		// Reading port 5 gives its messages in order, then O_NONBLOCK
		// says it is empty.
		py = fmt.Sprintf(`import os
fd = os.open(%q, os.O_RDONLY | os.O_NONBLOCK)
got = [os.read(fd, 100).decode() for _ in range(16)]
assert got == ["m%%d" %% i for i in range(16)], got
try:
    os.read(fd, 100)
    print("not empty")
except BlockingIOError:
    print("ok")`, h1+"/ports/5")
		if out := c.mustSh(t, "python3 -c '"+py+"'"); strings.TrimSpace(out) != "ok" {
			t.Fatalf("draining port 5: %q", out)
		}
		// A large message (rendezvous) with no reader waiting: the write
		// completes, the later reader gets every byte.
		c.mustSh(t, "head -c 200000 /dev/urandom > "+c.dir+"/big; dd if="+c.dir+"/big of="+h2+"/peers/1/ports/6 bs=200000 status=none")
		py = fmt.Sprintf(`import os
fd = os.open(%q, os.O_RDONLY)
m = os.read(fd, 1<<20)
assert m == open(%q, "rb").read(), len(m)
print("ok")`, h1+"/ports/6", c.dir+"/big")
		if out := c.mustSh(t, "python3 -c '"+py+"'"); strings.TrimSpace(out) != "ok" {
			t.Fatalf("large message read after its write returned: %q", out)
		}
		// A port nobody bound.
		out, err := c.sh(30*time.Second, "printf x > "+h2+"/peers/1/ports/77")
		if err == nil || !strings.Contains(out, "No such file or directory") {
			t.Fatalf("write to an unbound port: %v %q, want ENOENT", err, out)
		}
	})

	t.Run("one daemon per region directory", func(t *testing.T) {
		mnt := filepath.Join(c.dir, "second")
		os.MkdirAll(mnt, 0o755)
		ns := fmt.Sprintf("ke%d-h1", os.Getpid()%100000)
		out, err := c.sh(30*time.Second, fmt.Sprintf(`nsenter --net=/run/netns/%s "$KRFS" mount %s --meta 10.78.0.254:4790 --listen 10.78.0.1:4801 --mem-size 1M --shm-dir %s`,
			ns, mnt, filepath.Join(c.dir, "shm-h1")))
		if err == nil || !strings.Contains(out, "in use by another krfs daemon") {
			t.Fatalf("second daemon on host 1's region directory: %v\n%s", err, out)
		}
		if b, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(b), " "+mnt+" ") {
			exec.Command("umount", "-l", mnt).Run()
			t.Fatal("the second daemon mounted")
		}
		// Host 1 is unharmed.
		if out := c.mustSh(t, "cat "+h1+"/regions/new | head -c 2"); out != "x\n" {
			t.Fatalf("host 1's region after the refused daemon: %q", out)
		}
	})
}

// Two single-node mounts on one host do not share region memory, umount
// ends a daemon without the "detaching it" warning, and node.Purge frees
// what they leave (issue 12, items 6 and 9).
func TestSingleNodeMountsAndPurge(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	tmp := t.TempDir()
	type daemon struct {
		mnt, log string
		cmd      *exec.Cmd
		port     int
	}
	base := 20000 + os.Getpid()%20000
	var ds []*daemon
	for i := range 2 {
		d := &daemon{mnt: filepath.Join(tmp, fmt.Sprintf("m%d", i)), log: filepath.Join(tmp, fmt.Sprintf("d%d.log", i)), port: base + i}
		os.MkdirAll(d.mnt, 0o755)
		lf, err := os.Create(d.log)
		if err != nil {
			t.Fatal(err)
		}
		d.cmd = exec.Command(bin, "mount", d.mnt, "--listen", fmt.Sprintf("127.0.0.1:%d", d.port), "--mem-size", "1M")
		d.cmd.Stdout, d.cmd.Stderr = lf, lf
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lf.Close()
		ds = append(ds, d)
		t.Cleanup(func() {
			syscall.Unmount(d.mnt, syscall.MNT_DETACH)
			d.cmd.Process.Kill()
			d.cmd.Wait()
		})
	}
	for _, d := range ds {
		deadline := time.Now().Add(30 * time.Second)
		for {
			b, _ := os.ReadFile("/proc/self/mounts")
			if strings.Contains(string(b), " "+d.mnt+" fuse") {
				break
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(d.log)
				t.Fatalf("%s did not mount:\n%s", d.mnt, b)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err := os.WriteFile(filepath.Join(ds[0].mnt, "regions/mem"), []byte("first"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ds[1].mnt, "regions/mem"), []byte("other"), 0); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	f, err := os.Open(filepath.Join(ds[0].mnt, "regions/mem"))
	if err != nil {
		t.Fatal(err)
	}
	f.Read(b)
	f.Close()
	if string(b) != "first" {
		t.Fatalf("the first mount's memory reads %q: the two single-node mounts share it", b)
	}
	for _, d := range ds {
		if err := exec.Command("umount", d.mnt).Run(); err != nil {
			t.Fatalf("umount %s: %v", d.mnt, err)
		}
		d.cmd.Wait()
		log, _ := os.ReadFile(d.log)
		if strings.Contains(string(log), "detaching") || strings.Contains(string(log), "invalid argument") {
			t.Errorf("umount logged a warning:\n%s", log)
		}
		dir := fmt.Sprintf("/dev/shm/krfs-1048576-%d", d.port)
		if _, err := os.Stat(filepath.Join(dir, "mem")); err != nil {
			t.Fatalf("region directory %s: %v", dir, err)
		}
		if removed, err := node.Purge(dir); err != nil || len(removed) != 1 {
			t.Fatalf("purge %s: %v %v", dir, removed, err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("%s after purge: %v", dir, err)
		}
	}
}
