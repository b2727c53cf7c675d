package tests

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestExamples runs examples/race and examples/serverless end to end on a
// 3-host cluster, with their correctness checks; sizes are kept small so
// that the test stays quick. No timing is asserted.
func TestExamples(t *testing.T) {
	c := newCluster(t, 3)
	t.Run("race", func(t *testing.T) { testRace(t, c) })
	t.Run("serverless", func(t *testing.T) { testServerless(t, c) })
}

func (c *cluster) py(script string) string {
	return "python3 " + filepath.Join(c.top, "examples", script)
}

// testRace: a table on all three hosts' default regions, a loader, then
// three clients on three hosts inserting at once into a table small
// enough that they contend for the same buckets; every key must be found
// with its value and occupy exactly one slot. Then one slot is cleared
// behind the table's back, and the check must notice.
func testRace(t *testing.T, c *cluster) {
	const loaded, perClient, clients = 300, 100, 3
	race := c.py("race/race.py")
	nodes := "--nodes 1,2,3"
	c.mustSh(t, fmt.Sprintf("%s init --mount %s %s --buckets 32", race, c.mnt(1), nodes))
	c.mustSh(t, fmt.Sprintf("%s load --mount %s %s --keys %d", race, c.mnt(1), nodes, loaded))

	var wg sync.WaitGroup
	outs := make([]string, clients)
	errs := make([]error, clients)
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[k], errs[k] = c.sh(120*time.Second, fmt.Sprintf("%s run --mount %s %s --client %d --keys %d --loaded %d",
				race, c.mnt(k+1), nodes, k, perClient, loaded))
		}()
	}
	wg.Wait()
	lost := 0
	for k := range clients {
		if errs[k] != nil {
			t.Fatalf("client %d on host %d: %v\n%s", k, k+1, errs[k], outs[k])
		}
		t.Logf("client %d on host %d: %s", k, k+1, strings.TrimSpace(outs[k]))
		if m := regexp.MustCompile(`"cas_lost": (\d+)`).FindStringSubmatch(outs[k]); m != nil {
			n, _ := strconv.Atoi(m[1])
			lost += n
		}
	}
	t.Logf("CAS lost to another client (then retried): %d", lost)

	out := c.mustSh(t, fmt.Sprintf("%s check --mount %s %s --keys %d --clients %d --client-keys %d",
		race, c.mnt(2), nodes, loaded, clients, perClient))
	want := fmt.Sprintf("all %d keys found with their values, %d slots for %d keys", loaded+clients*perClient, loaded+clients*perClient, loaded+clients*perClient)
	if !strings.Contains(out, want) {
		t.Fatalf("check: %s", out)
	}

	// A bootstrap lookup from a fresh process finds a loaded key.
	out = c.mustSh(t, fmt.Sprintf("%s lookup --mount %s %s key-00000042", race, c.mnt(3), nodes))
	if !strings.Contains(out, `"found": 64`) {
		t.Fatalf("lookup: %s", out)
	}

	// The Go bootstrap client finds the same key through fresh VQPs and
	// through RC QPs created from scratch, from host 3's namespace.
	boot := filepath.Join(c.dir, "raceboot")
	if out, err := exec.Command("go", "build", "-o", boot, filepath.Join(c.top, "examples/race/raceboot")).CombinedOutput(); err != nil {
		t.Fatalf("go build raceboot: %v\n%s", err, out)
	}
	for _, mode := range []string{"vqp", "rc"} {
		out = c.mustSh(t, fmt.Sprintf("nsenter --net=/run/netns/ke%d-h3 %s -mode %s -meta 10.78.0.254:4790 -listen 10.78.0.3:0 -nodes 1,2,3 key-00000042",
			os.Getpid()%100000, boot, mode))
		if !strings.Contains(out, `"found":64`) {
			t.Fatalf("raceboot -mode %s: %s", mode, out)
		}
	}
	// The cold-peer benchmark runs (its figures are BENCHMARKS.md's).
	out = c.mustSh(t, fmt.Sprintf("nsenter --net=/run/netns/ke%d-h3 %s -mode coldpeer -meta 10.78.0.254:4790 -listen 10.78.0.3:0 -nodes 1,2 -n 20",
		os.Getpid()%100000, boot))
	if !strings.Contains(out, `"iterations":20`) || !strings.Contains(out, `"warm_read8_p50_us"`) {
		t.Fatalf("raceboot -mode coldpeer: %s", out)
	}

	// The check has teeth: clear one used slot of host 1's table.
	clear := fmt.Sprintf(`import os, struct
fd = os.open(%q, os.O_RDWR)
b = os.pread(fd, 32*64, 64)
w = struct.unpack("<%%dQ" %% (len(b)//8), b)
i = next(i for i, x in enumerate(w) if x)
os.pwrite(fd, bytes(8), 64 + 8*i)
print("cleared slot", i)`, filepath.Join(c.mnt(3), "peers/1/mem"))
	c.mustSh(t, "python3 -c '"+clear+"'")
	out, err := c.sh(60*time.Second, fmt.Sprintf("%s check --mount %s %s --keys %d --clients %d --client-keys %d",
		race, c.mnt(2), nodes, loaded, clients, perClient))
	if err == nil || !strings.Contains(out, "1 keys missing or wrong") {
		t.Fatalf("check after clearing a slot: %v\n%s", err, out)
	}
}

