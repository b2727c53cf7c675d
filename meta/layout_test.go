package meta

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

func TestEntryRoundTrip(t *testing.T) {
	for _, n := range []NodeInfo{
		testNode(1, 2),
		testNode(0xffffffff, 0xffffffffffffffff),
		{GID: 3, Incarnation: 4, Addr: netip.MustParseAddrPort("[2001:db8::1]:65535")},
		{GID: 5, Incarnation: 6, Addr: netip.MustParseAddrPort("[::ffff:10.1.2.3]:7")}, // IPv4-mapped IPv6 stays IPv6
	} {
		var b [EntrySize]byte
		e := entry{node: n, live: true, expiry: 12345}
		putEntry(b[:], &e, 8)
		got, ok := decodeEntry(b[:])
		if !ok || got.node != n || !got.live || got.expiry != 12345 || got.version != 8 {
			t.Fatalf("round trip of %+v: %+v ok=%v", n, got, ok)
		}
	}
	var free [EntrySize]byte
	putEntry(free[:], &entry{}, 4)
	if e, ok := decodeEntry(free[:]); !ok || e.live {
		t.Fatalf("free entry decoded as %+v ok=%v", e, ok)
	}
}

// TestEntryOwner: the default region's owner round-trips, mode 0 is a
// known mode 0, and an entry written before the owner fields existed
// (zeros there) decodes as "owner unknown", not as mode 0.
func TestEntryOwner(t *testing.T) {
	n := testNode(7, 9)
	n.MemOwnerKnown, n.MemMode, n.MemUID, n.MemGID = true, 0, 0, 0
	var b [EntrySize]byte
	putEntry(b[:], &entry{node: n, live: true}, 2)
	got, ok := decodeEntry(b[:])
	if !ok || !got.node.MemOwnerKnown || got.node.MemMode != 0 || got.node != n {
		t.Fatalf("mode 0 owner: got %+v ok=%v", got.node, ok)
	}
	n.MemMode, n.MemUID, n.MemGID = 0o640, 1000, 100
	putEntry(b[:], &entry{node: n, live: true}, 4)
	if got, ok = decodeEntry(b[:]); !ok || got.node != n {
		t.Fatalf("owner round trip: got %+v want %+v", got.node, n)
	}
	// The same entry as a server of layout 2 wrote it: no owner bytes.
	clear(b[offMemMode : offMemGID+4])
	got, ok = decodeEntry(b[:])
	want := n
	want.MemOwnerKnown, want.MemMode, want.MemUID, want.MemGID = false, 0, 0, 0
	if !ok || got.node != want {
		t.Fatalf("old entry: got %+v want %+v", got.node, want)
	}
	// Mode bits beyond the permission bits are not stored.
	n.MemMode = 0o100644
	putEntry(b[:], &entry{node: n, live: true}, 6)
	if got, _ = decodeEntry(b[:]); got.node.MemMode != 0o644 {
		t.Fatalf("mode %#o stored as %#o, want 0644", n.MemMode, got.node.MemMode)
	}
}

func TestEntryTornDetected(t *testing.T) {
	var b [EntrySize]byte
	e := entry{node: testNode(9, 9), live: true}
	putEntry(b[:], &e, 6)
	binary.LittleEndian.PutUint32(b[offHead:], 7) // write in progress
	if _, ok := decodeEntry(b[:]); ok {
		t.Fatal("odd head accepted")
	}
	binary.LittleEndian.PutUint32(b[offHead:], 8) // head and tail differ
	if _, ok := decodeEntry(b[:]); ok {
		t.Fatal("mismatched versions accepted")
	}
	binary.LittleEndian.PutUint32(b[offTail:], 8)
	b[offState] = 7 // no server writes this
	if _, ok := decodeEntry(b[:]); ok {
		t.Fatal("unknown state accepted")
	}
}

// byteStore is one byte the server's NIC stores into a slot.
type byteStore struct {
	off int
	val byte
}

