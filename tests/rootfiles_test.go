package tests

// The root package's files hang from its hub: module.go and serve.go (the
// Handler, its Provision and ServeHTTP) may use every other file, and the
// other files may use the hub and each other, but never in a loop. Checked
// on the type-checked package: a file uses another when it names something
// (a type, function, method, field, variable or constant) that the other
// declares.

import (
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// rootHub names the files the others may call back into.
var rootHub = []string{"module.go", "serve.go", "zoneconfig.go"}

// fileUses maps each file of pkg to the set of its other files it uses.
func fileUses(pkg *packages.Package) map[string]map[string]bool {
	fileOf := func(pos token.Pos) string {
		if !pos.IsValid() {
			return ""
		}
		return filepath.Base(pkg.Fset.Position(pos).Filename)
	}
	uses := map[string]map[string]bool{}
	for _, f := range pkg.Syntax {
		uses[fileOf(f.Pos())] = map[string]bool{}
	}
	for id, obj := range pkg.TypesInfo.Uses {
		if obj.Pkg() != pkg.Types {
			continue
		}
		if v, ok := obj.(*types.Var); ok && !v.IsField() && v.Parent() != pkg.Types.Scope() {
			continue // a local or a parameter
		}
		if _, ok := obj.(*types.Label); ok {
			continue
		}
		if c, ok := obj.(*types.Const); ok && c.Parent() != pkg.Types.Scope() {
			continue
		}
		if tn, ok := obj.(*types.TypeName); ok && tn.Parent() != pkg.Types.Scope() {
			continue
		}
		from, to := fileOf(id.Pos()), fileOf(obj.Pos())
		if from != to && uses[from] != nil && uses[to] != nil {
			uses[from][to] = true
		}
	}
	return uses
}

// fileLoops lists each loop of use between files outside hub, as the files
// of one strongly connected component, sorted.
func fileLoops(uses map[string]map[string]bool, hub []string) [][]string {
	var names []string
	for f := range uses {
		if !slices.Contains(hub, f) {
			names = append(names, f)
		}
	}
	slices.Sort(names)
	// Tarjan's algorithm over the files outside the hub.
	index, low := map[string]int{}, map[string]int{}
	onStack := map[string]bool{}
	var stack []string
	var loops [][]string
	next := 0
	var visit func(string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range names {
			if !uses[v][w] {
				continue
			}
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var loop []string
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			loop = append(loop, w)
			if w == v {
				break
			}
		}
		if len(loop) > 1 {
			slices.Sort(loop)
			loops = append(loops, loop)
		}
	}
	for _, v := range names {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return loops
}

func TestRootFilesHangFromTheHub(t *testing.T) {
	t.Parallel()
	pkgs, err := packages.Load(&packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Dir:  "..",
	}, ".")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) != 1 || len(pkgs[0].Errors) > 0 {
		t.Fatalf("loading the root package: %d packages, errors %v", len(pkgs), pkgs[0].Errors)
	}
	uses := fileUses(pkgs[0])
	for _, h := range rootHub {
		if uses[h] == nil {
			t.Fatalf("no hub file %s in the root package (renamed?): update rootHub and module.go's doc", h)
		}
	}
	if len(uses) < 10 {
		t.Fatalf("read %d files of the root package: %v", len(uses), uses)
	}
	for _, loop := range fileLoops(uses, rootHub) {
		var edges []string
		for _, a := range loop {
			for _, b := range loop {
				if uses[a][b] {
					edges = append(edges, a+" → "+b)
				}
			}
		}
		t.Errorf("root files in a loop of use: %s (%s); move what both need to one of them or to the hub",
			strings.Join(loop, ", "), strings.Join(edges, "; "))
	}
}

// The loop finder catches a loop of two and of three, and ignores a loop
// through the hub.
func TestFileLoopsFindsEachLoop(t *testing.T) {
	t.Parallel()
	g := func(edges ...string) map[string]map[string]bool {
		uses := map[string]map[string]bool{}
		for _, e := range edges {
			a, b, _ := strings.Cut(e, ">")
			for _, f := range []string{a, b} {
				if uses[f] == nil {
					uses[f] = map[string]bool{}
				}
			}
			uses[a][b] = true
		}
		return uses
	}
	hub := []string{"hub"}
	for _, c := range []struct {
		uses map[string]map[string]bool
		want string
	}{
		{g("hub>a", "hub>b", "a>hub", "b>hub", "a>b"), ""},
		{g("a>hub", "hub>a", "b>hub", "hub>b", "a>c", "c>b"), ""},
		{g("a>b", "b>a", "c>a"), "a,b"},
		{g("a>b", "b>c", "c>a", "d>a"), "a,b,c"},
		{g("a>b", "b>a", "c>d", "d>c"), "a,b c,d"},
	} {
		var got []string
		for _, l := range fileLoops(c.uses, hub) {
			got = append(got, strings.Join(l, ","))
		}
		slices.Sort(got)
		if s := strings.Join(got, " "); s != c.want {
			t.Errorf("loops of %v = %q, want %q", c.uses, s, c.want)
		}
	}
}
