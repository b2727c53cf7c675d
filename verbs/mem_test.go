package verbs

import "testing"

func TestPageAligned(t *testing.T) {
	for _, n := range []int{1, 64, 4095, 4096, 4097, 1 << 20} {
		b := PageAligned(n)
		if len(b) != n || cap(b) != n {
			t.Fatalf("PageAligned(%d): len %d cap %d", n, len(b), cap(b))
		}
		if off := PageOffset(b); off != 0 {
			t.Fatalf("PageAligned(%d) starts %d bytes into a page", n, off)
		}
	}
	if PageAligned(0) != nil {
		t.Fatal("PageAligned(0) is not nil")
	}
}

func TestPageOffset(t *testing.T) {
	b := PageAligned(3 * PageSize)
	for _, off := range []int{0, 1, 80, 96, 112, PageSize - 1, PageSize, PageSize + 8} {
		if got := PageOffset(b[off:]); got != uint64(off%PageSize) {
			t.Fatalf("PageOffset of a slice %d bytes into an aligned buffer: %d", off, got)
		}
	}
}

func TestValidTransition(t *testing.T) {
	all := []QPState{StateReset, StateInit, StateRTR, StateRTS, StateErr}
	allowed := map[QPType]map[[2]QPState]bool{
		RC:  {},
		DCI: {},
		DCT: {{StateReset, StateInit}: true, {StateInit, StateRTR}: true},
	}
	for _, typ := range []QPType{RC, DCI} {
		m := allowed[typ]
		for _, from := range all {
			m[[2]QPState{from, StateReset}] = true
			m[[2]QPState{from, StateErr}] = true
		}
		for _, p := range [][2]QPState{{StateReset, StateInit}, {StateInit, StateInit}, {StateInit, StateRTR}, {StateRTR, StateRTS}, {StateRTS, StateRTS}} {
			m[p] = true
		}
	}
	delete(allowed[DCI], [2]QPState{StateReset, StateErr}) // mlx5: a DCI cannot go RESET->ERR
	for typ, m := range allowed {
		for _, from := range all {
			for _, to := range all {
				if got, want := ValidTransition(typ, from, to), m[[2]QPState{from, to}]; got != want {
					t.Errorf("%v %v -> %v: %v, want %v", typ, from, to, got, want)
				}
			}
		}
	}
}
