package imagebuild

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/harness"
)

// buildForTest builds spec on the real engine and removes the image when the
// test ends. The build's progress goes to the test log.
func buildForTest(t *testing.T, cli *client.Client, spec *Spec) (*Builder, Image) {
	t.Helper()
	b, err := NewBuilder(BuilderConfig{Docker: cli, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	img, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	removeImageAtCleanup(t, cli, img.ID)
	t.Logf("built %s (%s) in %s", img.Tag, img.ID, time.Since(start).Round(time.Millisecond))
	if !img.Built {
		t.Fatalf("image %s of a new sandbox name was not built", img.Tag)
	}
	return b, img
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// readyEvent runs the image's entrypoint (the harness) with stdin, and returns
// its ready event and the events after it.
func runHarness(t *testing.T, tag, stdin string) (ready map[string]any, events []map[string]any) {
	t.Helper()
	out := dockerRun(t, stdin, "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--tmpfs", "/tmp:uid=10001,gid=10001,mode=0700", "--tmpfs", "/workspace:uid=10001,gid=10001,mode=0700", tag)
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("harness wrote a line that is not JSON: %q", sc.Text())
		}
		if ev["type"] == "ready" && ready == nil {
			ready = ev
			continue
		}
		events = append(events, ev)
	}
	if ready == nil {
		t.Fatalf("no ready line from the harness; stdout:\n%s", out)
	}
	return ready, events
}

// inImage runs a Python program in the image (not the harness) and decodes the
// JSON it prints.
func inImage(t *testing.T, tag, program string, out any) {
	t.Helper()
	stdout := dockerRun(t, "", "--entrypoint", "python3", tag, "-c", program)
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("decode %q: %v", stdout, err)
	}
}

const inspectProgram = `
import grp, importlib.util, json, os, pwd, shutil, stat
def mode(p): return oct(stat.S_IMODE(os.stat(p).st_mode))
def harness(): return sorted(os.path.relpath(os.path.join(r, n), "/opt/jazzmine") for r, _, ns in os.walk("/opt/jazzmine") for n in ns if n.endswith(".py"))
def fresh(src, pyc):  # what Python checks before it uses a .pyc: the source's mtime and size
    h, st = open(pyc, "rb").read(16), os.stat(src)
    return int.from_bytes(h[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF and int.from_bytes(h[12:16], "little") == st.st_size & 0xFFFFFFFF
print(json.dumps({
    "which": {n: shutil.which(n) for n in ["curl", "wget", "nc", "netcat", "ncat", "socat", "gcc", "cc", "g++", "make", "pip", "pip3", "apt", "apt-get", "dpkg"]},
    "pip_module": importlib.util.find_spec("pip") is not None,
    "uid": os.getuid(), "gid": os.getgid(), "user": pwd.getpwuid(os.getuid()).pw_name,
    "group": grp.getgrgid(os.getgid()).gr_name, "shell": pwd.getpwuid(os.getuid()).pw_shell,
    "cwd": os.getcwd(),
    "tools": sorted(n for n in os.listdir("/tools") if n != "__pycache__"),
    "tools_mode": mode("/tools"), "tool_modes": sorted({mode("/tools/" + n) for n in os.listdir("/tools") if n != "__pycache__"}),
    "bytecode": {p: [os.stat(c).st_uid, mode(c), fresh(p, c)] if os.path.exists(c) else None
                 for p in ["/opt/jazzmine/" + n for n in harness()] + ["/tools/" + n for n in os.listdir("/tools") if n.endswith(".py")]
                 for c in [importlib.util.cache_from_source(p)]},
    "tools_owner": os.stat("/tools").st_uid,
    "root_mode": mode("/"), "opt_mode": mode("/opt"),
    "harness_dir_modes": sorted({mode("/opt/jazzmine"), mode("/opt/jazzmine/jazzmine_harness")}),
    "harness": harness(), "harness_modes": sorted({mode("/opt/jazzmine/" + n) for n in harness()}),
    "workspace_owner": os.stat("/workspace").st_uid,
    "tools_writable": os.access("/tools", os.W_OK),
    "env": {k: v for k, v in os.environ.items() if k.startswith("JAZZMINE_")},
}))
`

// harnessSource returns the paths of the harness's files (harness.Source), sorted.
func harnessSource(t *testing.T) []string {
	t.Helper()
	names, err := fs.Glob(harness.Source(), harness.Package+"/*")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	return names
}

