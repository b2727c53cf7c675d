package layering

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/krfs/krfs"

// A rule forbids a set of import edges, like a depguard rule: a package
// matching from (and not except) must not import a package matching deny
// (unless it also matches allow). Patterns are relative to the module:
// "fs" is that package, "fs/..." it and everything below it, "..." every
// package of the module. Only non-test imports count: a test may use
// whatever it measures or fakes.
type rule struct {
	why     string // the rule, as a violation reports it
	from    []string
	except  []string
	deny    []string
	allow   []string
	witness [2]string // an edge the rule must reject: proof it is not blind
}

// Layers, top to bottom. fs and node are the filesystem; qpcore the
// control plane; dct and meta its two services; verbs the device
// interface; softnic and rdma the backends behind it. nic is the one
// package that opens a backend, for programs.
var (
	programs  = []string{"cmd/...", "examples/...", "tests/..."}
	backends  = []string{"verbs/softnic/...", "verbs/rdma/..."}
	libraries = []string{"fs/...", "node/...", "qpcore/...", "dct/...", "meta/...", "verbs/...", "nic/...", "clock/...", "internal/..."}
	aboveDev  = []string{"fs/...", "node/...", "qpcore/...", "dct/...", "meta/...", "nic/..."}
)

func cat(lists ...[]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

var rules = []rule{
	{why: "nothing imports a program (commands, examples, the e2e tests)",
		from: []string{"..."}, deny: programs,
		witness: [2]string{"node", "cmd/krfs"}},
	{why: "no internal/ package imports a program or the benchmarks: internal/ holds helpers used from below",
		from: []string{"internal/..."}, deny: cat(programs, []string{"bench/..."}),
		witness: [2]string{"internal/shm", "bench"}},
	{why: "the benchmark suite (bench, bench/report) is a program package: only commands run it",
		from: []string{"..."}, except: cat(programs, []string{"bench/..."}), deny: []string{"bench", "bench/report/..."},
		witness: [2]string{"internal/plot", "bench/report"}},
	{why: "library code never measures: bench/baseline is for benchmarks and their tests",
		from: libraries, deny: []string{"bench/..."},
		witness: [2]string{"qpcore", "bench/baseline"}},
	{why: "bench/baseline measures the host alone and imports nothing of krfs",
		from: []string{"bench/baseline/..."}, deny: []string{"..."},
		witness: [2]string{"bench/baseline", "verbs"}},
	{why: "fs is the FUSE layer: it declares the interfaces its backend (node) implements and imports nothing of krfs but its own FUSE transport (fs/fuseserve)",
		from: []string{"fs/..."}, deny: []string{"..."}, allow: []string{"fs/..."},
		witness: [2]string{"fs", "verbs"}},
	{why: "clock is the leaf every layer injects: it imports nothing else of krfs",
		from: []string{"clock/..."}, deny: []string{"..."}, allow: []string{"clock/..."},
		witness: [2]string{"clock/clocktest", "verbs/softnic"}},
	{why: "qpcore serves node: it never calls up into node or fs",
		from: []string{"qpcore/..."}, deny: []string{"node/...", "fs/..."},
		witness: [2]string{"qpcore", "node"}},
	{why: "dct and meta serve qpcore: they never call up",
		from: []string{"dct/...", "meta/..."}, deny: []string{"qpcore/...", "node/...", "fs/..."},
		witness: [2]string{"meta", "qpcore"}},
	{why: "dct and meta are siblings: neither imports the other",
		from: []string{"dct/..."}, deny: []string{"meta/..."},
		witness: [2]string{"dct", "meta"}},
	{why: "dct and meta are siblings: neither imports the other",
		from: []string{"meta/..."}, deny: []string{"dct/..."},
		witness: [2]string{"meta", "dct"}},
	{why: "verbs is the device contract: it knows neither its users nor its backends",
		from: []string{"verbs/..."}, except: backends, deny: cat(aboveDev, backends),
		witness: [2]string{"verbs/verbstest", "verbs/softnic"}},
	{why: "a verbs backend imports nothing above verbs",
		from: backends, deny: aboveDev,
		witness: [2]string{"verbs/softnic", "qpcore"}},
	{why: "a verbs backend does not know the other backend",
		from: []string{"verbs/softnic/..."}, deny: []string{"verbs/rdma/..."},
		witness: [2]string{"verbs/softnic", "verbs/rdma"}},
	{why: "a verbs backend does not know the other backend",
		from: []string{"verbs/rdma/..."}, deny: []string{"verbs/softnic/..."},
		witness: [2]string{"verbs/rdma", "verbs/softnic/wire"}},
	{why: "only nic opens a backend: everything else sees the NIC as a verbs.Device",
		from: []string{"..."}, except: cat(backends, []string{"nic"}), deny: backends,
		witness: [2]string{"node", "verbs/softnic"}},
	{why: "nic opens devices for programs: libraries take a verbs.Device handed down",
		from: libraries, except: []string{"nic/..."}, deny: []string{"nic/..."},
		witness: [2]string{"node", "nic"}},
	{why: "nic chooses and opens a backend; it imports nothing above verbs",
		from: []string{"nic/..."}, deny: []string{"fs/...", "node/...", "qpcore/...", "dct/...", "meta/..."},
		witness: [2]string{"nic", "meta"}},
}

// allowed are edges the rules would reject, each with its reason.
var allowed = map[[2]string]string{
	// krfs devices prints libibverbs' device inventory (rdma.Devices,
	// Describe, Plan); it opens nothing. krfs mount opens through nic.
	{"cmd/krfs", "verbs/rdma"}: "krfs devices lists RDMA devices",
}

// match reports whether module package pkg (module-relative) matches pattern.
func match(pattern, pkg string) bool {
	if pattern == "..." {
		return true
	}
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == tree || strings.HasPrefix(pkg, tree+"/")
	}
	return pkg == pattern
}

