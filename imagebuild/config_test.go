package imagebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// writeTree writes files (slash-separated relative paths) under a new temporary
// directory and returns it.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// parse writes files and parses config.yaml among them.
func parse(t *testing.T, files map[string]string) (*Config, error) {
	t.Helper()
	dir := writeTree(t, files)
	return LoadConfig(filepath.Join(dir, "config.yaml"))
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func mustParse(t *testing.T, files map[string]string) *Config {
	t.Helper()
	cfg, err := parse(t, files)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	return cfg
}

func TestAMinimalSandboxTakesEveryDefault(t *testing.T) {
	cfg := mustParse(t, map[string]string{"config.yaml": "sandboxes:\n  default: {}\n"})
	spec := cfg.Sandboxes["default"]
	if spec == nil {
		t.Fatal("sandbox default missing")
	}
	want := &Spec{
		Name:      "default",
		BaseImage: DefaultBaseImage,
		Env:       map[string]string{},
		// Resources and recycling left out stay zero: the pool's defaults apply
		// (sandboxpool.Default*, their one definition).
		Resources: Resources{},
		Pool:      PoolSettings{Size: DefaultPoolSize, MaxOverflow: DefaultMaxOverflow},
	}
	if !reflect.DeepEqual(spec, want) {
		t.Errorf("spec =\n%+v\nwant\n%+v", spec, want)
	}
	if got := cfg.Names(); !reflect.DeepEqual(got, []string{"default"}) {
		t.Errorf("Names() = %v", got)
	}
}

func TestAFullSandboxIsResolved(t *testing.T) {
	cfg := mustParse(t, map[string]string{
		"config.yaml": `
secrets: {STRIPE_KEY: sk_test}
host_path_map: {/app/data: /srv/host/data}
sandboxes:
  zeta: {}
  alpha:
    description: "Stripe lookups"
    base_image: example/base:1
    tools: [tools/*.py, extra/b.py]
    apt_packages: [python3-yaml, libopenblas0-serial=0.3.21+ds-4, g++]
    requirements: ["mypkg==0.1"]
    wheelhouse: wheels
    secrets: [STRIPE_KEY]
    env: {MODE: fast, LEVEL: 3, JAZZMINE_PRELOAD: "json,csv"}
    runtime: runsc
    resources: {memory_mb: 256, cpus: 0.5, pids: 64, workspace_mb: 32, tmp_mb: 16}
    network: {allowed_hosts: ["api.stripe.com:443", "10.0.0.1:8080", "[::1]:80", "*.example.com:443"], private_ranges: [10.20.0.0/16, "fd12:3456::/48"]}
    mounts: [{source: /data, target: /data}, {source: /out, target: /out, read_only: false}]
    pool: {size: 0, max_overflow: 0, max_uses: 1, max_age: 2h, idle_timeout: 90s, ready_timeout: 1m}
`,
		"tools/a.py":              "def a(): return 1\n",
		"extra/b.py":              "def b(): return 2\n",
		"wheels/mypkg-0.1.whl":    "wheel",
		"wheels/.hidden":          "ignored",
		"wheels/sub/ignored.whl":  "ignored",
		"tools/not-a-tool.txt.py": "x = 1\n",
	})
	if got := cfg.Names(); !reflect.DeepEqual(got, []string{"alpha", "zeta"}) {
		t.Errorf("Names() = %v, want sorted [alpha zeta]", got)
	}
	s := cfg.Sandboxes["alpha"]
	var names []string
	for _, tool := range s.Tools {
		names = append(names, tool.Name)
		if !filepath.IsAbs(tool.Path) || len(tool.Content) == 0 {
			t.Errorf("tool %s: path %q, %d bytes", tool.Name, tool.Path, len(tool.Content))
		}
	}
	if !reflect.DeepEqual(names, []string{"a.py", "b.py", "not-a-tool.txt.py"}) {
		t.Errorf("tools = %v", names)
	}
	if s.Wheelhouse != filepath.Join(cfg.Dir, "wheels") || len(s.Wheels) != 1 || s.Wheels[0].Name != "mypkg-0.1.whl" ||
		s.Wheels[0].SHA256 != sha256Hex("wheel") || s.Wheels[0].Size != 5 {
		t.Errorf("wheelhouse %q, wheels %+v", s.Wheelhouse, s.Wheels)
	}
	if want := []string{"g++", "libopenblas0-serial=0.3.21+ds-4", "python3-yaml"}; !reflect.DeepEqual(s.AptPackages, want) {
		t.Errorf("apt packages %q, want them sorted: %q", s.AptPackages, want)
	}
	if s.Description != "Stripe lookups" {
		t.Errorf("description %q", s.Description)
	}
	if s.Env["LEVEL"] != "3" || s.Env["JAZZMINE_PRELOAD"] != "json,csv" || s.Runtime != "runsc" || s.BaseImage != "example/base:1" {
		t.Errorf("env %v, runtime %q, base %q", s.Env, s.Runtime, s.BaseImage)
	}
	if want := (Resources{MemoryMB: 256, CPUs: 0.5, PIDs: 64, WorkspaceMB: 32, TmpMB: 16}); s.Resources != want {
		t.Errorf("resources = %+v", s.Resources)
	}
	if want := (PoolSettings{Size: 0, MaxOverflow: 0, MaxUses: 1, MaxAge: 2 * time.Hour, IdleTimeout: 90 * time.Second, ReadyTimeout: time.Minute}); s.Pool != want {
		t.Errorf("pool = %+v", s.Pool)
	}
	if want := []Mount{{"/data", "/data", true}, {"/out", "/out", false}}; !reflect.DeepEqual(s.Mounts, want) {
		t.Errorf("mounts = %+v (read_only defaults to true)", s.Mounts)
	}
	if want := (Network{AllowedHosts: []string{"api.stripe.com:443", "10.0.0.1:8080", "[::1]:80", "*.example.com:443"},
		PrivateRanges: []string{"10.20.0.0/16", "fd12:3456::/48"}}); !reflect.DeepEqual(s.Network, want) {
		t.Errorf("network = %+v", s.Network)
	}
	if z := cfg.Sandboxes["zeta"].Network; z.AllowedHosts != nil || z.PrivateRanges != nil {
		t.Errorf("a sandbox without a network section: %+v, want none", z)
	}
	if cfg.Secrets["STRIPE_KEY"] != "sk_test" || cfg.HostPathMap["/app/data"] != "/srv/host/data" {
		t.Errorf("secrets %v, host_path_map %v", cfg.Secrets, cfg.HostPathMap)
	}
}

func TestTheExampleConfigLoads(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "examples", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	spec := cfg.Sandboxes["default"]
	if spec == nil || len(spec.Tools) < 3 {
		t.Fatalf("the example's default sandbox has no tools: %+v", spec)
	}
	var async bool
	for _, tool := range spec.Tools {
		async = async || strings.Contains(string(tool.Content), "async def ")
	}
	if !async {
		t.Error("the example has no async tool")
	}
}

func TestInvalidConfigs(t *testing.T) {
	tools := map[string]string{"tools/a.py": "def a(): pass\n", "other/a.py": "def a2(): pass\n", "tools/README": "x"}
	tests := []struct {
		name   string
		config string
		want   []string // every one must be in the error
	}{
		{"an empty file is an error", "", []string{"empty"}},
		{"a config without sandboxes is an error", "secrets: {}\n", []string{"sandboxes: none defined"}},
		{"an unknown top-level field names the field and its line", "sandboxes: {default: {}}\nsandbox: {}\n", []string{"line 2", `unknown field "sandbox" in the top level`}},
		{"an unknown sandbox field names the field and its line", "sandboxes:\n  default:\n    tool: [x]\n", []string{"line 3", `unknown field "tool" in a sandbox`}},
		{"an unknown pool field names the field and its line", "sandboxes:\n  default:\n    pool:\n      sizee: 3\n", []string{"line 4", `unknown field "sizee" in pool`}},
		{"a sandbox name with a dot is refused", "sandboxes: {a.b: {}}\n", []string{`sandbox "a.b"`, "name must match"}},
		{"a sandbox name longer than 64 is refused", "sandboxes: {" + strings.Repeat("x", 65) + ": {}}\n", []string{"name must match"}},
		{"a description over 1024 bytes is an error", "sandboxes: {default: {description: " + strings.Repeat("d", 1025) + "}}\n", []string{"description: 1025 bytes, at most 1024"}},
		{"a tool glob that matches nothing is an error", "sandboxes: {default: {tools: [nope/*.py]}}\n", []string{`sandbox "default"`, `tools: "nope/*.py" matches no file`}},
		{"a missing tool file is an error", "sandboxes: {default: {tools: [tools/b.py]}}\n", []string{`"tools/b.py" matches no file`}},
		{"a tool directory is an error", "sandboxes: {default: {tools: [tools]}}\n", []string{"is a directory"}},
		{"a tool that is not a Python file is an error", "sandboxes: {default: {tools: [tools/*]}}\n", []string{"README: a tool file must be a Python file"}},
		{"two tools with the same file name are an error", "sandboxes: {default: {tools: [tools/a.py, other/a.py]}}\n", []string{"two tools are named a.py"}},
		{"a missing wheelhouse is an error", "sandboxes: {default: {wheelhouse: wheels}}\n", []string{"wheelhouse:", "no such file"}},
		{"a requirement with a newline is an error", "sandboxes: {default: {requirements: [\"a\\n--index-url x\"]}}\n", []string{"requirements[0]"}},
		{"a Debian package name ending in - (apt's remove) is refused", "sandboxes: {default: {apt_packages: [python3-]}}\n", []string{`sandbox "default": apt_packages[0]: "python3-" ends in "-", which apt-get reads as "remove"`}},
		{"an upper-case Debian package name names the sandbox and the entry", "sandboxes: {default: {apt_packages: [python3-numpy, Python3-Yaml]}}\n", []string{`sandbox "default": apt_packages[1]: "Python3-Yaml" is not a Debian package name`}},
		{"a one-letter Debian package name is an error", "sandboxes: {default: {apt_packages: [x]}}\n", []string{`apt_packages[0]: "x" is not a Debian package name`}},
		{"a Debian package name with a space is an error", "sandboxes: {default: {apt_packages: [\"python3-yaml curl\"]}}\n", []string{`"python3-yaml curl" is not a Debian package name`}},
		{"an apt option is not a Debian package", "sandboxes: {default: {apt_packages: [--allow-unauthenticated]}}\n", []string{`"--allow-unauthenticated" is not a Debian package name`}},
		{"a shell word is not a Debian package", "sandboxes: {default: {apt_packages: [\"a;rm\"]}}\n", []string{`"a;rm" is not a Debian package name`}},
		{"an empty Debian package is an error", "sandboxes: {default: {apt_packages: [\"\"]}}\n", []string{`apt_packages[0]: "" is not a Debian package name`}},
		{"a Debian version that does not start with a digit is an error", "sandboxes: {default: {apt_packages: [python3-yaml=latest]}}\n", []string{`apt_packages[0]: "python3-yaml=latest": "latest" is not a Debian version`}},
		{"an empty Debian version is an error", "sandboxes: {default: {apt_packages: [python3-yaml=]}}\n", []string{`"" is not a Debian version`}},
		{"a Debian package listed twice is an error", "sandboxes: {default: {apt_packages: [python3-yaml, python3-yaml=6.0-3]}}\n", []string{`apt_packages[1]: "python3-yaml" is listed twice`}},
		{"a secret name with a dash is an error", "sandboxes: {default: {secrets: [API-KEY]}}\n", []string{`secrets: "API-KEY" is not an environment variable name`}},
		{"a top-level secret name with a space is an error", "secrets: {\"A B\": x}\nsandboxes: {default: {}}\n", []string{`secrets: "A B"`}},
		{"an env name starting with a digit is an error", "sandboxes: {default: {env: {1X: y}}}\n", []string{`env: "1X"`}},
		{"a JAZZMINE_ variable is reserved", "sandboxes: {default: {env: {JAZZMINE_TOOLS_DIR: /x}}}\n", []string{"reserved"}},
		{"a JAZZMINE_ variable other than a harness setting is reserved in any case", "sandboxes: {default: {env: {jazzmine_preload: x}}}\n", []string{"reserved"}},
		{"a harness setting is not a secret's name", "sandboxes: {default: {secrets: [JAZZMINE_PRELOAD]}}\n", []string{`secrets: "JAZZMINE_PRELOAD" is reserved`}},
		{"an env name that is also a secret is an error", "sandboxes: {default: {secrets: [K], env: {K: v}}}\n", []string{`"K" is also a secret`}},
		{"an allowed host without a port is an error", "sandboxes: {default: {network: {allowed_hosts: [api.example.com]}}}\n", []string{"network.allowed_hosts", "must be host:port"}},
		{"an allowed host with port 0 is an error", "sandboxes: {default: {network: {allowed_hosts: [\"a.com:0\"]}}}\n", []string{"port must be a number from 1 to 65535"}},
		{"an allowed host with port 70000 is an error", "sandboxes: {default: {network: {allowed_hosts: [\"a.com:70000\"]}}}\n", []string{"port must be"}},
		{"an allowed host with a bad name is an error", "sandboxes: {default: {network: {allowed_hosts: [\"a_b!:443\"]}}}\n", []string{"neither a host name nor an IP"}},
		{"zero memory is an error", "sandboxes: {default: {resources: {memory_mb: 0}}}\n", []string{"resources.memory_mb: must be positive, got 0"}},
		{"negative CPUs are an error", "sandboxes: {default: {resources: {cpus: -1}}}\n", []string{"resources.cpus: must be positive"}},
		{"zero PIDs are an error", "sandboxes: {default: {resources: {pids: 0}}}\n", []string{"resources.pids"}},
		{"a negative pool size is an error", "sandboxes: {default: {pool: {size: -1}}}\n", []string{"pool.size: must be at least 0"}},
		{"a negative overflow is an error", "sandboxes: {default: {pool: {max_overflow: -1}}}\n", []string{"pool.max_overflow"}},
		{"zero max uses is an error", "sandboxes: {default: {pool: {max_uses: 0}}}\n", []string{"pool.max_uses: must be at least 1, got 0"}},
		{"a duration without a unit is an error", "sandboxes:\n  default:\n    pool: {idle_timeout: 10}\n", []string{"line 3", "not a duration"}},
		{"a zero duration is an error", "sandboxes: {default: {pool: {ready_timeout: 0s}}}\n", []string{"pool.ready_timeout: must be positive"}},
		{"a relative mount target is an error", "sandboxes: {default: {mounts: [{source: /d, target: data}]}}\n", []string{"mounts[0].target", "absolute"}},
		{"a relative mount source is an error", "sandboxes: {default: {mounts: [{source: d, target: /data}]}}\n", []string{"mounts[0].source"}},
		{"a mount on / is an error", "sandboxes: {default: {mounts: [{source: /d, target: /}]}}\n", []string{"may not replace /"}},
		{"a mount on /workspace is an error", "sandboxes: {default: {mounts: [{source: /d, target: /workspace}]}}\n", []string{"/workspace is reserved"}},
		{"a mount under /tmp is an error", "sandboxes: {default: {mounts: [{source: /d, target: /tmp/x}]}}\n", []string{"/tmp/x is reserved"}},
		{"a mount on /tools/ is an error", "sandboxes: {default: {mounts: [{source: /d, target: /tools/}]}}\n", []string{"/tools is reserved"}},
		{"the same mount target twice is an error", "sandboxes: {default: {mounts: [{source: /d, target: /d}, {source: /e, target: /d}]}}\n", []string{"mounts[1].target: /d is mounted twice"}},
		{"a base image with a space is an error", "sandboxes: {default: {base_image: \"a b\"}}\n", []string{"base_image"}},
		{"a relative host path is an error", "host_path_map: {app: /srv}\nsandboxes: {default: {}}\n", []string{"host_path_map", "absolute"}},
		{"a private range that is not a prefix names the field and its line", "sandboxes:\n  default:\n    network:\n      allowed_hosts: [\"a.com:443\"]\n      private_ranges:\n        - 10.20.0.0/16\n        - 10.0.0.1\n", []string{`sandbox "default": line 7: network.private_ranges[1]: "10.0.0.1" is not a CIDR prefix like 10.20.0.0/16`}},
		{"a private range with bits past its length says which prefix was meant", "sandboxes: {default: {network: {allowed_hosts: [\"a.com:443\"], private_ranges: [10.20.30.40/16]}}}\n", []string{"line 1: network.private_ranges[0]", "write 10.20.0.0/16"}},
		{"a private range of loopback is an error", "sandboxes: {default: {network: {allowed_hosts: [\"a.com:443\"], private_ranges: [127.0.0.0/8]}}}\n", []string{"network.private_ranges[0]", "127.0.0.0 is loopback"}},
		{"a private range that is not a string is an error", "sandboxes:\n  default:\n    network: {allowed_hosts: [\"a.com:443\"], private_ranges: [{cidr: 10.0.0.0/8}]}\n", []string{"line 3: network.private_ranges[0]: must be a CIDR prefix"}},
		{"private ranges without allowed hosts are an error", "sandboxes:\n  default:\n    network: {private_ranges: [10.0.0.0/8]}\n", []string{"line 3: network.private_ranges: set without network.allowed_hosts"}},
		{"every problem is reported, not only the first", "sandboxes: {a: {pool: {max_uses: 0}}, b: {resources: {pids: -1}}}\n", []string{`sandbox "a": pool.max_uses`, `sandbox "b": resources.pids`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string]string{"config.yaml": tt.config}
			for k, v := range tools {
				files[k] = v
			}
			cfg, err := parse(t, files)
			if err == nil {
				t.Fatalf("LoadConfig succeeded: %+v", cfg)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestHostPathUsesTheLongestMatchingPrefix(t *testing.T) {
	cfg := &Config{HostPathMap: map[string]string{"/app": "/srv/app", "/app/data": "/mnt/data", "/ap": "/wrong"}}
	tests := []struct{ in, want string }{
		{"/app/data/x.csv", "/mnt/data/x.csv"},
		{"/app/data", "/mnt/data"},
		{"/app/other", "/srv/app/other"},
		{"/apple", "/apple"},
		{"/elsewhere/", "/elsewhere"},
	}
	for _, tt := range tests {
		if got := cfg.HostPath(tt.in); got != tt.want {
			t.Errorf("HostPath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestAnIndentationErrorNamesItsLine gives a YAML syntax error the line where the
// document stops parsing: the parser names where the mapping it was reading began.
func TestAnIndentationErrorNamesItsLine(t *testing.T) {
	bad := "sandboxes:\n  default:\n    base_image: jazzmine-python-base:bookworm\n    tools: []\n   requirements: []\n"
	_, err := ParseConfig([]byte(bad), t.TempDir())
	if err == nil || !strings.HasPrefix(err.Error(), `line 5: did not find expected key (line 5: "   requirements: []"`) {
		t.Errorf("ParseConfig: %v, want the error on line 5", err)
	}
}
