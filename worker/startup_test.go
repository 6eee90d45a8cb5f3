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

	"github.com/containerd/errdefs"
	mobyclient "github.com/moby/moby/client"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// TestAWorkerServesTheSandboxesItCanAndNamesTheOthers starts `worker serve` with a
// sandbox whose base image does not exist beside one with a tool that fails to
// import: the worker serves the second (its jobs run, the tool's error aside), and
// names what is wrong where an operator and a model look: the log, /readyz and the
// catalog. Once the missing base image is there, the first sandbox is built again
// and serves, without a restart.
func TestAWorkerServesTheSandboxesItCanAndNamesTheOthers(t *testing.T) {
	testenv.SandboxImage(t)
	srv, nc := testenv.NATS(t)
	id := fmt.Sprintf("startup-%d", time.Now().UnixNano()%1_000_000)
	ghostBase := "jazzmine-no-such-base:" + id
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
    base_image: %s
    pool: {size: 1}
`, tools, broken, ghostBase)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeImages(t, ghostBase, "jazzmine-sandbox-ghost") }) // after the process's cleanup
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
		ghostBase,
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
	for _, want := range []string{"sandboxes: ", "ghost: failed (built again in ", ghostBase, "default: tool broken_tool.py failed to load: ", "nonexistent_mod"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz says %q, without %q", body, want)
		}
	}

	// Both listed, ghost past the entry that said it was building.
	catalog := catalogWhen(t, c, "the catalog to list both sandboxes, ghost failed", func(cat map[string]client.SandboxInfo) bool {
		return len(cat) == 2 && !cat["ghost"].Building
	})
	if ghost := catalog["ghost"]; !strings.Contains(ghost.Error, ghostBase) || len(ghost.Tools) != 0 {
		t.Errorf("the catalog's ghost = %+v, want its error and no tools", ghost)
	}
	if def := catalog["default"]; def.Error != "" || len(def.ToolErrors) != 1 || !strings.Contains(def.ToolErrors[0], "nonexistent_mod") {
		t.Errorf("the catalog's default = error %q, tool errors %q; want no error and the broken tool's", def.Error, def.ToolErrors)
	}

	// The base image arrives (an operator loads it): the next build of the sandbox
	// (30 s after the first failed) makes its image, and it serves.
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	docker := testenv.Docker(t)
	if _, err := docker.ImageTag(ctx, mobyclient.ImageTagOptions{Source: imagebuild.DefaultBaseImage, Target: ghostBase}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "the ghost sandbox to serve once its base image is there", func() bool {
		return strings.Contains(p.log.String(), `msg="sandbox serving" worker_id=`+id+` sandbox=ghost`)
	})
	res, err = c.Run(ctx, wire.Job{Sandbox: "ghost", Script: "emit_result(6 * 7)"})
	if err != nil || !res.Success {
		t.Fatalf("a job of the sandbox served once its base image came: %+v, %v", res, err)
	}
	catalogWhen(t, c, "the catalog's ghost entry to lose its error", func(cat map[string]client.SandboxInfo) bool {
		return cat["ghost"].Error == "" && cat["ghost"].Python != "" // put from a ready container
	})
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || strings.Contains(body, "ghost") {
		t.Errorf("/readyz = %d %q, want 503 for the broken tool only", code, body)
	}
	p.stop(t)
}

// removeImages removes, at the end of a test, the image references named (a tag,
// which leaves the image if it has others) and the images of a repository.
func removeImages(t *testing.T, tag, repository string) {
	t.Helper()
	ctx := context.Background()
	docker := testenv.Docker(t)
	if _, err := docker.ImageRemove(ctx, tag, mobyclient.ImageRemoveOptions{}); err != nil && !errdefs.IsNotFound(err) {
		t.Errorf("remove %s: %v", tag, err)
	}
	list, err := docker.ImageList(ctx, mobyclient.ImageListOptions{Filters: mobyclient.Filters{}.Add("reference", repository)})
	if err != nil {
		t.Errorf("list images of %s: %v", repository, err)
		return
	}
	for _, img := range list.Items {
		if _, err := docker.ImageRemove(ctx, img.ID, mobyclient.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil {
			t.Errorf("remove image %s of %s: %v", img.ID, repository, err)
		}
	}
}