func matchAny(patterns []string, pkg string) bool {
	for _, p := range patterns {
		if match(p, pkg) {
			return true
		}
	}
	return false
}

// rejects reports whether r forbids the edge from -> to.
func (r rule) rejects(from, to string) bool {
	return matchAny(r.from, from) && !matchAny(r.except, from) &&
		matchAny(r.deny, to) && !matchAny(r.allow, to)
}

// importGraph returns the module's packages with their non-test imports
// inside the module, module-relative, under the default build tags and
// under -tags rdma (the RNIC backend's cgo build).
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	graph := map[string][]string{}
	for _, tags := range []string{"", "rdma"} {
		out, err := exec.Command("go", "list", "-tags", tags, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags %q: %v\n%s", tags, err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			pkg, ok := strings.CutPrefix(f[0], module+"/")
			if !ok {
				continue
			}
			if _, seen := graph[pkg]; !seen {
				graph[pkg] = nil
			}
			for _, imp := range f[1:] {
				if dep, ok := strings.CutPrefix(imp, module+"/"); ok {
					graph[pkg] = append(graph[pkg], dep)
				}
			}
		}
	}
	for pkg, deps := range graph {
		sort.Strings(deps)
		graph[pkg] = compactStrings(deps)
	}
	return graph
}

func compactStrings(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// TestLayerOrder: no import edge of the module breaks a rule of the table;
// a violation names the edge and the rule.
func TestLayerOrder(t *testing.T) {
	graph := importGraph(t)
	// The graph is the real one: node imports qpcore and fs.
	if !matchAny(graph["node"], "qpcore") || !matchAny(graph["node"], "fs") {
		t.Fatalf("node's imports %v lack qpcore or fs: the import graph is not read right", graph["node"])
	}
	pkgs := make([]string, 0, len(graph))
	for pkg := range graph {
		pkgs = append(pkgs, pkg)
	}
	sort.Strings(pkgs)
	used := map[[2]string]bool{}
	for _, from := range pkgs {
		for _, to := range graph[from] {
			for _, r := range rules {
				if !r.rejects(from, to) {
					continue
				}
				if _, ok := allowed[[2]string{from, to}]; ok {
					used[[2]string{from, to}] = true
					continue
				}
				t.Errorf("%s -> %s: %s", from, to, r.why)
			}
		}
	}
	for edge, why := range allowed {
		if !used[edge] {
			t.Errorf("allowed edge %s -> %s (%s) no longer exists or breaks no rule: remove it", edge[0], edge[1], why)
		}
	}
	// Every rule still governs a package: a renamed layer does not leave
	// a rule matching nothing.
	for _, r := range rules {
		found := false
		for _, pkg := range pkgs {
			if matchAny(r.from, pkg) && !matchAny(r.except, pkg) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("rule %q applies to no package of the module: the table is stale", r.why)
		}
	}
}

// TestRulesRejectTheirWitness: each rule rejects the violating edge it
// names, and no allowed edge excuses it, so a rule cannot pass by being
// blind.
func TestRulesRejectTheirWitness(t *testing.T) {
	for _, r := range rules {
		from, to := r.witness[0], r.witness[1]
		if !r.rejects(from, to) {
			t.Errorf("rule %q does not reject its witness %s -> %s", r.why, from, to)
		}
		if _, ok := allowed[r.witness]; ok {
			t.Errorf("rule %q: its witness %s -> %s is an allowed edge", r.why, from, to)
		}
	}
	// And the rules let the real layering through: node -> qpcore ->
	// meta -> verbs, nic -> verbs/softnic.
	for _, edge := range [][2]string{{"node", "qpcore"}, {"node", "fs"}, {"qpcore", "meta"}, {"qpcore", "dct"}, {"meta", "verbs"}, {"nic", "verbs/softnic"}, {"cmd/krfs", "bench"}, {"qpcore", "clock"}} {
		for _, r := range rules {
			if r.rejects(edge[0], edge[1]) {
				t.Errorf("rule %q rejects the intended edge %s -> %s", r.why, edge[0], edge[1])
			}
		}
	}
}
