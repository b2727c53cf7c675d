package tests

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestNoForeignBytes: no reader ever sees a byte nobody wrote there.
// Writers on two hosts write the same pattern (pattern(off) at every
// offset: the writes are idempotent) into a region of host 3 while readers
// on both hosts read it; meanwhile host 3 reads a secret region of host 2
// (READ responses full of that secret arrive where WRITEs are arriving)
// and host 1 reads host 3's own secret. Every byte read of the public
// region must be 0 (never written) or pattern(off), and no secret may
// appear in it, read through the network or in host 3's own copy. With
// and without a cluster key.
//
// KRFS_FOREIGN_READS sets how many reads each of the 8 readers makes
// (default 1,000; the full check runs 8,000 per reader: 2 x 64,000 in all
// with the two settings).
func TestNoForeignBytes(t *testing.T) {
	reads := 1000
	if s := os.Getenv("KRFS_FOREIGN_READS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("KRFS_FOREIGN_READS=%q: want a positive count", s)
		}
		reads = n
	}
	t.Run("nokey", func(t *testing.T) { foreignBytes(t, reads, "") })
	t.Run("key", func(t *testing.T) {
		requireE2E(t)
		key := filepath.Join(t.TempDir(), "key")
		if err := os.WriteFile(key, []byte("foreign bytes test cluster secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		foreignBytes(t, reads, key)
	})
}

const (
	pubSize    = 1 << 20
	secretSize = 256 << 10
)

// pattern is the byte every writer writes at offset off of the public
// region: never 0, and unlike the secrets' bytes.
func pattern(off int) byte { return byte(off*7+off>>9)%200 + 50 }

func secretOf(tag byte) []byte {
	b := make([]byte, secretSize)
	for i := range b {
		b[i] = "SECRET-"[i%7]
	}
	for i := 7; i < len(b); i += 64 {
		b[i] = tag
	}
	return b
}

func foreignBytes(t *testing.T, reads int, key string) {
	if key != "" {
		t.Setenv("KRFS_MOUNT_FLAGS", strings.TrimSpace(os.Getenv("KRFS_MOUNT_FLAGS")+" --cluster-key-file "+key))
		t.Setenv("KRFS_META_FLAGS", strings.TrimSpace(os.Getenv("KRFS_META_FLAGS")+" --cluster-key-file "+key))
	}
	c := newCluster(t, 3)
	h1, h2, h3 := c.mnt(1), c.mnt(2), c.mnt(3)
	c.mustSh(t, fmt.Sprintf("truncate -s %d %s/regions/pub && truncate -s %d %s/regions/sec && truncate -s %d %s/regions/sec",
		pubSize, h3, secretSize, h3, secretSize, h2))
	sec2, sec3 := secretOf('2'), secretOf('3')
	for path, b := range map[string][]byte{h2 + "/regions/sec": sec2, h3 + "/regions/sec": sec3} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	var (
		stop       atomic.Bool
		wg         sync.WaitGroup
		mismatches atomic.Int64
		done       atomic.Int64
		firstBad   sync.Once
		report     string
	)
	fail := func(what string) {
		mismatches.Add(1)
		firstBad.Do(func() { report = what })
	}
	open := func(path string, flag int) *os.File {
		f, err := os.OpenFile(path, flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	// Writers: 8 on each of hosts 1 and 2 (16 in all), chunks of 4-64 KiB.
	for w := range 16 {
		host := h1
		if w%2 == 1 {
			host = h2
		}
		f := open(host+"/peers/3/mr/pub", os.O_RDWR)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			buf := make([]byte, 64<<10)
			for !stop.Load() {
				n := 4<<10 + rng.IntN(60<<10)
				off := rng.IntN(pubSize - n)
				for i := range n {
					buf[i] = pattern(off + i)
				}
				if _, err := f.WriteAt(buf[:n], int64(off)); err != nil {
					fail(fmt.Sprintf("writer %d: %v", w, err))
					return
				}
			}
		}()
	}
	// Secret traffic: host 3 reads host 2's secret, host 1 reads host 3's.
	for _, s := range []struct {
		path string
		want []byte
	}{{h3 + "/peers/2/mr/sec", sec2}, {h1 + "/peers/3/mr/sec", sec3}} {
		f := open(s.path, os.O_RDONLY)
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, secretSize)
			for !stop.Load() {
				if n, err := f.ReadAt(buf, 0); err != nil || n != secretSize || !bytes.Equal(buf, s.want) {
					fail(fmt.Sprintf("reading %s: %d bytes, %v", s.path, n, err))
					return
				}
			}
		}()
	}
	check := func(who string, b []byte, off int) {
		for i, c := range b {
			if c != 0 && c != pattern(off+i) {
				fail(fmt.Sprintf("%s: byte %d of the region is %q, want 0 or %q; around it: %q",
					who, off+i, c, pattern(off+i), b[max(0, i-8):min(len(b), i+24)]))
				return
			}
		}
	}
	// Readers: 4 on each of hosts 1 and 2.
	var rwg sync.WaitGroup
	for r := range 8 {
		host := h1
		if r%2 == 1 {
			host = h2
		}
		f := open(host+"/peers/3/mr/pub", os.O_RDONLY)
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 2))
			buf := make([]byte, 128<<10)
			for range reads {
				n := 1 + rng.IntN(len(buf))
				off := rng.IntN(pubSize - n)
				k, err := f.ReadAt(buf[:n], int64(off))
				if err != nil || k != n {
					fail(fmt.Sprintf("reader %d: %d of %d bytes: %v", r, k, n, err))
					return
				}
				check(fmt.Sprintf("reader %d on %s", r, filepath.Base(host)), buf[:n], off)
				done.Add(1)
			}
		}()
	}
	rwg.Wait()
	stop.Store(true)
	wg.Wait()
	// Host 3's own copy, through its local file.
	local, err := os.ReadFile(h3 + "/regions/pub")
	if err != nil {
		t.Fatal(err)
	}
	check("host 3's regions/pub", local, 0)
	if bytes.Contains(local, []byte("SECRET-")) {
		fail("a secret in host 3's regions/pub")
	}
	t.Logf("%d reads of up to 128 KiB beside 16 writers: %d mismatches", done.Load(), mismatches.Load())
	if m := mismatches.Load(); m != 0 {
		t.Fatalf("%d reads went wrong; the first: %s", m, report)
	}
}
