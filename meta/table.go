package meta

// index is the server's view of which gid occupies which slot of the
// table: hopscotch hashing with neighbourhood H over tableGeom's slots.
// Invariant: a gid at slot i has home(gid) <= i < home(gid)+H.
//
// Insertion finds the first free slot at or after the home slot; while
// it lies H or more slots away, an entry between the two that may live
// at the free slot (its own neighbourhood covers it) moves there, and
// its old slot becomes the free one. Each move is a copy to a higher
// slot followed later by an overwrite of the lower one; see the package
// doc for why a concurrent one-READ lookup never misses a moving entry.
//
// index is not safe for concurrent use; the server's loop owns it.
type index struct {
	geom tableGeom
	gids []uint32 // gid per physical slot; 0 = free
	ver  []uint32 // current (even) version per physical slot
	free int      // free physical slots
}

// maxProbe bounds the search for a free slot past the home slot, so that
// one insertion into a crowded table costs bounded work.
const maxProbe = 4096

func newIndex(g tableGeom) *index {
	n := g.physSlots()
	return &index{geom: g, gids: make([]uint32, n), ver: make([]uint32, n), free: n}
}

// find returns gid's slot or -1.
func (x *index) find(gid uint32) int {
	h := x.geom.home(gid)
	for i := h; i < h+x.geom.nbhd; i++ {
		if x.gids[i] == gid {
			return i
		}
	}
	return -1
}

// move is one hopscotch displacement: the entry at from goes to to.
type move struct{ from, to int }

// insert places gid (not present) and returns its slot and the moves made
// to free it, in the order they must be published. ok is false when no
// slot within reach could be freed; nothing changes then.
func (x *index) insert(gid uint32) (slot int, moves []move, ok bool) {
	g := x.geom
	h := g.home(gid)
	j := h
	end := min(g.physSlots(), h+maxProbe)
	for j < end && x.gids[j] != 0 {
		j++
	}
	if j == end {
		return -1, nil, false
	}
	for j-h >= g.nbhd {
		k := j - g.nbhd + 1
		for ; k < j; k++ {
			if j-g.home(x.gids[k]) < g.nbhd {
				break
			}
		}
		if k == j {
			// Undo nothing: moves were only planned so far.
			return -1, nil, false
		}
		moves = append(moves, move{from: k, to: j})
		j = k
	}
	// Apply the plan. Moves were planned from the far free slot back
	// towards home; each one's source is the next one's destination.
	for _, m := range moves {
		x.gids[m.to] = x.gids[m.from]
	}
	x.gids[j] = gid
	x.free--
	return j, moves, true
}

// remove frees gid's slot, returning it (or -1).
func (x *index) remove(gid uint32) int {
	i := x.find(gid)
	if i >= 0 {
		x.gids[i] = 0
		x.free++
	}
	return i
}

// bump advances slot i's version by one whole write (two steps) and
// returns the old and new versions.
func (x *index) bump(i int) (old, next uint32) {
	old = x.ver[i]
	x.ver[i] = old + 2
	return old, old + 2
}
