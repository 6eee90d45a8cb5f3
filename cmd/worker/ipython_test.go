package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
)

// ipythonCell is a cell of testdata/ipython/cells.json.
type ipythonCell struct {
	Name  string            `json:"name"`
	Cell  string            `json:"cell"`
	Files map[string]string `json:"files"`
}

// ipythonAnswer is what IPython answered a cell (testdata/ipython/reference.json,
// recorded by record.py with Debian's ipython3 beside the datascience sandbox's
// apt_packages).
type ipythonAnswer struct {
	Name           string `json:"name"`
	ExecutionCount int    `json:"execution_count"`
	Out            *struct {
		Data map[string]string `json:"data"`
	} `json:"out"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	Error  *struct {
		Ename  string `json:"ename"`
		Evalue string `json:"evalue"`
	} `json:"error"`
	Displays []struct {
		Data map[string]string `json:"data"`
	} `json:"displays"`
}

// ipythonDivergences are the cells whose answer differs from IPython's on purpose, and
// what must be answered instead: the sandbox is not IPython's kernel.
var ipythonDivergences = map[string]struct {
	why   string
	check func(t *testing.T, out runOutput, text string)
}{
	"showing the nested value": {
		why: "IPython sends the formatter's RecursionError as an error output; the harness writes it on stderr, where a model reads it",
		check: func(t *testing.T, out runOutput, text string) {
			if !out.Success || out.Out != nil || !strings.Contains(out.Stderr, "could not be shown: RecursionError") {
				t.Errorf("%s, want success, no Out, the RecursionError on stderr", text)
			}
		},
	},
	"importing pip": {
		why: "the reference image has pip; a sandbox has none, and says so",
		check: func(t *testing.T, out runOutput, text string) {
			if out.Error != "ModuleNotFoundError: No module named 'pip'" || !strings.Contains(out.Hint, "cannot install packages") {
				t.Errorf("%s, want a ModuleNotFoundError whose hint says packages cannot be installed", text)
			}
		},
	},
	"a pip install through the shell": {
		why: "a sandbox has no shell and no network: IPython syntax is a SyntaxError whose hint says what to do",
		check: func(t *testing.T, out runOutput, text string) {
			if !strings.HasPrefix(out.Error, "SyntaxError: invalid syntax") || !strings.Contains(out.Hint, "`!pip` is IPython syntax") {
				t.Errorf("%s, want a SyntaxError with a hint on IPython syntax", text)
			}
		},
	},
	"the timeit magic": {
		why: "magics are IPython's: a SyntaxError whose hint names the module to use",
		check: func(t *testing.T, out runOutput, text string) {
			if !strings.HasPrefix(out.Error, "SyntaxError: invalid syntax") || !strings.Contains(out.Hint, "timeit module") {
				t.Errorf("%s, want a SyntaxError with a hint naming timeit", text)
			}
		},
	},
	"sys.exit does not end the session": {
		why: "IPython also prints a UserWarning on stderr and a traceback that says to use %tb",
		check: func(t *testing.T, out runOutput, text string) {
			if out.Success || out.Error != "SystemExit: 3" {
				t.Errorf("%s, want the error SystemExit: 3", text)
			}
		},
	},
}

// addresses are what varies from one run of a value's repr to the next (record.py
// applies the same rule to the reference).
var addresses = regexp.MustCompile(`\b0x[0-9a-f]+`)

// ipythonFile is IPython's name for a cell's source in a SyntaxError; the harness's is
// <script>.
var ipythonFile = regexp.MustCompile(`<ipython-input-\d+-[0-9a-f]+>`)

func normalize(s string) string {
	return ipythonFile.ReplaceAllString(addresses.ReplaceAllString(s, "0x…"), "<script>")
}

// TestMCPAnswersAsIPythonDoes runs the code-interpreter cells of testdata/ipython, in
// order, as one conversation of `worker mcp` in the datascience sandbox (the cells
// share state, as a notebook's do), and compares each answer with IPython's on the
// same cell, recorded with the same Python, numpy, pandas and matplotlib: its Out
// (text/plain) and execution count, what it printed, its error, what it displayed.
// The cells of ipythonDivergences answer otherwise on purpose, each as its check says.
func TestMCPAnswersAsIPythonDoes(t *testing.T) {
	var cells []ipythonCell
	var ref struct {
		IPython string          `json:"ipython"`
		Cells   []ipythonAnswer `json:"cells"`
	}
	for file, v := range map[string]any{"testdata/ipython/cells.json": &cells, "testdata/ipython/reference.json": &ref} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	if len(cells) != len(ref.Cells) || len(cells) < 40 {
		t.Fatalf("%d cells and %d answers: record.py records them again", len(cells), len(ref.Cells))
	}
	srv, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Spec: "datascience", Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 1}})
	c := dial(t, mcpTransports[1], srv.ClientURL())
	matched, diverged := 0, 0
	for i, cell := range cells {
		want := ref.Cells[i]
		if want.Name != cell.Name {
			t.Fatalf("cell %d is %q in cells.json and %q in reference.json", i, cell.Name, want.Name)
		}
		var files []map[string]any
		for path, text := range cell.Files {
			files = append(files, map[string]any{"path": path, "text": text})
		}
		args := map[string]any{"script": cell.Cell, "sandbox": "datascience", "files": files}
		res := c.call(t, "run_python", args)
		out := structured[runOutput](t, res)
		text := textOf(res)
		if d, ok := ipythonDivergences[cell.Name]; ok {
			if d.why == "" {
				t.Fatalf("divergence %q says not why", cell.Name)
			}
			t.Run(cell.Name, func(t *testing.T) { d.check(t, out, text) })
			diverged++
			continue
		}
		ok := t.Run(cell.Name, func(t *testing.T) {
			var gotOut, wantOut *string
			if out.Out != nil {
				s := normalize(out.Out["text/plain"])
				gotOut = &s
			}
			if want.Out != nil {
				s := normalize(want.Out.Data["text/plain"])
				wantOut = &s
			}
			switch {
			case (gotOut == nil) != (wantOut == nil) || gotOut != nil && *gotOut != *wantOut:
				t.Errorf("Out %s, IPython's %s\n%s", quoteOrNone(gotOut), quoteOrNone(wantOut), text)
			case wantOut != nil && out.ExecutionCount != want.ExecutionCount:
				t.Errorf("Out[%d], IPython's Out[%d]", out.ExecutionCount, want.ExecutionCount)
			}
			if normalize(out.Stdout) != normalize(want.Stdout) {
				t.Errorf("stdout %q, IPython's %q", out.Stdout, want.Stdout)
			}
			wantError := ""
			if want.Error != nil {
				wantError = normalize(strings.TrimSuffix(want.Error.Ename+": "+want.Error.Evalue, ": "))
			}
			if got := normalize(out.Error); got != wantError {
				t.Errorf("error %q, IPython's %q\n%s", got, wantError, text)
			}
			if len(out.Displays) != len(want.Displays) {
				t.Fatalf("%d displays, IPython's %d", len(out.Displays), len(want.Displays))
			}
			for j, d := range want.Displays {
				got := out.Displays[j]
				if normalize(got.Data["text/plain"]) != normalize(d.Data["text/plain"]) || (got.Image != nil) != (d.Data["image/png"] != "") {
					t.Errorf("display %d: %q (image %v), IPython's %q (image %v)", j+1, got.Data["text/plain"], got.Image != nil, d.Data["text/plain"], d.Data["image/png"] != "")
				}
			}
		})
		if ok {
			matched++
		}
	}
	if diverged != len(ipythonDivergences) {
		t.Errorf("%d cells diverge, but %d are named: a name matches no cell", diverged, len(ipythonDivergences))
	}
	t.Logf("%d of %d cells answered as IPython %s does, %d differ on purpose", matched, len(cells), ref.IPython, diverged)
}

func quoteOrNone(s *string) string {
	if s == nil {
		return "none"
	}
	b, _ := json.Marshal(*s)
	return string(b)
}
