package harness

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type localHarness struct {
	*Process
	workspace, tmp string
}

// startHarness runs the embedded harness under python3 with its own workspace, tmp and
// tools directories; tools maps file names to sources.
func startHarness(t testing.TB, tools map[string]string, env ...string) *localHarness {
	t.Helper()
	root := t.TempDir()
	h := &localHarness{workspace: filepath.Join(root, "workspace"), tmp: filepath.Join(root, "tmp")}
	toolsDir := filepath.Join(root, "tools")
	for _, d := range []string{h.workspace, h.tmp, toolsDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, src := range tools {
		if err := os.WriteFile(filepath.Join(toolsDir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr strings.Builder
	p, err := StartProcess(ctx, ProcessConfig{
		ToolsDir:  toolsDir,
		Workspace: h.workspace,
		TmpDir:    h.tmp,
		Env:       env,
		Stderr:    &lockedWriter{w: &stderr},
	})
	if err != nil {
		t.Fatalf("start harness: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close harness: %v", err)
		}
	})
	h.Process = p
	return h
}

type lockedWriter struct {
	mu sync.Mutex
	w  interface{ Write([]byte) (int, error) }
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// recorder collects the events an EventFunc sees.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) on(_ context.Context, ev Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	return nil
}

func (r *recorder) types() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.events {
		out = append(out, ev.Type)
	}
	return out
}

func (r *recorder) text(stream string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, ev := range r.events {
		if ev.Type == stream {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

// exec runs script with the given request fields over h and fails the test on a Go error.
func (h *localHarness) exec(t testing.TB, id, script string, opts ...func(*Request)) (*Result, *recorder) {
	t.Helper()
	req := Request{ExecutionID: id, Script: script, Timeout: 10 * time.Second}
	for _, o := range opts {
		o(&req)
	}
	rec := &recorder{}
	var e Executor
	res, err := e.Run(context.Background(), h.Conn, req, rec.on)
	if err != nil {
		t.Fatalf("run %s: %v", id, err)
	}
	h.settle(t, res)
	return res, rec
}

// settle waits, as the pool does, for the reset_done that ends an execution the
// harness ended cleanly.
func (h *localHarness) settle(t testing.TB, res *Result) {
	t.Helper()
	if !res.Reusable {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Conn.AwaitReset(ctx); err != nil {
		t.Fatalf("after execution %s: %v", res.ExecutionID, err)
	}
}

func (h *localHarness) mustPing(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Conn.Ping(ctx); err != nil {
		t.Fatalf("harness does not answer ping: %v", err)
	}
}

func (h *localHarness) mustReset(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Conn.Reset(ctx); err != nil {
		t.Fatalf("reset: %v", err)
	}
}

func interactive(r *Request) { r.Mode = ModeInteractive }

func timeout(d time.Duration) func(*Request) { return func(r *Request) { r.Timeout = d } }

func maxOutput(n int64) func(*Request) { return func(r *Request) { r.MaxOutputBytes = n } }