func TestBuildTheExampleSandbox(t *testing.T) {
	cli := requireDocker(t)
	cfg, err := LoadConfig(filepath.Join("..", "examples", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	spec := *cfg.Sandboxes["default"]
	spec.Name = uniqueName(t) // a tag of its own: jazzmine-sandbox-test<random>
	b, img := buildForTest(t, cli, &spec)

	start := time.Now()
	again, err := b.Ensure(context.Background(), &spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second Ensure took %s", time.Since(start).Round(time.Millisecond))
	if again.Built || again.ID != img.ID {
		t.Errorf("second Ensure: %+v; want the first image, not rebuilt", again)
	}

	inspect, err := cli.ImageInspect(context.Background(), img.Tag)
	if err != nil {
		t.Fatal(err)
	}
	c := inspect.Config
	wantLabels := map[string]string{LabelManaged: "true", LabelSandbox: spec.Name, LabelChecksum: img.Checksum}
	for k, v := range wantLabels {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
	if c.User != SandboxUser || c.WorkingDir != WorkspaceDir || !reflect.DeepEqual(c.Entrypoint, Entrypoint) || len(c.Cmd) != 0 {
		t.Errorf("config: user %q, workdir %q, entrypoint %q, cmd %q", c.User, c.WorkingDir, c.Entrypoint, c.Cmd)
	}

	checkTheImagesFiles(t, img.Tag)

	// The harness starts as the entrypoint, lists the tools, and runs a script
	// that calls a sync and an async tool.
	script := `emit_result({"words": word_count("one two three"), "profile": fetch_profile(1), "mean": summarize([1, 2, 3])["mean"]})`
	req, _ := json.Marshal(map[string]any{"type": "execute", "execution_id": "it1", "script": script, "timeout": 20, "mode": "plan"})
	ready, events := runHarness(t, img.Tag, string(req)+"\n")
	if tools := fmt.Sprint(ready["tools"]); tools != "[fetch_profile summarize top_words word_count]" {
		t.Errorf("ready lists tools %s", tools)
	}
	if errs, _ := ready["tool_errors"].([]any); len(errs) != 0 {
		t.Errorf("tool errors: %v", errs)
	}
	var result any
	for _, ev := range events {
		if ev["type"] == "final_result" {
			result = ev["data"]
		}
	}
	want := map[string]any{"words": 3.0, "profile": map[string]any{"user_id": 1.0, "name": "Ada", "plan": "pro"}, "mean": 2.0}
	if !reflect.DeepEqual(result, want) {
		t.Errorf("final result %v, want %v; events: %v", result, want, events)
	}
}

// checkTheImagesFiles checks, from inside the image tag, who the scripts run as, what
// was removed, and the owners, modes and bytecode of the harness and the tools.
func checkTheImagesFiles(t *testing.T, tag string) {
	t.Helper()
	var got struct {
		Which           map[string]*string `json:"which"`
		PipModule       bool               `json:"pip_module"`
		UID, GID        int
		User, Group     string
		Shell, Cwd      string
		Tools           []string
		ToolsMode       string            `json:"tools_mode"`
		ToolModes       []string          `json:"tool_modes"`
		ToolsOwner      int               `json:"tools_owner"`
		RootMode        string            `json:"root_mode"`
		OptMode         string            `json:"opt_mode"`
		HarnessDirModes []string          `json:"harness_dir_modes"`
		Harness         []string          `json:"harness"`
		HarnessModes    []string          `json:"harness_modes"`
		WorkspaceOwner  int               `json:"workspace_owner"`
		ToolsWritable   bool              `json:"tools_writable"`
		Env             map[string]string `json:"env"`
		Bytecode        map[string][]any  `json:"bytecode"`
	}
	inImage(t, tag, inspectProgram, &got)
	for name, path := range got.Which {
		if path != nil {
			t.Errorf("%s is still in the image at %s", name, *path)
		}
	}
	if got.PipModule {
		t.Error("python3 -m pip still works: the pip module is importable")
	}
	if got.UID != SandboxUID || got.GID != SandboxUID || got.User != "sandbox" || got.Group != "sandbox" || got.Shell != "/usr/sbin/nologin" || got.Cwd != "/workspace" {
		t.Errorf("runs as %d:%d (%s:%s), shell %s, in %s; want 10001:10001 sandbox:sandbox, nologin, /workspace",
			got.UID, got.GID, got.User, got.Group, got.Shell, got.Cwd)
	}
	if want := []string{"profiles.py", "stats.py", "text.py"}; !reflect.DeepEqual(got.Tools, want) {
		t.Errorf("/tools holds %v, want %v", got.Tools, want)
	}
	if got.ToolsMode != "0o555" || !reflect.DeepEqual(got.ToolModes, []string{"0o444"}) || got.ToolsOwner != 0 ||
		!reflect.DeepEqual(got.HarnessModes, []string{"0o444"}) || got.ToolsWritable || got.WorkspaceOwner != SandboxUID {
		t.Errorf("modes: /tools %s (owner %d, writable %v), tools %v, harness %v, /workspace owner %d",
			got.ToolsMode, got.ToolsOwner, got.ToolsWritable, got.ToolModes, got.HarnessModes, got.WorkspaceOwner)
	}
	if got.RootMode != "0o755" || got.OptMode != "0o755" || !reflect.DeepEqual(got.HarnessDirModes, []string{"0o555"}) {
		t.Errorf("modes: / %s, /opt %s, /opt/jazzmine and its package %v; want 0755, 0755, 0555", got.RootMode, got.OptMode, got.HarnessDirModes)
	}
	if want := harnessSource(t); !reflect.DeepEqual(got.Harness, want) {
		t.Errorf("/opt/jazzmine holds %v, want the harness's source %v", got.Harness, want)
	}
	if got.Env["JAZZMINE_CONTAINER"] != "1" || got.Env["JAZZMINE_TOOLS_DIR"] != "/tools" {
		t.Errorf("environment: %v", got.Env)
	}
	// The harness and every tool are compiled at build (root's, read-only), not at
	// every container start.
	if len(got.Bytecode) != len(got.Harness)+3 || len(got.Harness) == 0 {
		t.Errorf("bytecode of %d files, want the harness's %d and 3 tools': %v", len(got.Bytecode), len(got.Harness), got.Bytecode)
	}
	for src, pyc := range got.Bytecode {
		if fmt.Sprint(pyc) != "[0 0o644 true]" {
			t.Errorf("bytecode of %s: %v, want [owner 0, mode 0o644, up to date]", src, pyc)
		}
	}
}

// writeWheel writes a pure-Python wheel of package name at version into dir, by
// hand: the package, METADATA, WHEEL and RECORD.
func writeWheel(t *testing.T, dir, name, version, source string) string {
	t.Helper()
	distInfo := fmt.Sprintf("%s-%s.dist-info", name, version)
	files := []struct{ name, content string }{
		{name + "/__init__.py", source},
		{distInfo + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: a test package\n", name, version)},
		{distInfo + "/WHEEL", "Wheel-Version: 1.0\nGenerator: jazzmine-imagebuild-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	add := func(name, content string) {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate, Modified: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		add(f.name, f.content)
		sum := sha256.Sum256([]byte(f.content))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.content))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", distInfo)
	add(distInfo+"/RECORD", record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-py3-none-any.whl", name, version))
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestBuildWithRequirementsFromAWheelhouse(t *testing.T) {
	cli := requireDocker(t)
	dir := writeTree(t, map[string]string{
		"tools/uses_mypkg.py": "import mypkg\n\n\ndef mypkg_hello():\n    return mypkg.hello()\n",
	})
	if err := os.Mkdir(filepath.Join(dir, "wheels"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeWheel(t, filepath.Join(dir, "wheels"), "mypkg", "0.1", "def hello():\n    return 'hello from mypkg'\n")
	name := uniqueName(t)
	config := fmt.Sprintf("sandboxes:\n  %s: {tools: [tools/*.py], requirements: [mypkg==0.1], wheelhouse: wheels}\n", name)
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(filepath.Join(dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, img := buildForTest(t, cli, cfg.Sandboxes[name])

	var got struct {
		Hello, File string
		Pip         bool
		Wheelhouse  bool
	}
	inImage(t, img.Tag, `
import importlib.util, json, os, sys
sys.path.insert(0, "/tools")
import uses_mypkg, mypkg
print(json.dumps({"hello": uses_mypkg.mypkg_hello(), "file": mypkg.__file__,
    "pip": importlib.util.find_spec("pip") is not None, "wheelhouse": os.path.exists("/wheelhouse")}))
`, &got)
	if got.Hello != "hello from mypkg" || !strings.HasPrefix(got.File, "/usr/local/lib/python3") {
		t.Errorf("mypkg: %q from %s", got.Hello, got.File)
	}
	if got.Pip || got.Wheelhouse {
		t.Errorf("after the install: pip importable %v, /wheelhouse left %v", got.Pip, got.Wheelhouse)
	}
	ready, _ := runHarness(t, img.Tag, "")
	if fmt.Sprint(ready["tools"]) != "[mypkg_hello]" || fmt.Sprint(ready["tool_errors"]) != "[]" {
		t.Errorf("ready: tools %v, errors %v", ready["tools"], ready["tool_errors"])
	}
}

func TestARequirementMissingFromTheWheelhouseFailsWithTheBuildLog(t *testing.T) {
	cli := requireDocker(t)
	dir := writeTree(t, nil)
	if err := os.Mkdir(filepath.Join(dir, "wheels"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeWheel(t, filepath.Join(dir, "wheels"), "mypkg", "0.1", "")
	name := uniqueName(t)
	cfg, err := ParseConfig([]byte(fmt.Sprintf("sandboxes:\n  %s: {requirements: [nosuchpkg==1.0], wheelhouse: wheels}\n", name)), dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBuilder(BuilderConfig{Docker: cli})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Ensure(context.Background(), cfg.Sandboxes[name])
	var be *BuildError
	if !errors.As(err, &be) {
		t.Fatalf("Ensure: %v, want a *BuildError", err)
	}
	// The steps before the failure left intermediate images; remove those that
	// nothing else uses (shared cache layers have children and stay). An image with
	// a tag is not one: the log's first " ---> id" is the base image's, which
	// removing by id would untag and delete.
	t.Cleanup(func() {
		ids := regexp.MustCompile(`^ ---> ([0-9a-f]{12})$`)
		for i := len(be.LogTail) - 1; i >= 0; i-- {
			m := ids.FindStringSubmatch(be.LogTail[i])
			if m == nil {
				continue
			}
			if img, err := cli.ImageInspect(context.Background(), m[1]); err != nil || len(img.RepoTags) > 0 {
				continue
			}
			_, _ = cli.ImageRemove(context.Background(), m[1], client.ImageRemoveOptions{})
		}
	})
	msg := err.Error()
	for _, want := range []string{"No matching distribution found for nosuchpkg==1.0", "returned a non-zero code", be.Tag} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q:\n%s", want, msg)
		}
	}
	if _, err := cli.ImageInspect(context.Background(), be.Tag); err == nil {
		t.Errorf("the failed build left an image tagged %s", be.Tag)
	}
}

// TestDebianPackagesAreInstalledAndTheirCompilersBurnt plays an operator who lists a
// compiler among a sandbox's apt_packages (or a package that depends on one): the
// image has what the packages install (gcc's libraries), but no compiler, assembler,
// linker, apt, dpkg or setuid program on the PATH, under any of the names Debian
// gives them, and no apt lists.
func TestDebianPackagesAreInstalledAndTheirCompilersBurnt(t *testing.T) {
	cli := requireDocker(t)
	name := uniqueName(t)
	cfg := mustParse(t, map[string]string{"config.yaml": fmt.Sprintf("sandboxes:\n  %s: {apt_packages: [gcc, python3-yaml]}\n", name)})
	_, img := buildForTest(t, cli, cfg.Sandboxes[name])

	var got struct {
		YAML       string
		Installed  bool
		OnPath     []string
		SetID      []string
		AptListsIn []string
	}
	inImage(t, img.Tag, `
import json, os, re, stat, yaml
path = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
build = re.compile(r"(^|-)(gcc|g\+\+|cc|c\+\+|cpp|as|ld|ld\.bfd|ld\.gold)(-[0-9.]+)?$|^c[89]9|^(apt|apt-get|dpkg|make|pip3?)$")
on_path = sorted({n for d in path if os.path.isdir(d) for n in os.listdir(d) if build.search(n)})
setid = [os.path.join(r, n) for r, _, ns in os.walk("/usr") for n in ns
         if os.path.isfile(os.path.join(r, n)) and not os.path.islink(os.path.join(r, n))
         and os.stat(os.path.join(r, n)).st_mode & (stat.S_ISUID | stat.S_ISGID)]
print(json.dumps({"yaml": yaml.safe_dump({"a": 1}).strip(), "installed": os.path.isdir("/usr/lib/gcc"),
    "onpath": on_path, "setid": setid, "aptlistsin": [n for n in os.listdir("/var/lib/apt/lists") if n != "partial"]}))
`, &got)
	if got.YAML != "a: 1" || !got.Installed {
		t.Errorf("yaml.safe_dump gives %q, /usr/lib/gcc there: %v; want both packages installed", got.YAML, got.Installed)
	}
	if len(got.OnPath) != 0 || len(got.SetID) != 0 {
		t.Errorf("left on the PATH: %q; setuid or setgid: %q; want neither", got.OnPath, got.SetID)
	}
	if len(got.AptListsIn) != 0 {
		t.Errorf("apt's lists left in the image: %q", got.AptListsIn)
	}
}