// slotWrites models one whole-slot update from version v as the NIC
// executes it: a list of WRITEs in order, each a set of byte stores that
// may land in any order (placement within one WRITE is unordered).
func slotWrites(order string, from []byte, v uint32, next *entry) [][]byteStore {
	var img [EntrySize]byte
	copy(img[:], from)
	binary.LittleEndian.PutUint32(img[offHead:], v+1)
	binary.LittleEndian.PutUint32(img[offTail:], v+2)
	putEntryBody(img[:], next)
	field := func(lo, hi int, val []byte) []byteStore {
		var s []byteStore
		for i := lo; i < hi; i++ {
			s = append(s, byteStore{i, val[i-lo]})
		}
		return s
	}
	var odd, even [4]byte
	binary.LittleEndian.PutUint32(odd[:], v+1)
	binary.LittleEndian.PutUint32(even[:], v+2)
	headOdd := field(offHead, offHead+4, odd[:])
	tail := field(offTail, offTail+4, even[:])
	body := field(offGID, offTail, img[offGID:offTail])
	head := field(offHead, offHead+4, even[:])
	switch order {
	case "server": // what Server.addWrites posts
		return [][]byteStore{headOdd, tail, body, head}
	case "naive": // head odd, body, tail, head: wrong
		return [][]byteStore{headOdd, body, tail, head}
	}
	panic(order)
}

// interleave runs one random interleaving of a reader that loads the 64
// bytes of a slot in address order (as a READ is served) with a writer
// that applies updates, and returns the reader's snapshot and the slot
// images a correct reader may accept.
func interleave(rng *rand.Rand, order string, updates int) (snap []byte, valid [][]byte) {
	mem := make([]byte, EntrySize)
	e := entry{node: testNode(1, 100), live: true}
	putEntry(mem, &e, 2)
	valid = append(valid, bytes.Clone(mem))
	var stores []byteStore
	v := uint32(2)
	img := bytes.Clone(mem)
	for u := range updates {
		next := entry{node: testNode(1, uint64(200+u)), live: u%3 != 2}
		for _, w := range slotWrites(order, img, v, &next) {
			rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
			stores = append(stores, w...)
		}
		v += 2
		putEntry(img, &next, v)
		valid = append(valid, bytes.Clone(img))
	}
	// Merge the reader's loads into the stores at random: the reader
	// starts after a random prefix and runs at a random relative speed.
	snap = make([]byte, EntrySize)
	si := rng.IntN(len(stores) + 1)
	for _, s := range stores[:si] {
		mem[s.off] = s.val
	}
	p := rng.Float64()
	for li := 0; li < EntrySize; {
		if si < len(stores) && rng.Float64() < p {
			mem[stores[si].off] = stores[si].val
			si++
			continue
		}
		snap[li] = mem[li]
		li++
	}
	return snap, valid
}

// TestSeqlockInterleavings checks the versioning scheme against every
// kind of race a READ can have with the server's writes: a reader that
// accepts a slot (head == tail, even) always holds one whole version.
// The naive order (tail after body) is shown to fail, so the model does
// find torn reads when there are some.
func TestSeqlockInterleavings(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const trials = 30000
	var accepted, rejected int
	for range trials {
		snap, valid := interleave(rng, "server", 1+rng.IntN(3))
		if _, ok := decodeEntry(snap); !ok {
			rejected++
			continue
		}
		accepted++
		match := false
		for _, v := range valid {
			match = match || bytes.Equal(v, snap)
		}
		if !match {
			t.Fatalf("accepted a torn slot %x", snap)
		}
	}
	if accepted == 0 || rejected == 0 {
		t.Fatalf("model too weak: %d accepted, %d rejected", accepted, rejected)
	}
	torn := 0
	for range trials {
		snap, valid := interleave(rng, "naive", 1)
		if _, ok := decodeEntry(snap); ok && !bytes.Equal(snap, valid[0]) && !bytes.Equal(snap, valid[1]) {
			torn++
		}
	}
	if torn == 0 {
		t.Fatal("the naive write order never produced an accepted torn slot: the model cannot see tearing")
	}
	t.Logf("server order: %d accepted, %d rejected; naive order: %d torn slots accepted", accepted, rejected, torn)
}

func TestHeaderRoundTrip(t *testing.T) {
	g, err := newGeom(1024, 8)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, HeaderSize)
	h := tableHeader{geom: g, epoch: time.Unix(100, 5), serverInc: 77}
	putHeader(b, h)
	got, err := parseHeader(b)
	if err != nil || got.geom != g || !got.epoch.Equal(h.epoch) || got.serverInc != 77 {
		t.Fatalf("header round trip: %+v %v", got, err)
	}
}

func TestHomeSpreadsConsecutiveGIDs(t *testing.T) {
	g, _ := newGeom(1<<12, 16)
	seen := make(map[int]int)
	for gid := uint32(1); gid <= 1<<12; gid++ {
		seen[g.home(gid)]++
	}
	// Fibonacci hashing of 1..n over n slots is nearly a permutation.
	if len(seen) < (1<<12)*9/10 {
		t.Fatalf("consecutive gids hit only %d of %d home slots", len(seen), 1<<12)
	}
}
