package tests

// Where things are, kept true by reading the tree: the README's Layout table
// names every package and every root file (and nothing that is gone), the
// file names of this package say which tests start Caddy, and the shipped
// code stays within its line budget.

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeLayout returns the paths the first column of the README's Layout
// table names (`module.go`, `zones/`, several to a cell), with the line
// of each.
func readmeLayout(t *testing.T) map[string]int {
	t.Helper()
	f, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	named := map[string]int{}
	code := regexp.MustCompile("`([^`]+)`")
	inSection, inTable := false, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			if inSection {
				break
			}
			inSection = strings.TrimSpace(strings.TrimPrefix(line, "## ")) == "Layout"
			continue
		}
		if !inSection {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break // the table is over
			}
			continue
		}
		inTable = true
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.Trim(cells[1], " -:") == "" || strings.TrimSpace(cells[1]) == "path" {
			continue // separator or header row
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			named[m[1]] = n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(named) == 0 {
		t.Fatal("README.md has no ## Layout table whose first column names paths in `backticks`")
	}
	return named
}

// shippedLayout returns the shipped module's non-test root .go files and its
// package directories (as "dir/"), read from the tree, and "tests/".
func shippedLayout(t *testing.T) []string {
	t.Helper()
	var want []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch {
			case rel == ".":
				return nil
			case strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata":
				return filepath.SkipDir
			case rel == "tests": // its own module
				want = append(want, "tests/")
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		if dir := filepath.ToSlash(filepath.Dir(rel)); dir == "." {
			want = append(want, rel)
		} else if !slices.Contains(want, dir+"/") {
			want = append(want, dir+"/")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// A newcomer finds every file of the root package and every package in the
// README's Layout table, and no row points at something that is gone.
func TestReadmeLayoutNamesEveryPackageAndRootFile(t *testing.T) {
	t.Parallel()
	named := readmeLayout(t)
	want := shippedLayout(t)
	for _, p := range want {
		if _, ok := named[p]; !ok {
			t.Errorf("README.md's Layout table does not name %s: add a row (or add it to a row) saying what it holds", p)
		}
	}
	for p, line := range named {
		if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(p))); err != nil {
			t.Errorf("README.md:%d: the Layout table names %s, which is not in the tree: %v", line, p, err)
		}
	}
	// The check itself: the request path and the maths are in the tree.
	for _, p := range []string{"serve.go", "algorithms/", "distributed/"} {
		if !slices.Contains(want, p) {
			t.Errorf("the tree has no %s: if it moved, update this test and the README", p)
		}
	}
}

// The file names of this package say which tests start Caddy (see
// main_test.go): a test that starts Caddy, directly or through a helper,
// is in a *_caddy_test.go file; each such file has one; harness_* files
// hold no tests.
func TestFileNamesSayWhichTestsStartCaddy(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	// refs: what each top-level function or method (by name; methods as
	// "Type.Name") names; a selector x.M is kept as ".M".
	refs := map[string][]string{}
	methods := map[string][]string{} // method name -> "Type.Name"s
	tests := map[string][]string{}   // file -> its Test and Benchmark functions
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil {
				typ := fd.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					name = id.Name + "." + name
					methods[fd.Name.Name] = append(methods[fd.Name.Name], name)
				}
			} else if name != "TestMain" && (strings.HasPrefix(name, "Test") || strings.HasPrefix(name, "Benchmark")) {
				tests[file] = append(tests[file], name)
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					refs[name] = append(refs[name], "."+x.Sel.Name)
				case *ast.Ident:
					refs[name] = append(refs[name], x.Name)
				}
				return true
			})
		}
	}
	// Starting Caddy is newCaddyInstance (every instance) or caddyBinary
	// (adapt, fmt, the CLI).
	starts := map[string]bool{"newCaddyInstance": true, "caddyBinary": true}
	for changed := true; changed; {
		changed = false
		for fn, names := range refs {
			if starts[fn] {
				continue
			}
			for _, r := range names {
				hit := starts[r]
				if m, ok := strings.CutPrefix(r, "."); ok {
					// x.M starts Caddy when every method M does
					// (caddyInstance.Start does, redisServer.Start not).
					hit = len(methods[m]) > 0 && !slices.ContainsFunc(methods[m], func(full string) bool { return !starts[full] })
				}
				if hit {
					starts[fn], changed = true, true
					break
				}
			}
		}
	}
	if !slices.ContainsFunc(tests["local_caddy_test.go"], func(fn string) bool { return starts[fn] }) {
		t.Fatal("no test of local_caddy_test.go is found to start Caddy: this check has lost track of how Caddy is started")
	}
	for _, file := range files {
		var withCaddy []string
		for _, fn := range tests[file] {
			if starts[fn] {
				withCaddy = append(withCaddy, fn)
			}
		}
		switch {
		case strings.HasPrefix(file, "harness_"):
			if len(tests[file]) > 0 {
				t.Errorf("%s is harness but holds tests %v: move them to the file of the feature they test", file, tests[file])
			}
		case strings.HasSuffix(file, "_caddy_test.go"):
			if len(withCaddy) == 0 {
				t.Errorf("%s is named _caddy_test.go but none of its tests %v starts Caddy: drop the suffix", file, tests[file])
			}
		case len(withCaddy) > 0:
			t.Errorf("%s has tests that start Caddy (%v): they go in a *_caddy_test.go file", file, withCaddy)
		}
	}
}

// shippedLinesBudget bounds the shipped Go and Lua: every file outside
// tests/ that is not a _test.go file. A capability or a fix that needs more
// raises it in the same commit and says why; anything else fits inside it.
const shippedLinesBudget = 24_160

// shippedLines counts the lines of the shipped Go and Lua under root.
func shippedLines(root string) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (name == "tests" || strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, "_test.go") || !(strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".lua")) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n += strings.Count(string(b), "\n")
		return nil
	})
	return n, err
}

func TestShippedCodeStaysWithinItsBudget(t *testing.T) {
	t.Parallel()
	n, err := shippedLines("..")
	if err != nil {
		t.Fatal(err)
	}
	// The lower bound catches a count that misses the tree.
	if n < shippedLinesBudget/2 || n > shippedLinesBudget {
		t.Fatalf("shipped Go and Lua is %d lines, budget %d (tests/layout_test.go): a new capability or a fix raises the budget in its commit and says why; otherwise make room", n, shippedLinesBudget)
	}
	t.Logf("shipped Go and Lua: %d of %d lines", n, shippedLinesBudget)
}
