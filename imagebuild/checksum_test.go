package imagebuild

import (
	"maps"
	"regexp"
	"slices"
	"testing"
	"testing/fstest"

	"github.com/jazzmine/worker/harness"
)

const baseID = "sha256:7612e81347e0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// checksumFiles is a sandbox with tools, Debian packages, requirements and a wheelhouse.
func checksumFiles() map[string]string {
	return map[string]string{
		"config.yaml":          "sandboxes:\n  default: {tools: [tools/*.py], apt_packages: [python3-lxml, python3-yaml], requirements: [mypkg==0.1, other], wheelhouse: wheels}\n",
		"tools/a.py":           "def a(): return 1\n",
		"tools/b.py":           "def b(): return 2\n",
		"wheels/mypkg-0.1.whl": "wheel one",
		"wheels/other-1.0.whl": "wheel two",
	}
}

func TestChecksumIsStable(t *testing.T) {
	a := Checksum(mustParse(t, checksumFiles()).Sandboxes["default"], baseID)
	b := Checksum(mustParse(t, checksumFiles()).Sandboxes["default"], baseID)
	if a != b {
		t.Fatalf("one spec loaded twice has two checksums: %s, %s", a, b)
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(a) {
		t.Errorf("checksum %q is not 64 hex characters", a)
	}
}

func TestChecksumIgnoresWhatOnlyAppliesAtRunTime(t *testing.T) {
	files := checksumFiles()
	want := Checksum(mustParse(t, files).Sandboxes["default"], baseID)
	files["config.yaml"] = `
secrets: {K: v}
sandboxes:
  default:
    tools: [tools/*.py]
    apt_packages: [python3-lxml, python3-yaml]
    requirements: [mypkg==0.1, other]
    wheelhouse: wheels
    secrets: [K]
    env: {A: b}
    runtime: runsc
    resources: {memory_mb: 1024}
    network: {allowed_hosts: ["a.com:443"]}
    mounts: [{source: /d, target: /d}]
    pool: {size: 5}
`
	if got := Checksum(mustParse(t, files).Sandboxes["default"], baseID); got != want {
		t.Error("a change of run-time settings changed the image checksum (and would rebuild)")
	}
}

func TestChecksumChangesWithEveryImageInput(t *testing.T) {
	base := Checksum(mustParse(t, checksumFiles()).Sandboxes["default"], baseID)
	tests := []struct {
		name   string
		change func(files map[string]string)
	}{
		{"one byte of a tool", func(f map[string]string) { f["tools/a.py"] = "def a(): return 2\n" }},
		{"a tool's name", func(f map[string]string) { f["tools/c.py"] = f["tools/b.py"]; delete(f, "tools/b.py") }},
		{"a byte moved from one tool to the next", func(f map[string]string) {
			f["tools/a.py"] = "def a(): return 1\nd"
			f["tools/b.py"] = "ef b(): return 2\n"
		}},
		{"a new tool", func(f map[string]string) { f["tools/c.py"] = "x = 1\n" }},
		{"a requirement", func(f map[string]string) {
			f["config.yaml"] = "sandboxes:\n  default: {tools: [tools/*.py], apt_packages: [python3-lxml, python3-yaml], requirements: [mypkg==0.2, other], wheelhouse: wheels}\n"
		}},
		{"the order of the requirements", func(f map[string]string) {
			f["config.yaml"] = "sandboxes:\n  default: {tools: [tools/*.py], apt_packages: [python3-lxml, python3-yaml], requirements: [other, mypkg==0.1], wheelhouse: wheels}\n"
		}},
		{"a Debian package", func(f map[string]string) {
			f["config.yaml"] = "sandboxes:\n  default: {tools: [tools/*.py], apt_packages: [python3-lxml, python3-yam], requirements: [mypkg==0.1, other], wheelhouse: wheels}\n"
		}},
		{"a Debian package's version", func(f map[string]string) {
			f["config.yaml"] = "sandboxes:\n  default: {tools: [tools/*.py], apt_packages: [python3-lxml, python3-yaml=6.0-3], requirements: [mypkg==0.1, other], wheelhouse: wheels}\n"
		}},
		{"a new Debian package", func(f map[string]string) {
			f["config.yaml"] = "sandboxes:\n  default: {tools: [tools/*.py], apt_packages: [python3-lxml, python3-yaml, python3-numpy], requirements: [mypkg==0.1, other], wheelhouse: wheels}\n"
		}},
		{"the Debian packages left out", func(f map[string]string) {
			f["config.yaml"] = "sandboxes:\n  default: {tools: [tools/*.py], requirements: [mypkg==0.1, other], wheelhouse: wheels}\n"
		}},
		{"one byte of a wheel", func(f map[string]string) { f["wheels/other-1.0.whl"] = "wheel twO" }},
		{"a new wheel", func(f map[string]string) { f["wheels/third-1.0.whl"] = "three" }},
		{"the base image's name", func(f map[string]string) {
			f["config.yaml"] = "sandboxes:\n  default: {base_image: other:1, tools: [tools/*.py], apt_packages: [python3-lxml, python3-yaml], requirements: [mypkg==0.1, other], wheelhouse: wheels}\n"
		}},
		{"the sandbox's name", func(f map[string]string) {
			f["config.yaml"] = "sandboxes:\n  other: {tools: [tools/*.py], apt_packages: [python3-lxml, python3-yaml], requirements: [mypkg==0.1, other], wheelhouse: wheels}\n"
		}},
	}
	for _, tt := range tests {
		t.Run("changing "+tt.name+" changes the checksum", func(t *testing.T) {
			files := checksumFiles()
			tt.change(files)
			cfg := mustParse(t, files)
			spec := cfg.Sandboxes[cfg.Names()[0]]
			if got := Checksum(spec, baseID); got == base {
				t.Errorf("checksum unchanged: %s", got)
			}
		})
	}

	spec := mustParse(t, checksumFiles()).Sandboxes["default"]
	t.Run("changing the base image's id changes the checksum", func(t *testing.T) {
		if Checksum(spec, baseID+"0") == base {
			t.Error("checksum unchanged")
		}
	})
}

func TestTheOrderOfTheDebianPackagesDoesNotChangeTheChecksum(t *testing.T) {
	want := Checksum(mustParse(t, checksumFiles()).Sandboxes["default"], baseID)
	files := checksumFiles()
	files["config.yaml"] = "sandboxes:\n  default: {tools: [tools/*.py], apt_packages: [python3-yaml, python3-lxml], requirements: [mypkg==0.1, other], wheelhouse: wheels}\n"
	if got := Checksum(mustParse(t, files).Sandboxes["default"], baseID); got != want {
		t.Error("listing the same Debian packages in another order changed the checksum (apt installs the same set)")
	}
}

func TestChecksumCoversEveryFileOfTheHarness(t *testing.T) {
	spec := mustParse(t, checksumFiles()).Sandboxes["default"]
	base := Checksum(spec, baseID)
	files, err := readHarness(harness.Source())
	if err != nil {
		t.Fatal(err)
	}
	if checksum(spec, baseID, files) != base {
		t.Fatal("checksum() with the harness's source differs from Checksum()")
	}
	for i, f := range files {
		if f.dir {
			continue
		}
		t.Run("changing one byte of the harness's "+f.name+" changes the checksum", func(t *testing.T) {
			changed := slices.Clone(files)
			changed[i].content = slices.Clone(f.content)
			changed[i].content[len(f.content)/2] ^= 1
			if checksum(spec, baseID, changed) == base {
				t.Error("checksum unchanged")
			}
		})
	}
	t.Run("a file added to the harness, or one renamed, changes the checksum", func(t *testing.T) {
		src := fstest.MapFS{}
		for _, f := range files {
			if !f.dir {
				src[f.name] = &fstest.MapFile{Data: f.content, Mode: 0o444}
			}
		}
		same, err := readHarness(src)
		if err != nil || checksum(spec, baseID, same) != base {
			t.Fatalf("the same files read from another file system give another checksum (%v)", err)
		}
		added := maps.Clone(src)
		added[harness.Package+"/extra.py"] = &fstest.MapFile{Data: []byte("\n")}
		renamed := maps.Clone(src)
		renamed[harness.Package+"/protocol2.py"] = renamed[harness.Package+"/protocol.py"]
		delete(renamed, harness.Package+"/protocol.py")
		for name, fsys := range map[string]fstest.MapFS{"added": added, "renamed": renamed} {
			other, err := readHarness(fsys)
			if err != nil {
				t.Fatal(err)
			}
			if checksum(spec, baseID, other) == base {
				t.Errorf("%s: checksum unchanged", name)
			}
		}
	})
}

func TestTag(t *testing.T) {
	sum := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct{ name, want string }{
		{"default", "jazzmine-sandbox-default:0123456789abcdef"},
		{"Data_Science", "jazzmine-sandbox-data-science:0123456789abcdef"},
		{"trailing_", "jazzmine-sandbox-trailing:0123456789abcdef"},
		{"a__-b", "jazzmine-sandbox-a---b:0123456789abcdef"},
		{"_", "jazzmine-sandbox-unnamed:0123456789abcdef"},
	}
	for _, tt := range tests {
		if got := Tag(tt.name, sum); got != tt.want {
			t.Errorf("Tag(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}
