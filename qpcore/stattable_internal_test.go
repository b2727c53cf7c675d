package qpcore

import (
	"reflect"
	"sync/atomic"
	"testing"
)

// internalCounters are counted but are no figure of Stats (yet).
var internalCounters = map[string]bool{"msgFINErrors": true, "msgRepostErrors": true}

// The stat table covers Stats: every field in exactly one row, every
// counter of the node read by exactly one row, and Stats reports each
// counter in its own field.
func TestStatTableCoversStats(t *testing.T) {
	rows := map[string]int{}
	metrics := map[string]bool{}
	for _, m := range StatMetrics() {
		if metrics[m.Name] {
			t.Errorf("metric %s twice", m.Name)
		}
		metrics[m.Name] = true
		if len(m.Fields) > 1 && m.Label == "" {
			t.Errorf("metric %s has %d fields and no label", m.Name, len(m.Fields))
		}
		for _, f := range m.Fields {
			rows[f.Field]++
			if (m.Label == "") != (f.Value == "") {
				t.Errorf("%s: label %q, value %q", f.Field, m.Label, f.Value)
			}
		}
	}
	for _, sf := range reflect.VisibleFields(reflect.TypeFor[Stats]()) {
		if rows[sf.Name] != 1 {
			t.Errorf("Stats.%s is in %d rows of the stat table, want 1", sf.Name, rows[sf.Name])
		}
	}

	// Every counter of the node is read by one row.
	var c counters
	byPtr := map[*atomic.Uint64]string{}
	for _, f := range statCounters {
		p := f.live(&c)
		if other, dup := byPtr[p]; dup {
			t.Errorf("%s and %s read the same counter", f.Field, other)
		}
		byPtr[p] = f.Field
	}
	cv := reflect.ValueOf(&c).Elem()
	for i := range cv.NumField() {
		fv := cv.Field(i)
		if fv.Type() != reflect.TypeFor[atomic.Uint64]() {
			continue
		}
		name := cv.Type().Field(i).Name
		if _, ok := byPtr[(*atomic.Uint64)(fv.Addr().UnsafePointer())]; !ok && !internalCounters[name] {
			t.Errorf("counter %s is in no row of the stat table", name)
		}
	}

	// Stats reports each counter in its field: give each its own value.
	ns, _ := testNodes(t, 1, Config{})
	n := ns[0]
	want := map[string]uint64{}
	for i, f := range statCounters {
		v := uint64(1000 + i)
		f.live(&n.stats).Store(v)
		want[f.Field] = v
	}
	s := n.Stats()
	sv := reflect.ValueOf(s)
	for field, v := range want {
		if got := sv.FieldByName(field).Uint(); got != v {
			t.Errorf("Stats.%s = %d, want %d", field, got, v)
		}
	}
}
