package imagebuild

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/<name>.golden, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file %s (go test -update rewrites it):\n--- got ---\n%s", name, path, got)
	}
}

func TestDockerfileWithoutRequirements(t *testing.T) {
	cfg := mustParse(t, map[string]string{
		"config.yaml":  "sandboxes:\n  default: {tools: [tools/*.py], wheelhouse: wheels}\n",
		"tools/a.py":   "def a(): pass\n",
		"wheels/x.whl": "unused without requirements",
	})
	got := Dockerfile(cfg.Sandboxes["default"])
	golden(t, "no-requirements", got)
	for _, absent := range []string{"pip install", "COPY install/", "jazzmine-install/wheelhouse"} {
		if strings.Contains(got, absent) {
			t.Errorf("a sandbox without requirements has %q in its Dockerfile", absent)
		}
	}
}

func TestDockerfileWithRequirementsFromAWheelhouse(t *testing.T) {
	cfg := mustParse(t, map[string]string{
		"config.yaml":  "sandboxes:\n  data: {base_image: example/base:1, tools: [tools/*.py], requirements: [mypkg==0.1], wheelhouse: wheels}\n",
		"tools/a.py":   "def a(): pass\n",
		"wheels/x.whl": "wheel",
	})
	got := Dockerfile(cfg.Sandboxes["data"])
	golden(t, "wheelhouse", got)
	if !strings.Contains(got, "--no-index --find-links /tmp/jazzmine-install/wheelhouse -r /tmp/jazzmine-install/requirements.txt") {
		t.Error("pip does not install from the wheelhouse only")
	}
}

func TestDockerfileWithRequirementsFromAnIndex(t *testing.T) {
	cfg := mustParse(t, map[string]string{"config.yaml": "sandboxes:\n  default: {requirements: [requests]}\n"})
	got := Dockerfile(cfg.Sandboxes["default"])
	golden(t, "requirements", got)
	if strings.Contains(got, "--no-index") || !strings.Contains(got, "COPY install/") {
		t.Error("requirements without a wheelhouse: want pip from an index")
	}
}

func TestDockerfileIsDeterministic(t *testing.T) {
	files := map[string]string{
		"config.yaml": "sandboxes:\n  default: {tools: [tools/*.py], requirements: [a, b], env: {A: '1', B: '2', C: '3'}}\n",
		"tools/a.py":  "def a(): pass\n", "tools/b.py": "def b(): pass\n",
	}
	first := Dockerfile(mustParse(t, files).Sandboxes["default"])
	for range 20 {
		if got := Dockerfile(mustParse(t, files).Sandboxes["default"]); got != first {
			t.Fatalf("two Dockerfiles of one spec differ:\n%s\n---\n%s", first, got)
		}
	}
}

func TestDockerfileInstallsDebianPackagesBeforeRequirementsAndTheBurn(t *testing.T) {
	cfg := mustParse(t, map[string]string{"config.yaml": "sandboxes:\n  default: {apt_packages: [python3-yaml, libopenblas0-serial=0.3.21+ds-4], requirements: [requests]}\n"})
	got := Dockerfile(cfg.Sandboxes["default"])
	golden(t, "apt-packages", got)
	install := strings.Index(got, "apt-get install -y --no-install-recommends -o APT::Cmd::Pattern-Only=true libopenblas0-serial=0.3.21+ds-4 python3-yaml &&")
	pip := strings.Index(got, "pip install")
	burn := strings.Index(got, "rm -f curl")
	if install < 0 || !strings.Contains(got, "RUN apt-get update &&") || !strings.Contains(got, "rm -rf /var/lib/apt/lists/*") {
		t.Fatalf("the Dockerfile does not update, install the sorted packages and remove the lists:\n%s", got)
	}
	if pip < install || burn < pip {
		t.Errorf("want apt-get install, then pip, then the burn step; at %d, %d, %d", install, pip, burn)
	}
}
