package layering

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// clockCores are the protocol cores whose every time reading and timer
// must come from the injected clock (package clock), so that their tests
// run on manual time. udplink, the real UDP link, is not among them: socket
// deadlines and back-offs after system-call errors are real time by
// nature.
var clockCores = []string{"verbs/softnic", "verbs/softnic/wire", "verbs/softnic/link", "qpcore", "dct"}

// realTime are the functions of package time that read the real clock or
// arm a real timer.
var realTime = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
	"AfterFunc": true, "NewTimer": true, "NewTicker": true, "Tick": true,
}

// realTimeCalls lists the calls of realTime functions in the non-test Go
// files of dir, as file:line: time.F.
func realTimeCalls(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		timePkg := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"time"` {
				timePkg = "time"
				if imp.Name != nil {
					timePkg = imp.Name.Name
				}
			}
		}
		if timePkg == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == timePkg && realTime[sel.Sel.Name] {
				p := fset.Position(sel.Pos())
				found = append(found, fmt.Sprintf("%s:%d: time.%s", filepath.Base(p.Filename), p.Line, sel.Sel.Name))
			}
			return true
		})
	}
	sort.Strings(found)
	return found
}

// TestProtocolCoresReadTimeFromTheClock: no protocol core reads the real
// clock or arms a real timer behind its injected clock's back.
func TestProtocolCoresReadTimeFromTheClock(t *testing.T) {
	top := filepath.Join("..", "..")
	for _, pkg := range clockCores {
		dir := filepath.Join(top, filepath.FromSlash(pkg))
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		if calls := realTimeCalls(t, dir); len(calls) > 0 {
			t.Errorf("%s reads real time instead of its clock.Clock:\n  %s", pkg, strings.Join(calls, "\n  "))
		}
	}
	// The check sees a call where there is one: udplink waits in real time.
	if calls := realTimeCalls(t, filepath.Join(top, "verbs", "softnic", "udplink")); len(calls) == 0 {
		t.Fatal("no real-time call found in udplink: the check is blind")
	}
}
