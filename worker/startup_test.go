package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// TestAWorkerServesTheSandboxesItCanAndNamesTheOthers starts `worker serve` with a
// sandbox whose base image does not exist beside one with a tool that fails to
// import: the worker serves the second (its jobs run, the tool's error aside), and
// names what is wrong where an operator and a model look: the log, /readyz and the
// catalog.
func TestAWorkerServesTheSandboxesItCanAndNamesTheOthers(t *testing.T) {
	testenv.SandboxImage(t)
	srv, nc := testenv.NATS(t)
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken_tool.py")
	if err := os.WriteFile(broken, []byte("import nonexistent_mod\n\ndef f():\n    return 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tools := filepath.Join(testenv.RepoRoot(), "examples", "tools", "*.py")
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`worker:
  shutdown_grace: 5s
sandboxes:
  default:
    tools: [%q, %q]
    pool: {size: 1, max_overflow: 1}
  ghost:
    base_image: jazzmine-no-such-base:bookworm
    pool: {size: 1}
`, tools, broken)), 0o644); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("startup-%d", time.Now().UnixNano()%1_000_000)
	p := startProcess(t, config, srv.ClientURL(), id)
	get := p.httpGetter(t)
	testenv.WaitFor(t, 3*time.Minute, "the default sandbox to serve", func() bool {
		return strings.Contains(p.log.String(), `msg="sandbox serving" worker_id=`+id+` sandbox=default`)
	})

	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.Run(ctx, wire.Job{Script: "emit_result(word_count('a b c'))"})
	if err != nil || !res.Success {
		t.Fatalf("a job of the sandbox that serves: %+v, %v", res, err)
	}

	testenv.WaitFor(t, time.Minute, "the worker to log that it serves some sandboxes only", func() bool {
		return strings.Contains(p.log.String(), "serving some sandboxes only")
	})
	log := p.log.String()
	for _, want := range []string{
		`level=ERROR msg="the sandbox is not served: its image could not be built" worker_id=` + id + ` sandbox=ghost`,
		`jazzmine-no-such-base:bookworm`,
		`level=ERROR msg="a tool failed to load: scripts of the sandbox do not have what it defines" worker_id=` + id + ` sandbox=default file=broken_tool.py`,
		`nonexistent_mod`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the worker's log lacks %q", want)
		}
	}

	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d %q, want 503", code, body)
	}
	for _, want := range []string{"sandboxes: ", "ghost: failed: ", "jazzmine-no-such-base:bookworm", "default: tool broken_tool.py failed to load: ", "nonexistent_mod"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz says %q, without %q", body, want)
		}
	}

	var catalog map[string]client.SandboxInfo
	testenv.WaitFor(t, time.Minute, "the catalog to list both sandboxes", func() bool {
		list, err := c.Sandboxes(ctx)
		if err != nil {
			return false
		}
		catalog = map[string]client.SandboxInfo{}
		for _, sb := range list {
			catalog[sb.Sandbox] = sb
		}
		return len(catalog) == 2
	})
	if ghost := catalog["ghost"]; !strings.Contains(ghost.Error, "jazzmine-no-such-base:bookworm") || len(ghost.Tools) != 0 {
		t.Errorf("the catalog's ghost = %+v, want its error and no tools", ghost)
	}
	if def := catalog["default"]; def.Error != "" || len(def.ToolErrors) != 1 || !strings.Contains(def.ToolErrors[0], "nonexistent_mod") {
		t.Errorf("the catalog's default = error %q, tool errors %q; want no error and the broken tool's", def.Error, def.ToolErrors)
	}
	p.stop(t)
}
