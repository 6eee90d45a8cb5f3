package worker_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestTheWorkerPackageKeepsItsShape: the package's files are layered, each using only
// names declared in the files below it (docs/ARCHITECTURE.md lists them lowest
// first), so that a part reads on its own; no file passes 600 lines and no function
// 80. A file that uses a name of a file that uses its own (a cycle) fails, naming the
// names. Methods are called through values and are not followed: a type's methods
// live in its file.
func TestTheWorkerPackageKeepsItsShape(t *testing.T) {
	const maxFileLines, maxFuncLines = 600, 80
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	declared := map[string]string{} // package-level name: its file
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
		if n := fset.Position(f.End()).Line; n > maxFileLines {
			t.Errorf("%s has %d lines, more than %d", name, n, maxFileLines)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if n := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1; n > maxFuncLines {
					t.Errorf("%s: %s has %d lines, more than %d", name, d.Name.Name, n, maxFuncLines)
				}
				if d.Recv == nil {
					declared[d.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						declared[s.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range s.Names {
							declared[n.Name] = name
						}
					}
				}
			}
		}
	}
	uses := map[string]map[string][]string{} // file: the files it uses, with the names
	for name, f := range files {
		uses[name] = map[string][]string{}
		for _, id := range packageNames(f) {
			if in, ok := declared[id]; ok && in != name && !slices.Contains(uses[name][in], id) {
				uses[name][in] = append(uses[name][in], id)
			}
		}
	}
	// A use that reaches back up is one whose file is reached from the file it uses.
	for from, to := range uses {
		for used, names := range to {
			if reaches(uses, used, from) {
				t.Errorf("%s uses %s of %s, which uses %s in turn: a cycle among the files", from, strings.Join(names, ", "), used, from)
			}
		}
	}
}

// packageNames returns the identifiers of f that may name a package-level
// declaration: not a selector's name, a composite literal's key or a field.
func packageNames(f *ast.File) []string {
	skip := map[*ast.Ident]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			skip[n.Sel] = true
		case *ast.KeyValueExpr:
			if id, ok := n.Key.(*ast.Ident); ok {
				skip[id] = true
			}
		case *ast.Field:
			for _, id := range n.Names {
				skip[id] = true
			}
		}
		return true
	})
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && !skip[id] && (id.Obj == nil || id.Obj.Kind != ast.Var) {
			names = append(names, id.Name)
		}
		return true
	})
	return names
}

// reaches reports whether file from uses file to, directly or through others.
func reaches(uses map[string]map[string][]string, from, to string) bool {
	seen := map[string]bool{}
	stack := []string{from}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if f == to {
			return true
		}
		if seen[f] {
			continue
		}
		seen[f] = true
		for used := range uses[f] {
			stack = append(stack, used)
		}
	}
	return false
}
