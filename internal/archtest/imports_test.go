package archtest

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// module is the module path; packages outside it are not looked at.
const module = "github.com/airlockdev/airlock"

// pkg is one package of `go list -deps -test`: a production package, the test
// variant of one (its in-package _test.go files compiled in) or a variant recompiled
// for another package's test, or an external test package (package x_test).
type pkg struct {
	rel     string   // path inside the module, variant suffix removed: "egressd/enforcer"
	imports []string // the module's packages it imports, the same way
	// external is set for an external test package ("egressd/enforcer_test"): nothing
	// can import it, so, like cmd/, it is a root that may import anything.
	external bool
	// variant is set for a package compiled for a test ("egressd [egressd.test]"):
	// with its in-package _test.go files, or recompiled against such a package.
	variant bool
}

// listPackages runs `go list -deps -test` over the whole module, once per test binary.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	pkgs, err := goList()
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

var goList = sync.OnceValues(func() ([]pkg, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOMOD: %v", err)
	}
	cmd := exec.Command("go", "list", "-deps", "-test", "-f", `{{.ImportPath}}|{{join .Imports ","}}`, "./...")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	for line := range strings.Lines(string(out)) {
		path, imports, _ := strings.Cut(strings.TrimSpace(line), "|")
		rel, ok := inModule(path)
		if !ok || strings.HasSuffix(rel, ".test") { // outside, or a generated test main
			continue
		}
		p := pkg{rel: rel, external: strings.HasSuffix(rel, "_test"), variant: strings.Contains(path, " [")}
		for _, imp := range strings.Split(imports, ",") {
			if r, ok := inModule(imp); ok {
				p.imports = append(p.imports, r)
			}
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		return nil, fmt.Errorf("go list found %d packages of %s; want the whole module", len(pkgs), module)
	}
	return pkgs, nil
})

// inModule returns path's place in the module ("egressd/enforcer"), without the
// " [x.test]" suffix of a test variant.
func inModule(path string) (string, bool) {
	path, _, _ = strings.Cut(path, " ")
	rel, ok := strings.CutPrefix(path, module+"/")
	return rel, ok
}

// dirOf is the folder of a package: an external test package's is its package's.
func dirOf(rel string) string {
	return strings.TrimSuffix(rel, "_test")
}

// under reports whether rel is folder dir or inside it.
func under(rel, dir string) bool {
	return rel == dir || strings.HasPrefix(rel, dir+"/")
}

// TestEgressdDoesNotImportEBPF: egressd depends only on the datapath contract; the eBPF
// backend (ebpf/, which implements egressd/datapath) reaches it from a composition root
// (cmd/airlock, internal/up; in tests the external test packages, through
// internal/ebpftest). No package under egressd/ imports a package under ebpf/: its
// production code, the test variants with its in-package tests, and its external test
// packages.
func TestEgressdDoesNotImportEBPF(t *testing.T) {
	for _, p := range listPackages(t) {
		if !under(dirOf(p.rel), "egressd") {
			continue
		}
		for _, imp := range p.imports {
			if under(imp, "ebpf") {
				t.Errorf("%s imports %s: egressd gets the eBPF backend from its composition root (enforcer.Config.EBPF)", p.rel, imp)
			}
		}
	}
}

// node is the unit the loop check works on: a top-level folder, except that each
// package of internal/ is its own (internal/ holds unrelated packages, from the
// composition of `airlock up` to leaf test helpers, not one component).
func node(rel string) string {
	parts := strings.SplitN(dirOf(rel), "/", 3)
	if parts[0] == "internal" && len(parts) > 1 {
		return "internal/" + parts[1]
	}
	return parts[0]
}

// testOnlyLoops are the folder edges, made by tests only, that close a known loop,
// with the reason they are tolerated. An edge listed here that production code makes
// counts; a listed edge that no test makes any more fails the test, so that the entry
// is removed.
var testOnlyLoops = map[[2]string]string{
	// egressd's in-package tests drive sandboxes through the Go SDK, whose vault client
	// uses egressd/vault's wire types. Breaking it means moving those types out of
	// egressd (or the tests into an external test package); not part of the egress
	// plane's layering (egressd/ and ebpf/).
	{"egressd", "sdk"}: "egressd's tests use the Go SDK, which uses egressd/vault's types",
}

