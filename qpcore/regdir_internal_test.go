package qpcore

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

type staticResolver map[uint32]meta.NodeInfo

func (r staticResolver) Lookup(_ context.Context, gid uint32) (meta.NodeInfo, error) {
	if info, ok := r[gid]; ok {
		return info, nil
	}
	return meta.NodeInfo{}, meta.ErrNotFound
}
func (r staticResolver) Invalidate(uint32) {}

func testNodes(t *testing.T, k int, cfg Config) ([]*Node, staticResolver) {
	t.Helper()
	res := staticResolver{}
	var ns []*Node
	for i := range k {
		dev, err := softnic.OpenUDP("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.GID = uint32(i + 1)
		n, err := NewNode(dev, res, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close(); dev.Close() })
		res[cfg.GID] = n.Info()
		ns = append(ns, n)
	}
	return ns, res
}

func TestDirectoryFormat(t *testing.T) {
	leaktest.Check(t)
	ns, _ := testNodes(t, 1, Config{MaxRegions: 3})
	n := ns[0]
	if got := n.Info().DirLen; got != uint32(DirLen(3)) {
		t.Fatalf("DirLen %d", got)
	}
	for _, bad := range []string{"", strings.Repeat("x", 33), "a/b", "nul\x00"} {
		if _, err := n.Export(bad, verbs.PageAligned(8), verbs.AccessRemoteRead); !errors.Is(err, ErrBadName) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	// Peers address a region by offsets: its MR must be zero-based, which
	// a NIC allows only for memory starting on a page boundary.
	if _, err := n.Export("skewed", verbs.PageAligned(200)[8:], verbs.AccessRemoteRead); !errors.Is(err, ErrUnaligned) || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a region 8 bytes into a page: %v, want ErrUnaligned", err)
	}
	name32 := strings.Repeat("n", 32)
	for _, name := range []string{"a", "b", name32} {
		if _, err := n.Export(name, verbs.PageAligned(100), verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.Export("a", verbs.PageAligned(8), verbs.AccessRemoteRead); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := n.Export("d", verbs.PageAligned(8), verbs.AccessRemoteRead); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("full: %v", err)
	}
	if err := n.Unexport("zz"); !errors.Is(err, ErrNotPresent) {
		t.Fatalf("unexport unknown: %v", err)
	}
	if _, err := n.SetOwner("b", 0o640, 1000, 100); err != nil {
		t.Fatal(err)
	}
	if err := n.Unexport("a"); err != nil {
		t.Fatal(err)
	}
	regs, _, err := parseDirectory(n.dir.buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(regs) != 2 || regs["b"].Mode != 0o640 || regs["b"].UID != 1000 || regs["b"].GID != 100 ||
		regs[name32].Len != 100 || regs["b"].Access&verbs.AccessRemoteWrite == 0 || regs["b"].Version%2 != 0 {
		t.Fatalf("parsed %+v", regs)
	}
	if got := n.Regions(); len(got) != 2 || got[0].Name != "b" {
		t.Fatalf("Regions %+v", got)
	}
	if buf, r, ok := n.Local("b"); !ok || len(buf) != 100 || r.Mode != 0o640 {
		t.Fatalf("Local: %d bytes, %+v, %v", len(buf), r, ok)
	}
	if _, _, ok := n.Local("a"); ok {
		t.Fatal("Local found an unexported region")
	}
	// A record caught mid-update is reported torn, never decoded.
	b := append([]byte(nil), n.dir.buf...)
	binary.LittleEndian.PutUint32(b[dirHeaderLen+dirRecordLen+76:], 77)
	if _, _, err := parseDirectory(b); !errors.Is(err, errTorn) {
		t.Fatalf("torn record: %v", err)
	}
	for _, cut := range []int{0, 10, dirHeaderLen + 5} {
		if _, _, err := parseDirectory(b[:cut]); err == nil {
			t.Fatalf("%d bytes parsed", cut)
		}
	}
	b[0] ^= 1
	if _, _, err := parseDirectory(b); !errors.Is(err, ErrDirectory) {
		t.Fatalf("bad magic: %v", err)
	}
}

// dirPair starts nodes a and b (gids 1 and 2) with cfg, exports names
// of 4 KiB on b and connects a VQP from a to b; ctx is a hang guard. All
// are closed at the test's end.
func dirPair(t *testing.T, cfg Config, names ...string) (a, b *Node, v *VQP, ctx context.Context) {
	t.Helper()
	ns, _ := testNodes(t, 2, cfg)
	a, b = ns[0], ns[1]
	for _, name := range names {
		if _, err := b.Export(name, verbs.PageAligned(4096), verbs.AccessRemoteRead); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	v, err := a.Connect(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return a, b, v, ctx
}

// A peer re-reads the directory with one-sided READs while the owner
// rewrites a record as fast as it can; every decoded record is consistent
// (mode, uid and gid are always written equal), torn ones are read again.
func TestDirectorySeqlockUnderUpdates(t *testing.T) {
	leaktest.Check(t)
	a, b, v, ctx := dirPair(t, Config{}, "x", "y", "z")
	b.SetOwner("y", 0, 0, 0) // the invariant below: mode == uid == gid
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	// The writer is paced by the reader, not by real time: a few updates
	// while each directory read is under way. A writer paced by a sleep
	// starved every READ when the machine was loaded (a READ that takes
	// longer than the sleep is always torn, and the reader never ends).
	readStarted := make(chan struct{}, 1)
	go func() {
		defer wg.Done()
		k := uint32(0)
		for !stop.Load() {
			select {
			case <-readStarted:
			case <-time.After(time.Millisecond): // only to notice stop
				continue
			}
			for range 4 {
				k++
				b.SetOwner("y", k, k, k)
				runtime.Gosched()
			}
		}
	}()
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	p := v.p
	reads := 0
	for ; reads < 3000; reads++ {
		p.mu.Lock()
		p.dir.invalidate()
		select {
		case readStarted <- struct{}{}:
		default:
		}
		err := a.ensureDirLocked(ctx, p)
		y := p.dir.regions["y"]
		n := len(p.dir.regions)
		p.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if n != 3 || y.Mode != y.UID || y.UID != y.GID || y.Len != 4096 {
			t.Fatalf("inconsistent record after %d reads: %+v (%d regions)", reads, y, n)
		}
	}
	t.Logf("%d directory READs during updates, %d torn reads repeated", reads, a.Stats().DirTorn)
}

// tearRecord leaves region name's directory record in the middle of an
// update, as a writer that was descheduled there would; the returned
// function finishes the update. It holds the directory's lock meanwhile.
func tearRecord(t *testing.T, n *Node, name string) (finish func()) {
	t.Helper()
	d := n.dir
	d.mu.Lock()
	e := d.byName[name]
	if e == nil {
		d.mu.Unlock()
		t.Fatalf("no region %q", name)
	}
	rec := d.buf[dirHeaderLen+e.slot*dirRecordLen:][:dirRecordLen]
	s := binary.LittleEndian.Uint32(rec[0:])
	storeLE32(rec[76:], s+1)
	if d.sync != nil {
		d.sync()
	}
	return func() {
		storeLE32(rec[0:], s+2)
		storeLE32(rec[76:], s+2)
		if d.sync != nil {
			d.sync()
		}
		d.mu.Unlock()
	}
}

// TestDirectoryReaderWaitsOutAStalledWriter: a directory READ that keeps
// finding a record torn (its writer stalled in the middle of an update)
// backs off and reads again until the writer finishes, however many READs
// that takes, and gives up with ErrDirectory only after PeerTimeout.
func TestDirectoryReaderWaitsOutAStalledWriter(t *testing.T) {
	leaktest.Check(t)
	const timeout = time.Second
	a, b, v, ctx := dirPair(t, Config{PeerTimeout: timeout}, "x")
	p := v.p
	readDir := func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.dir.invalidate()
		return a.ensureDirLocked(ctx, p)
	}

	// The writer finishes while the reader backs off, after more torn
	// READs than a reader that does not wait would make (17): the read
	// succeeds.
	finish := tearRecord(t, b, "x")
	done := make(chan error, 1)
	go func() { done <- readDir() }()
	for a.Stats().DirTorn < 20 {
		select {
		case err := <-done:
			finish()
			t.Fatalf("the read ended before backing off: %v (%d torn)", err, a.Stats().DirTorn)
		case <-ctx.Done():
			finish()
			t.Fatal("hang")
		default:
			runtime.Gosched()
		}
	}
	finish()
	if err := <-done; err != nil {
		t.Fatalf("read after the writer finished: %v", err)
	}
	if _, ok := p.dir.regions["x"]; !ok {
		t.Fatalf("directory %v lacks x", p.dir.regions)
	}

	// The writer never finishes: the read fails after PeerTimeout.
	finish = tearRecord(t, b, "x")
	defer finish()
	t0 := time.Now()
	err := readDir()
	if !errors.Is(err, ErrDirectory) || !strings.Contains(err.Error(), "kept changing") {
		t.Fatalf("read of a record torn for good: %v, want ErrDirectory", err)
	}
	if took := time.Since(t0); took < timeout {
		t.Fatalf("gave up after %v, before PeerTimeout", took)
	}
}
