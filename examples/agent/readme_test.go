package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func readme(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTheREADMEsGoAgentRunsAgainstAWorker: the README's Go program is this package's
// main.go (but for its doc comment), and it runs against a real worker and prints what
// the README says it prints.
func TestTheREADMEsGoAgentRunsAgainstAWorker(t *testing.T) {
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(readme(t), -1)
	if len(blocks) != 1 {
		t.Fatalf("the README has %d Go blocks, want 1", len(blocks))
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	program := string(src[strings.Index(string(src), "package main"):])
	if blocks[0][1] != program {
		t.Fatalf("the README's Go program is not examples/agent/main.go:\n%s", blocks[0][1])
	}
	srv, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 0}})
	cmd := exec.Command(testenv.StaticBinary(t, "./examples/agent"))
	cmd.Env = append(os.Environ(), "NATS_URL="+srv.ClientURL())
	out, err := cmd.CombinedOutput()
	if want := "computing\nOut: 6 as a float64: 6\n"; err != nil || string(out) != want {
		t.Errorf("the agent printed %q (%v), want %q", out, err, want)
	}
	if !strings.Contains(readme(t), "`computing`, then `Out: 6 as a float64: 6`") {
		t.Error("the README does not say what the agent prints")
	}
}

// TestTheREADMEIsAQuickstart: at most 250 lines, and every link of it and of docs/ to
// a file of the repository resolves.
func TestTheREADMEIsAQuickstart(t *testing.T) {
	if n := strings.Count(readme(t), "\n"); n > 250 {
		t.Errorf("the README has %d lines, more than 250: the details go to docs/", n)
	}
	docs, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	link := regexp.MustCompile(`\]\(([^)#]+)(#[^)]*)?\)`)
	for _, file := range append(docs, filepath.Join(testenv.RepoRoot(), "README.md")) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range link.FindAllStringSubmatch(string(b), -1) {
			if strings.Contains(l[1], "://") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(file), l[1])); err != nil {
				t.Errorf("%s links %s, which is not there", filepath.Base(file), l[1])
			}
		}
	}
}
