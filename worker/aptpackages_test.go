package worker_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/wire"
)

// TestADebianPackageOfTheConfigIsImportedByAJobAndListedInTheCatalog: a sandbox
// whose config lists apt_packages: [python3-yaml] gets an image built from the base
// image where a job through the worker imports yaml, where apt and dpkg are gone
// again, and whose catalog entry tells agents it has python3-yaml.
func TestADebianPackageOfTheConfigIsImportedByAJobAndListedInTheCatalog(t *testing.T) {
	cfg, err := imagebuild.ParseConfig([]byte(`
sandboxes:
  debian-packages:
    description: "YAML from Debian's python3-yaml"
    apt_packages: [python3-yaml]
    pool: {size: 1, max_overflow: 0}
`), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Build: cfg.Sandboxes["debian-packages"]})
	a := newFilesAgent(t, nc)

	res := a.run(wire.Job{Sandbox: "debian-packages", Script: `import shutil, yaml
emit_result({"doc": yaml.safe_load("a: [1, 2]"), "tools": [n for n in ("apt", "apt-get", "dpkg") if shutil.which(n)]})`})
	if !res.Success {
		t.Fatalf("failed: %s %s\n%s\n%s", res.ErrorKind, res.Error, res.Traceback, res.Stderr)
	}
	const want = `{"doc":{"a":[1,2]},"tools":[]}`
	if got, err := json.Marshal(res.FinalData); err != nil || string(got) != want {
		t.Errorf("the job's result %s (%v), want %s: yaml importable, and no package manager left", got, err, want)
	}

	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	cat := catalogWhen(t, c, "the sandbox in the catalog", func(cat map[string]client.SandboxInfo) bool { return len(cat) == 1 })
	if sb := cat["debian-packages"]; sb.Sandbox != "debian-packages" || !slices.Equal(sb.AptPackages, []string{"python3-yaml"}) || len(sb.Packages) != 0 {
		t.Errorf("catalog entry %s: apt_packages %q, packages %q; want [python3-yaml] and none", sb.Sandbox, sb.AptPackages, sb.Packages)
	}
}
