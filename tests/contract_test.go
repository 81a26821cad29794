package tests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The store contract (DESIGN.md §1.1) held to its size and shape: zones
// declares at most four store interfaces with sixteen methods in all, and
// no shipped code asks a store what it is after provision. A new capability
// is a new step kind, not a new interface or a run-time check.

// storeContractLimits are the most interfaces and methods zones declares.
const (
	maxStoreInterfaces = 4
	maxStoreMethods    = 16
)

// storeTypes are the names whose type assertions are store assertions.
var storeTypes = []string{"Store", "Strict", "Async", "Shared", "Records", "BanList", "Slots", "regionalStore", "storeHealth", "resetNotifier"}

// provisionFuncs are the functions that may assert a store's type: where a
// region is opened over its regional store, once. A store's capabilities
// are declared where it is made (its Offers, the root's backend), so no
// code switches on a store's type: a type switch over a store is refused
// everywhere.
var provisionFuncs = []string{"OpenRegion"}

func TestStoreContractIsSmall(t *testing.T) {
	n, methods := 0, 0
	for _, f := range parseShipped(t, "zones") {
		ast.Inspect(f.file, func(node ast.Node) bool {
			if ts, ok := node.(*ast.TypeSpec); ok {
				if it, ok := ts.Type.(*ast.InterfaceType); ok {
					n++
					methods += len(it.Methods.List)
				}
			}
			return true
		})
	}
	if n > maxStoreInterfaces || methods > maxStoreMethods {
		t.Errorf("zones declares %d interfaces with %d methods: the store contract allows %d with %d; a new capability is a step kind (zones.Op) or a field of zones.Offers, not an interface",
			n, methods, maxStoreInterfaces, maxStoreMethods)
	}
	if n == 0 {
		t.Fatal("no interface found in zones: this check has lost track of the package")
	}
}

func TestNoStoreTypeAssertionAfterProvision(t *testing.T) {
	found := storeAssertions(t, "", "zones", "distributed")
	var bad []string
	allowed := 0
	for _, a := range found {
		if !a.isSwitch && slices.Contains(provisionFuncs, a.fn) {
			allowed++
			continue
		}
		bad = append(bad, a.String())
	}
	if len(bad) > 0 {
		t.Errorf("a store's type is asserted after provision (read zones.Offers, or keep what provision found):\n%s", strings.Join(bad, "\n"))
	}
	if allowed == 0 {
		t.Fatal("no store assertion found even where stores are opened: this check has lost track of them")
	}
}

type assertion struct {
	pos      token.Position
	fn       string
	typ      string
	isSwitch bool // a type switch, not an assertion
}

func (a assertion) String() string {
	if a.isSwitch {
		return a.pos.String() + " in " + a.fn + ": a type switch with case " + a.typ
	}
	return a.pos.String() + " in " + a.fn + ": " + a.typ
}

// storeAssertions lists the type assertions and type switches of shipped
// code, in dirs (module-relative), whose type is one of storeTypes or an
// anonymous interface.
func storeAssertions(t *testing.T, dirs ...string) []assertion {
	var out []assertion
	for _, dir := range dirs {
		for _, f := range parseShipped(t, dir) {
			for _, d := range f.file.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				ast.Inspect(fd.Body, func(node ast.Node) bool {
					var types []ast.Expr
					var operand ast.Expr
					_, isSwitch := node.(*ast.TypeSwitchStmt)
					switch n := node.(type) {
					case *ast.TypeAssertExpr:
						types, operand = append(types, n.Type), n.X
					case *ast.TypeSwitchStmt:
						ast.Inspect(n.Assign, func(node ast.Node) bool {
							if ta, ok := node.(*ast.TypeAssertExpr); ok {
								operand = ta.X
							}
							return operand == nil
						})
						for _, c := range n.Body.List {
							types = append(types, c.(*ast.CaseClause).List...)
						}
					}
					for _, typ := range types {
						if name, ok := storeTypeName(typ); ok && (name != anonymous || mentionsStore(operand)) {
							out = append(out, assertion{f.fset.Position(typ.Pos()), fd.Name.Name, name, isSwitch})
						}
					}
					return true
				})
			}
		}
	}
	return out
}

func storeTypeName(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.StarExpr:
		return storeTypeName(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name, slices.Contains(storeTypes, e.Sel.Name)
	case *ast.Ident:
		return e.Name, slices.Contains(storeTypes, e.Name)
	case *ast.InterfaceType:
		return anonymous, true
	}
	return "", false
}

const anonymous = "an anonymous interface"

// mentionsStore reports whether an asserted expression reads a store: an
// anonymous interface asserted on anything else (a net.Conn) is not a
// store's.
func mentionsStore(e ast.Expr) bool {
	return e != nil && strings.Contains(strings.ToLower(types.ExprString(e)), "store")
}

type parsedFile struct {
	fset *token.FileSet
	file *ast.File
}

// parseShipped parses the non-test Go files of dir, module-relative.
func parseShipped(t *testing.T, dir string) []parsedFile {
	t.Helper()
	root := filepath.Join("..", dir)
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var out []parsedFile
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(root, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, parsedFile{fset, f})
	}
	return out
}