// nodeStat reads one counter of a host's stats file.
func nodeStat(t *testing.T, mnt, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mnt, "stats"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\d+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in %s/stats", name, mnt)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// testServerless hands objects from a producer on host 1 to a consumer
// on host 3: through ports/ below the rendezvous threshold (one eager
// message), at it, and above one message (chunked over several ports);
// through a new region of the producer that the consumer READs, with the
// object written through the mount; and through a region of host 1's
// hand-off pool, written into the daemon's store. The consumer's copy
// must be byte-identical, objects of 64 KiB and more sent as messages
// must have gone by rendezvous, and nothing may stay bound or exported
// but the pool's regions.
func testServerless(t *testing.T, c *cluster) {
	cases := []struct {
		size int
		via  string
		shm  bool
		want string // the way the consumer saw
	}{
		{16 << 10, "auto", false, "ports"},
		{64 << 10, "auto", false, "region"},
		{3<<20 + 12345, "ports", false, "ports"},
		{3<<20 + 12345, "auto", true, "pool"},
		{300 << 10, "region", false, "region"},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%d-%s", tc.size, tc.via), func(t *testing.T) {
			handoff(t, c, 200+10*i, tc.size, tc.via, tc.shm, tc.want)
		})
	}
	t.Run("pool", func(t *testing.T) { testServerlessPool(t, c) })
}

