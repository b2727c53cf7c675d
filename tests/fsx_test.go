package tests

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/fs"
)

// TestFSXModel is a randomized model test of region files in the spirit
// of fsx: random reads, writes and fetch-and-adds at random offsets and
// sizes against a shadow copy, through host 1's local file
// (regions/mem) and through two remote hosts' peer files
// (peers/1/mem), all three hosts at once. Each host owns a disjoint
// third of the region, so that the shadow stays exact while the hosts
// run concurrently; every read checks its bytes against the shadow, and
// at the end every host reads the whole region and compares it.
//
// Seeded and reproducible: the seed is printed; KRFS_FSX_SEED=N reruns
// it, KRFS_FSX_OPS=N sets the operations per host (default 600).
func TestFSXModel(t *testing.T) {
	c := newCluster(t, 3)
	seed := uint64(rand.Int64())
	if s := os.Getenv("KRFS_FSX_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("KRFS_FSX_SEED=%q: %v", s, err)
		}
		seed = v
	}
	ops := 600
	if s := os.Getenv("KRFS_FSX_OPS"); s != "" {
		ops, _ = strconv.Atoi(s)
	}
	t.Logf("fsx seed %d (rerun: KRFS_FSX_SEED=%d), %d operations per host", seed, seed, ops)

	local := filepath.Join(c.mnt(1), "regions/mem")
	paths := []string{local, filepath.Join(c.mnt(2), "peers/1/mem"), filepath.Join(c.mnt(3), "peers/1/mem")}
	st, err := os.Stat(local)
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()
	shadow := make([]byte, size)
	// Start from known contents: zero the region through the local file.
	zf, err := os.OpenFile(local, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zf.WriteAt(shadow, 0); err != nil {
		t.Fatal(err)
	}
	zf.Close()

	third := size / 3 &^ 7
	var wg sync.WaitGroup
	errs := make(chan error, len(paths))
	for h, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lo, hi := int64(h)*third, int64(h+1)*third
			if h == len(paths)-1 {
				hi = size
			}
			rng := rand.New(rand.NewPCG(seed, uint64(h)))
			if err := fsxWorker(rng, p, shadow, lo, hi, size, ops); err != nil {
				errs <- fmt.Errorf("host %d (%s), seed %d: %w", h+1, p, seed, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	for _, p := range paths {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if !bytes.Equal(got, shadow) {
			t.Fatalf("%s: final contents differ from the shadow at byte %d (seed %d)", p, firstDiff(got, shadow), seed)
		}
	}
}

// fsxWorker runs ops random operations on path within [lo, hi) of a
// region of size bytes, keeping shadow[lo:hi] in step. Reads may start
// anywhere in [lo, hi) and run past hi only at the region's end (where
// they must come back short).
func fsxWorker(rng *rand.Rand, path string, shadow []byte, lo, hi, size int64, ops int) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 256<<10)
	for i := 0; i < ops; i++ {
		n := fsxSize(rng)
		off := lo + rng.Int64N(hi-lo)
		switch op := rng.IntN(10); {
		case op < 4: // write
			n = min(n, hi-off)
			p := buf[:n]
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
			if w, err := f.WriteAt(p, off); err != nil || int64(w) != n {
				return fmt.Errorf("op %d: write %d at %d: %d, %v", i, n, off, w, err)
			}
			copy(shadow[off:], p)
		case op < 8: // read, possibly past the end of the region
			if hi != size {
				n = min(n, hi-off)
			}
			p := buf[:n]
			r, err := f.ReadAt(p, off)
			want := min(n, size-off)
			if int64(r) != want || (err != nil && !(err == io.EOF && want < n)) {
				return fmt.Errorf("op %d: read %d at %d: %d, %v; want %d", i, n, off, r, err, want)
			}
			if !bytes.Equal(p[:r], shadow[off:off+int64(r)]) {
				return fmt.Errorf("op %d: read %d at %d: differs from the shadow at byte %d", i, n, off, off+int64(firstDiff(p[:r], shadow[off:])))
			}
		case op < 9: // fetch-and-add on an aligned word
			w := off &^ 7
			if w+8 > hi {
				w = (hi - 8) &^ 7
			}
			if w < lo {
				continue
			}
			delta := rng.Uint64()
			arg := fs.AtomicArg{Offset: uint64(w), A: delta}
			var b [fs.AtomicArgSize]byte
			arg.Encode(b[:])
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(fs.IoctlFetchAdd), uintptr(unsafe.Pointer(&b[0]))); e != 0 {
				return fmt.Errorf("op %d: faa at %d: %v", i, w, e)
			}
			if err := arg.Decode(b[:]); err != nil {
				return err
			}
			old := binary.NativeEndian.Uint64(shadow[w:])
			if arg.Old != old {
				return fmt.Errorf("op %d: faa at %d: old %#x, shadow %#x", i, w, arg.Old, old)
			}
			binary.NativeEndian.PutUint64(shadow[w:], old+delta)
		default: // read at or past the end: 0 bytes
			p := buf[:1+rng.IntN(64)]
			if r, err := f.ReadAt(p, size+rng.Int64N(3)); r != 0 || err != io.EOF {
				return fmt.Errorf("op %d: read past the end: %d, %v; want 0, EOF", i, r, err)
			}
		}
	}
	return nil
}

// fsxSize picks an I/O size: mostly small, sometimes large, like fsx.
func fsxSize(rng *rand.Rand) int64 {
	switch rng.IntN(4) {
	case 0:
		return 1 + rng.Int64N(16)
	case 1:
		return 1 + rng.Int64N(4096)
	case 2:
		return 1 + rng.Int64N(64<<10)
	}
	return 1 + rng.Int64N(256<<10)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
