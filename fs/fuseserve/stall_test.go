package fuseserve

import "testing"

// Rule: a mount is stalled when, for stallTicks checks in a row, the
// kernel holds requests while the server has none in service and served
// none since the last check; a request in service, one served, or an
// empty kernel queue in between starts the count anew.
func TestStallWatch(t *testing.T) {
	type obs struct {
		waiting, inService int64
		served             uint64
		stalled            bool
	}
	for _, tc := range []struct {
		name string
		seq  []obs
	}{
		{"a request the kernel holds, nothing served", []obs{{1, 0, 5, false}, {1, 0, 5, false}, {1, 0, 5, false}, {1, 0, 5, true}, {1, 0, 5, false}}},
		{"idle mount", []obs{{0, 0, 5, false}, {0, 0, 5, false}, {0, 0, 5, false}, {0, 0, 5, false}}},
		{"a slow request in service", []obs{{1, 1, 5, false}, {1, 1, 5, false}, {1, 1, 5, false}, {1, 1, 5, false}}},
		{"busy mount, caught between requests", []obs{{1, 0, 5, false}, {1, 0, 9, false}, {1, 0, 14, false}, {1, 0, 20, false}}},
		{"progress resets the count", []obs{{2, 0, 5, false}, {2, 0, 5, false}, {2, 0, 6, false}, {2, 0, 6, false}, {2, 0, 6, false}, {2, 0, 6, true}}},
	} {
		var w stallWatch
		for i, o := range tc.seq {
			if got := w.check(o.waiting, o.inService, o.served); got != o.stalled {
				t.Errorf("%s: check %d (waiting %d, in service %d, served %d) = %v, want %v", tc.name, i, o.waiting, o.inService, o.served, got, o.stalled)
			}
		}
	}
}