// TestNoFolderLoops: the top-level folders (and internal/'s packages, see node) import
// one another without a loop. Production packages and the test variants of packages
// (their in-package _test.go files) count; cmd/ and the external test packages are
// roots (nothing imports them, so they close no loop) and may import anything. The
// loops of testOnlyLoops are reported (t.Log), not failed.
func TestNoFolderLoops(t *testing.T) {
	edges := map[string]map[string]string{} // from → to → one import that makes the edge
	prod := map[[2]string]bool{}
	for _, p := range listPackages(t) {
		if p.external || node(p.rel) == "cmd" {
			continue
		}
		from := node(p.rel)
		for _, imp := range p.imports {
			to := node(imp)
			if to == from {
				continue
			}
			if !p.variant {
				prod[[2]string{from, to}] = true
			}
			if edges[from] == nil {
				edges[from] = map[string]string{}
			}
			if _, ok := edges[from][to]; !ok {
				edges[from][to] = p.rel + " → " + imp
			}
		}
	}
	for e, reason := range testOnlyLoops {
		switch w, ok := edges[e[0]][e[1]]; {
		case !ok:
			t.Errorf("testOnlyLoops lists %s → %s, which nothing imports any more: remove the entry", e[0], e[1])
		case !prod[e]:
			delete(edges[e[0]], e[1])
			if !reaches(edges, e[1], e[0]) {
				t.Errorf("testOnlyLoops lists %s → %s, which closes no loop any more: remove the entry", e[0], e[1])
				continue
			}
			t.Logf("tolerated test-only loop edge %s → %s (%s): %s", e[0], e[1], w, reason)
		}
	}
	for _, loop := range loops(edges) {
		var why []string
		for _, a := range loop {
			for _, b := range loop {
				if w, ok := edges[a][b]; ok {
					why = append(why, w)
				}
			}
		}
		t.Errorf("import loop between %s:\n\t%s", strings.Join(loop, ", "), strings.Join(why, "\n\t"))
	}
}

// loops returns the strongly connected components of more than one node of the graph
// (Tarjan's algorithm), each sorted, in a stable order: every folder loop is inside
// one.
func loops(edges map[string]map[string]string) [][]string {
	var nodes []string
	seen := map[string]bool{}
	for from, tos := range edges {
		for _, n := range append([]string{from}, keys(tos)...) {
			if !seen[n] {
				seen[n] = true
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(nodes)
	index, low, onStack := map[string]int{}, map[string]int{}, map[string]bool{}
	var stack []string
	var out [][]string
	var visit func(string)
	visit = func(v string) {
		index[v], low[v] = len(index), len(index)
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range keys(edges[v]) {
			if _, ok := index[w]; !ok {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var scc []string
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			scc = append(scc, w)
			if w == v {
				break
			}
		}
		if len(scc) > 1 {
			slices.Sort(scc)
			out = append(out, scc)
		}
	}
	for _, v := range nodes {
		if _, ok := index[v]; !ok {
			visit(v)
		}
	}
	slices.SortFunc(out, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
	return out
}

// reaches reports whether there is a path from a to b.
func reaches(edges map[string]map[string]string, a, b string) bool {
	seen := map[string]bool{a: true}
	next := []string{a}
	for len(next) > 0 {
		v := next[len(next)-1]
		next = next[:len(next)-1]
		if v == b {
			return true
		}
		for w := range edges[v] {
			if !seen[w] {
				seen[w] = true
				next = append(next, w)
			}
		}
	}
	return false
}

func keys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestLoops checks the loop finder itself on the shape the egress plane had: ebpf
// imported egressd/datapath while egressd/enforcer imported ebpf.
func TestLoops(t *testing.T) {
	for _, c := range []struct {
		name  string
		edges map[string][]string
		want  string
	}{
		{"none", map[string][]string{"cmd": {"egressd", "ebpf"}, "ebpf": {"egressd"}, "egressd": {"policies"}}, "[]"},
		{"two", map[string][]string{"ebpf": {"egressd"}, "egressd": {"ebpf", "policies"}}, "[[ebpf egressd]]"},
		{"through_a_helper", map[string][]string{"egressd": {"internal/x"}, "internal/x": {"ebpf"}, "ebpf": {"egressd"}, "lifecycle": {"gateway"}, "gateway": {"lifecycle"}},
			"[[ebpf egressd internal/x] [gateway lifecycle]]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := map[string]map[string]string{}
			for from, tos := range c.edges {
				g[from] = map[string]string{}
				for _, to := range tos {
					g[from][to] = ""
				}
			}
			if got := fmt.Sprint(loops(g)); got != c.want {
				t.Errorf("loops = %s, want %s", got, c.want)
			}
		})
	}
}