// testServerlessPool: hand-offs through host 1's pool reuse its regions:
// a second hand-off of the same size class makes no new region, a slot
// another producer holds (its store file's flock) is skipped, and every
// slot is zeroed once its hand-off is over.
func testServerlessPool(t *testing.T, c *cluster) {
	const size = 300 << 10 // class 512 KiB
	slot := func(i int) string { return fmt.Sprintf("ho-pool-80000-%d", i) }
	store := filepath.Join(c.dir, "shm-h1")
	defer func() {
		pool, _ := filepath.Glob(filepath.Join(c.mnt(1), "regions", "ho-pool-*"))
		for _, p := range pool {
			os.Remove(p)
		}
	}()
	zeroed := func(name string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(store, name))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != 512<<10 {
			t.Fatalf("%s holds %d bytes, want the class size %d", name, len(b), 512<<10)
		}
		if !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("%s still holds the object after the hand-off", name)
		}
	}
	pool := func() []string {
		got, _ := filepath.Glob(filepath.Join(c.mnt(1), "regions", "ho-pool-80000-*"))
		for i := range got {
			got[i] = filepath.Base(got[i])
		}
		return got
	}
	for k := range 2 {
		handoff(t, c, 300+10*k, size, "pool", true, "pool")
		if got := pool(); len(got) != 1 || got[0] != slot(0) {
			t.Fatalf("after hand-off %d the pool is %v, want [%s]", k+1, got, slot(0))
		}
		zeroed(slot(0))
	}
	// Another producer holds slot 0: the next hand-off takes slot 1.
	f, err := os.OpenFile(filepath.Join(store, slot(0)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	handoff(t, c, 320, size, "pool", true, "pool")
	if got := pool(); len(got) != 2 || got[1] != slot(1) {
		t.Fatalf("with slot 0 held the pool is %v, want [%s %s]", got, slot(0), slot(1))
	}
	zeroed(slot(1))
}

// handoff runs one hand-off of a random object of size bytes from host 1
// to host 3 (consumer ports port.., producer's reply port port+50) and
// checks it (see testServerless).
func handoff(t *testing.T, c *cluster, port, size int, via string, shm bool, want string) {
	t.Helper()
	ho := c.py("serverless/handoff.py")
	in := filepath.Join(c.dir, fmt.Sprintf("obj-%d", port))
	out := in + ".out"
	obj := make([]byte, size)
	rand.Read(obj)
	if err := os.WriteFile(in, obj, 0o600); err != nil {
		t.Fatal(err)
	}
	rdvBefore := nodeStat(t, c.mnt(1), "node.MsgRendezvous")
	recv := make(chan string, 1)
	go func() {
		o, err := c.sh(hangGuard, fmt.Sprintf("%s recv --mount %s --port %d --out %s --timeout 50", ho, c.mnt(3), port, out))
		if err != nil {
			o += err.Error()
		}
		recv <- o
	}()
	// The consumer binds its ports first.
	deadline := time.Now().Add(hangGuard)
	for {
		if _, err := os.Stat(filepath.Join(c.mnt(3), "ports", strconv.Itoa(port+3))); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer did not bind port %d: %s", port, <-recv)
		}
		time.Sleep(20 * time.Millisecond)
	}
	shmFlag := ""
	if shm {
		shmFlag = "--shm-dir " + filepath.Join(c.dir, "shm-h1")
	}
	sent := c.mustSh(t, fmt.Sprintf("%s send --mount %s --to 3 --port %d --reply %d --in %s --via %s %s --timeout 50",
		ho, c.mnt(1), port, port+50, in, via, shmFlag))
	got := <-recv
	if !strings.Contains(sent, `"identical": true`) || !strings.Contains(got, `"side": "recv"`) {
		t.Fatalf("send: %s\nrecv: %s", sent, got)
	}
	if !strings.Contains(got, fmt.Sprintf(`"via": %q`, want)) || !strings.Contains(sent, fmt.Sprintf(`"via": %q`, want)) {
		t.Fatalf("want via %s:\nsend: %s\nrecv: %s", want, sent, got)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, obj) {
		t.Fatalf("the consumer's object differs from the producer's (%d vs %d bytes)", len(b), len(obj))
	}
	region := want != "ports"
	chunks := (size + (1<<20 - 8192) - 1) / (1<<20 - 8192)
	rdv := nodeStat(t, c.mnt(1), "node.MsgRendezvous") - rdvBefore
	switch {
	case (region || size < 64<<10) && rdv != 0:
		t.Fatalf("%d B object: %d rendezvous, want one eager message", size, rdv)
	case !region && size >= 64<<10 && rdv != chunks:
		t.Fatalf("%d B object in %d chunks: %d rendezvous", size, chunks, rdv)
	}
	for _, p := range []string{filepath.Join(c.mnt(3), "ports", strconv.Itoa(port)), filepath.Join(c.mnt(3), "ports", strconv.Itoa(port+3)),
		filepath.Join(c.mnt(1), "ports", strconv.Itoa(port+50))} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s still bound after the hand-off", p)
		}
	}
	left, _ := filepath.Glob(filepath.Join(c.mnt(1), "regions", "ho-*"))
	for _, l := range left {
		if !strings.HasPrefix(filepath.Base(l), "ho-pool-") {
			t.Fatalf("regions left behind: %v", left)
		}
	}
}
