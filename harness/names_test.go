package harness

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jazzmine/worker/wire"
)

// TestThePythonHarnessNamesWhatGoNames holds the two languages of the harness
// together: the event types, error kinds, request types and modes that the Python
// package names (jazzmine_harness/protocol.py) are wire's and this package's, so that
// neither side can add, drop or misspell one alone. Wire's lists are read from its
// source: a constant added to wire fails this test until the harness names it too, or
// it is listed below as the worker's alone.
func TestThePythonHarnessNamesWhatGoNames(t *testing.T) {
	py := pythonNames(t)
	// What the worker publishes and the harness never says: a container took the job,
	// and a job that could not be decoded.
	workerOnlyEvents := []string{wire.EventStarted}
	workerOnlyKinds := []string{wire.KindInvalidJob}

	events := append(without(wireConsts(t, "EventScriptDone", wire.EventScriptDone), workerOnlyEvents), EventReady, EventResetDone, EventPong, EventChunk)
	kinds := without(wireConsts(t, "KindScript", wire.KindScript), workerOnlyKinds)
	tests := []struct {
		name   string
		python []string
		golang []string
	}{
		{"event types (EVENT_TYPES): wire's but the worker's own, and ready, reset_done, pong, chunk", py.Events, events},
		{"error kinds (ERROR_KINDS): wire's but the worker's own", py.Kinds, kinds},
		{"request types (REQUEST_TYPES)", py.Requests, []string{requestExecute, requestCancel, requestReset, requestPing, requestFile, requestChunk}},
		{"modes (MODES)", py.Modes, []string{string(ModePlan), string(ModeInteractive)}},
		{"the error and hint of no result (NO_RESULT, NO_RESULT_HINT)", py.NoResult, []string{ErrNoResult, NoResultHint}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, g := slices.Sorted(slices.Values(tt.python)), slices.Sorted(slices.Values(tt.golang))
			if len(slices.Compact(slices.Clone(p))) != len(p) {
				t.Errorf("the harness names one twice: %q", p)
			}
			if !slices.Equal(p, g) {
				t.Errorf("the harness names %q\nGo names          %q", p, g)
			}
		})
	}
}

type harnessNames struct {
	Events   []string `json:"events"`
	Kinds    []string `json:"kinds"`
	Requests []string `json:"requests"`
	Modes    []string `json:"modes"`
	NoResult []string `json:"no_result"`
}

// pythonNames imports the embedded harness's protocol module under python3 and
// returns its lists.
func pythonNames(t *testing.T) harnessNames {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, Source()); err != nil {
		t.Fatal(err)
	}
	const script = `import json, sys
sys.path.insert(0, sys.argv[1])
from jazzmine_harness import protocol as p
print(json.dumps({"events": p.EVENT_TYPES, "kinds": p.ERROR_KINDS, "requests": p.REQUEST_TYPES, "modes": p.MODES, "no_result": [p.NO_RESULT, p.NO_RESULT_HINT]}))`
	out, err := exec.Command("python3", "-B", "-P", "-c", script, dir).Output()
	if err != nil {
		t.Fatalf("python3: %v: %s", err, stderrOf(err))
	}
	var names harnessNames
	if err := json.Unmarshal(out, &names); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	return names
}

func stderrOf(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return nil
}

// wireConsts returns the values of the constants declared, in wire's source, in the
// same group as the constant named member, whose value there must be want (the
// compiled constant: the source read is the package built).
func wireConsts(t *testing.T, member, want string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "wire", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST || !declares(g, member) {
				continue
			}
			names, values := constStrings(t, fset, g)
			if i := slices.Index(names, member); values[i] != want {
				t.Fatalf("wire's source gives %s the value %q, the package built %q", member, values[i], want)
			}
			return values
		}
	}
	t.Fatalf("no constant %s in wire's source", member)
	return nil
}

func declares(g *ast.GenDecl, name string) bool {
	for _, spec := range g.Specs {
		for _, id := range spec.(*ast.ValueSpec).Names {
			if id.Name == name {
				return true
			}
		}
	}
	return false
}

// constStrings returns the names and values of the constant group g, each a string
// literal (the test fails on any other).
func constStrings(t *testing.T, fset *token.FileSet, g *ast.GenDecl) (names, values []string) {
	t.Helper()
	for _, spec := range g.Specs {
		vs := spec.(*ast.ValueSpec)
		for i, id := range vs.Names {
			var lit *ast.BasicLit
			if i < len(vs.Values) {
				lit, _ = vs.Values[i].(*ast.BasicLit)
			}
			if lit == nil || lit.Kind != token.STRING {
				t.Fatalf("%s: %s is not a string literal; this test reads only those", fset.Position(id.Pos()), id.Name)
			}
			v, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			names, values = append(names, id.Name), append(values, v)
		}
	}
	return names, values
}

func without(list, drop []string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(s string) bool { return slices.Contains(drop, s) })
}
