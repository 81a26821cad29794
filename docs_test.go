package ratelimit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// Caddy's JSON docs are generated from the doc comments of the modules'
// exported fields (the handler's, and the config types' of package config):
// a field without its own comment shows blank there.
func TestEveryExportedFieldHasItsOwnDoc(t *testing.T) {
	var files []string
	for _, pattern := range []string{"*.go", "config/*.go"} {
		matched, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, matched...)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ts.Name.IsExported() {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, field := range st.Fields.List {
				if field.Tag == nil || !strings.Contains(field.Tag.Value, `json:"`) {
					continue // not in the JSON config, so not in its docs
				}
				for _, id := range field.Names {
					if !id.IsExported() {
						continue
					}
					checked++
					if field.Doc == nil || len(field.Names) > 1 {
						t.Errorf("%s: %s.%s has no doc comment of its own", fset.Position(id.Pos()), ts.Name, id.Name)
					}
				}
			}
			return true
		})
	}
	if checked < 40 {
		t.Fatalf("checked %d exported fields, want the config types' 40 or more: did the files move?", checked)
	}
}
