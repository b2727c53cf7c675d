package report

import "testing"

// TestRowTableWellFormed: every row of the table names its section, unit
// and measurement, has a gate and a krfs figure, names the baseline it
// has, and is judged by at most one rule (a ratio target or a goal).
func TestRowTableWellFormed(t *testing.T) {
	specs := rowTable()
	if len(specs) < 40 {
		t.Fatalf("%d rows: the table lost rows", len(specs))
	}
	for i, r := range specs {
		switch {
		case r.section == "" || r.unit == "":
			t.Errorf("row %d (%q): no section or unit", i, r.what)
		case r.what == "" && r.whatFn == nil:
			t.Errorf("row %d in %s: no measurement name", i, r.section)
		case len(r.gate) == 0 || r.krfs == nil:
			t.Errorf("row %d (%q): no gate or no krfs figure", i, r.what)
		case r.base != nil && r.baseName == "" && r.baseNameFn == nil:
			t.Errorf("row %d (%q): a baseline without a name", i, r.what)
		case r.ratio != nil && r.goal != nil:
			t.Errorf("row %d (%q): both a ratio target and a goal", i, r.what)
		case r.source == "" && r.sourceFn == nil:
			t.Errorf("row %d (%q): no source", i, r.what)
		}
	}
}
