package layering

import (
	"os/exec"
	"strings"
	"testing"
)

const (
	module  = "github.com/krfs/krfs"
	backend = module + "/verbs/softnic"
)

// aboveBackend are the packages that must see the NIC only as verbs.
var aboveBackend = []string{"clock", "dct", "fs", "meta", "node", "qpcore", "verbs", "internal/shm"}

// softnicDeps returns the packages under verbs/softnic that pkg depends
// on (its non-test build, as `go list -deps` resolves it).
func softnicDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+"/"+pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	var bad []string
	for _, dep := range strings.Fields(string(out)) {
		if dep == backend || strings.HasPrefix(dep, backend+"/") {
			bad = append(bad, dep)
		}
	}
	return bad
}

// TestOnlyNicOpensSoftnic: outside softnic itself, only package nic
// imports verbs/softnic (or its subpackages) in non-test code; commands,
// benchmarks and examples open their device through nic.
func TestOnlyNicOpensSoftnic(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := false
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := f[0]
		if pkg == backend || strings.HasPrefix(pkg, backend+"/") {
			continue
		}
		for _, imp := range f[1:] {
			if imp != backend && !strings.HasPrefix(imp, backend+"/") {
				continue
			}
			if pkg == module+"/nic" {
				seen = true
				continue
			}
			t.Errorf("%s imports %s: open the NIC through package nic", pkg, imp)
		}
	}
	// The check sees an import where there is one: nic opens softnic.
	if !seen {
		t.Fatal("package nic does not seem to import verbs/softnic: the check is blind")
	}
}

func TestNothingAboveTheBackendImportsSoftnic(t *testing.T) {
	for _, pkg := range aboveBackend {
		if bad := softnicDeps(t, pkg); len(bad) > 0 {
			t.Errorf("%s depends on %v: layers above the backend import only verbs", pkg, bad)
		}
	}
	// The check sees a dependency where there is one: the command opens
	// the softnic NIC.
	if bad := softnicDeps(t, "cmd/krfs"); len(bad) == 0 {
		t.Fatal("cmd/krfs does not seem to depend on verbs/softnic: the check is blind")
	}
}
