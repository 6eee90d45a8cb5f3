package imagebuild

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults of a sandbox, applied by [ParseConfig] where the file leaves a field out.
const (
	// DefaultBaseImage is the image every sandbox image starts from (make base-image).
	DefaultBaseImage = "jazzmine-python-base:bookworm"
	// DefaultPoolSize is the number of warm containers kept per sandbox.
	DefaultPoolSize = 2
	// DefaultMaxOverflow is the number of containers allowed above the pool size.
	DefaultMaxOverflow = 4
)

// Config is a loaded configuration file: every sandbox, resolved and validated.
//
// The file is YAML. An unknown field is an error that names the field and its
// line; relative paths are relative to the file's directory:
//
//	secrets:            # optional values for secrets; a secret not here comes from the worker's environment
//	  STRIPE_KEY: "..."
//	host_path_map:      # optional, Docker-out-of-Docker: worker-side path prefix -> host path prefix
//	  /app/data: /srv/host/data
//	sandboxes:
//	  default:                        # name: ^[A-Za-z0-9_-]{1,64}$
//	    description: ""               # what it is for, told to agents (the sandbox catalog)
//	    base_image: jazzmine-python-base:bookworm   # the default when empty
//	    tools: [tools/*.py]           # *.py files or globs; a glob that matches nothing is an error
//	    apt_packages: []              # Debian package names, optionally name=version, from the base image's apt sources
//	    requirements: []              # pip requirement strings
//	    wheelhouse: ""                # optional directory of wheels; pip then runs with --no-index --find-links
//	    secrets: [STRIPE_KEY]         # names made available as environment variables
//	    env: {}                       # plain environment variables
//	    runtime: ""                   # optional OCI runtime, e.g. runsc
//	    resources: {memory_mb: 512, cpus: 1.0, pids: 128, workspace_mb: 64, tmp_mb: 64}
//	    network: {allowed_hosts: [], private_ranges: []}  # host:port entries (empty: no way out at all); CIDR prefixes the names may resolve to though not global
//	    mounts: [{source: /data, target: /data, read_only: true}]   # read_only defaults to true
//	    pool: {size: 2, max_overflow: 4, max_uses: 500, max_age: 1h, idle_timeout: 10m, ready_timeout: 30s}
//
// A field left out takes its default (the Default* constants); a field given
// explicitly must be valid (an explicit memory_mb: 0 is an error, not the default).
type Config struct {
	// Secrets are values for secrets by name. A secret a sandbox lists that is not
	// here is taken from the worker's environment when a container starts.
	Secrets map[string]string
	// HostPathMap maps a worker-side path prefix to the host's path prefix, for bind
	// mounts under Docker-out-of-Docker. See [Config.HostPath].
	HostPathMap map[string]string
	// Sandboxes are the sandboxes by name.
	Sandboxes map[string]*Spec
	// Dir is the absolute directory relative paths in the file were resolved against.
	Dir string
	// Worker is the file's "worker" section, left undecoded: package worker owns it.
	Worker yaml.Node
}

// Spec is one sandbox: what its image holds and how its containers run.
//
// The image (and so the checksum) depends on BaseImage, Tools, AptPackages,
// Requirements and the wheelhouse; the other fields apply when a container starts and never
// cause a rebuild.
type Spec struct {
	// Name is the sandbox's name, matching ^[A-Za-z0-9_-]{1,64}$.
	Name string
	// Description says what the sandbox is for, to the agents that read the fleet's
	// sandbox catalog (wire.SandboxInfo); at most 1024 bytes. It is not in the image.
	Description string
	// BaseImage is the image to build from; DefaultBaseImage when empty in the file.
	BaseImage string
	// Tools are the tool files copied to /tools, sorted by name, read when the
	// config was loaded.
	Tools []ToolFile
	// AptPackages are the Debian packages the image installs from the base image's
	// apt sources, each a package name ([a-z0-9][a-z0-9+.-]+) optionally followed by
	// "=version"; sorted, each at most once. apt resolves their dependencies, so
	// the order they are listed in means nothing and the sorted list is what the
	// checksum covers: reordering the file's list does not rebuild the image.
	AptPackages []string
	// Requirements are pip requirement strings, one line of requirements.txt each,
	// in the file's order (pip reads them in it). They are installed after
	// AptPackages, so that a requirement may use a library a Debian package brought.
	Requirements []string
	// Wheelhouse is the absolute path of a local directory of wheels, or empty. With
	// requirements, pip installs from it only (--no-index --find-links).
	Wheelhouse string
	// Wheels are the regular files at the top of Wheelhouse, sorted by name, hashed
	// when the config was loaded.
	Wheels []WheelFile
	// Secrets are the names of the secrets given to the container as environment
	// variables.
	Secrets []string
	// Env are plain environment variables of the container. JAZZMINE_* names are
	// the harness's and refused, except its settings (JAZZMINE_PRELOAD).
	Env map[string]string
	// Runtime is the OCI runtime of the containers (e.g. runsc); empty means
	// Docker's default.
	Runtime string
	// Resources are the limits of each container.
	Resources Resources
	// Network says where containers may connect to.
	Network Network
	// Mounts are bind mounts of each container.
	Mounts []Mount
	// Pool sizes the sandbox's container pool.
	Pool PoolSettings
}

// ToolFile is one tool source file of a sandbox.
type ToolFile struct {
	// Name is the file name in /tools, e.g. "text.py".
	Name string
	// Path is the absolute path the file was read from.
	Path string
	// Content is the file's content.
	Content []byte
}

// WheelFile is one file of a sandbox's wheelhouse.
type WheelFile struct {
	// Name is the file name, e.g. "mypkg-0.1-py3-none-any.whl".
	Name string
	// Path is the file's absolute path.
	Path string
	// SHA256 is the hex sha256 of the content when the config was loaded; a build
	// fails if the file has changed since.
	SHA256 string
	// Size is the file's size in bytes.
	Size int64
}

// Resources are a container's limits.
type Resources struct {
	// MemoryMB is the memory limit in MiB, without swap; zero means the pool's
	// default (sandboxpool.DefaultMemoryBytes).
	MemoryMB int64
	// CPUs is the CPU quota; zero means the pool's default (sandboxpool.DefaultNanoCPUs).
	CPUs float64
	// PIDs is the PIDs limit; zero means the pool's default (sandboxpool.DefaultPIDs).
	PIDs int64
	// WorkspaceMB is the size of the /workspace tmpfs in MiB; zero means the pool's
	// default (sandboxpool.DefaultTmpfsBytes).
	WorkspaceMB int64
	// TmpMB is the size of the /tmp tmpfs in MiB; zero means the pool's default
	// (sandboxpool.DefaultTmpfsBytes).
	TmpMB int64
}

// Network is a sandbox's egress policy.
type Network struct {
	// AllowedHosts are "host:port" entries the egress proxy lets through. Every
	// sandbox runs with network mode none; empty means no egress volume, no
	// proxy socket: no way out at all.
	AllowedHosts []string
	// PrivateRanges are CIDR prefixes ("10.20.0.0/16") that the names of
	// AllowedHosts may resolve to although they are not globally reachable
	// (private, shared or reserved addresses; see package proxy, which
	// validates them with proxy.ParsePrivateRange). Empty means a name may
	// resolve only to global addresses; an IP-literal entry needs no prefix.
	PrivateRanges []string
}

// Mount is a bind mount into a sandbox's containers.
type Mount struct {
	// Source is the absolute path on the worker's side (translated with
	// Config.HostPath for Docker-out-of-Docker).
	Source string
	// Target is the absolute path in the container.
	Target string
	// ReadOnly mounts read-only; the file's read_only defaults to true.
	ReadOnly bool
}

// PoolSettings size a sandbox's container pool.
type PoolSettings struct {
	// Size is the number of warm containers; 0 means none are kept warm. Default
	// DefaultPoolSize.
	Size int
	// MaxOverflow is the number of containers allowed above Size; default
	// DefaultMaxOverflow.
	MaxOverflow int
	// MaxUses is the number of executions before a container is retired, at least
	// 1; zero means the pool's default (sandboxpool.DefaultMaxUses).
	MaxUses int
	// MaxAge is how old a container may grow before it is replaced; zero means
	// the pool's default (sandboxpool.DefaultMaxAge).
	MaxAge time.Duration
	// IdleTimeout is how long a container above Size may stay idle; default
	// the pool's (sandboxpool.DefaultIdleTimeout).
	IdleTimeout time.Duration
	// ReadyTimeout is how long a new container has to announce ready; default
	// the pool's (sandboxpool.DefaultReadyTimeout).
	ReadyTimeout time.Duration
}

// LoadConfig reads, resolves and validates the configuration file at path (see
// ParseConfig). Relative paths in it are relative to the file's directory.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := ParseConfig(data, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes a configuration file strictly (an unknown field is an error
// naming it and its line), applies the defaults, reads the tool files and hashes
// the wheelhouses relative to dir, and validates every sandbox. A validation
// error names the sandbox and the field; all of them are returned, joined.
func ParseConfig(data []byte, dir string) (*Config, error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("config directory %q: %w", dir, err)
	}
	var file fileYAML
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the config is empty: it needs at least one sandbox under \"sandboxes\"")
		}
		return nil, explainYAMLError(data, err)
	}
	cfg := &Config{
		Secrets:     file.Secrets,
		HostPathMap: map[string]string{},
		Sandboxes:   map[string]*Spec{},
		Dir:         absDir,
		Worker:      file.Worker,
	}
	if cfg.Secrets == nil {
		cfg.Secrets = map[string]string{}
	}
	var errs []error
	for _, name := range sortedKeys(file.Secrets) {
		if err := checkEnvName(name); err != nil {
			errs = append(errs, fmt.Errorf("secrets: %w", err))
		}
	}
	for _, from := range sortedKeys(file.HostPathMap) {
		to := file.HostPathMap[from]
		if !filepath.IsAbs(from) || !filepath.IsAbs(to) {
			errs = append(errs, fmt.Errorf("host_path_map: %q -> %q: both paths must be absolute", from, to))
			continue
		}
		cfg.HostPathMap[filepath.Clean(from)] = filepath.Clean(to)
	}
	if len(file.Sandboxes) == 0 {
		errs = append(errs, errors.New("sandboxes: none defined; the config needs at least one"))
	}
	for _, name := range sortedKeys(file.Sandboxes) {
		spec, specErrs := resolveSpec(name, file.Sandboxes[name], absDir)
		for _, err := range specErrs {
			errs = append(errs, fmt.Errorf("sandbox %q: %w", name, err))
		}
		if len(specErrs) == 0 {
			cfg.Sandboxes[name] = spec
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Names returns the names of the sandboxes, sorted.
func (c *Config) Names() []string {
	return sortedKeys(c.Sandboxes)
}

// HostPath translates a worker-side path to the host's for a bind mount under
// Docker-out-of-Docker, with the longest prefix of HostPathMap that matches whole
// path elements. A path no prefix matches is returned cleaned and unchanged.
func (c *Config) HostPath(path string) string {
	path = filepath.Clean(path)
	best := ""
	for from := range c.HostPathMap {
		if len(from) <= len(best) {
			continue
		}
		if path == from || from == "/" || strings.HasPrefix(path, from+"/") {
			best = from
		}
	}
	if best == "" {
		return path
	}
	return filepath.Join(c.HostPathMap[best], strings.TrimPrefix(path, best))
}

// fileYAML and the types below mirror the file; pointers tell a field left out
// (the default) from one given as zero (validated).
type fileYAML struct {
	Worker      yaml.Node            `yaml:"worker"`
	Secrets     map[string]string    `yaml:"secrets"`
	HostPathMap map[string]string    `yaml:"host_path_map"`
	Sandboxes   map[string]*specYAML `yaml:"sandboxes"`
}

type specYAML struct {
	Description  string            `yaml:"description"`
	BaseImage    string            `yaml:"base_image"`
	Tools        []string          `yaml:"tools"`
	AptPackages  []string          `yaml:"apt_packages"`
	Requirements []string          `yaml:"requirements"`
	Wheelhouse   string            `yaml:"wheelhouse"`
	Secrets      []string          `yaml:"secrets"`
	Env          map[string]string `yaml:"env"`
	Runtime      string            `yaml:"runtime"`
	Resources    resourcesYAML     `yaml:"resources"`
	Network      networkYAML       `yaml:"network"`
	Mounts       []mountYAML       `yaml:"mounts"`
	Pool         poolYAML          `yaml:"pool"`
}

type resourcesYAML struct {
	MemoryMB    *int64   `yaml:"memory_mb"`
	CPUs        *float64 `yaml:"cpus"`
	PIDs        *int64   `yaml:"pids"`
	WorkspaceMB *int64   `yaml:"workspace_mb"`
	TmpMB       *int64   `yaml:"tmp_mb"`
}

type networkYAML struct {
	AllowedHosts  []string    `yaml:"allowed_hosts"`
	PrivateRanges []yaml.Node `yaml:"private_ranges"` // nodes, for their lines in errors
}

type mountYAML struct {
	Source   string `yaml:"source"`
	Target   string `yaml:"target"`
	ReadOnly *bool  `yaml:"read_only"`
}

type poolYAML struct {
	Size         *int      `yaml:"size"`
	MaxOverflow  *int      `yaml:"max_overflow"`
	MaxUses      *int      `yaml:"max_uses"`
	MaxAge       *duration `yaml:"max_age"`
	IdleTimeout  *duration `yaml:"idle_timeout"`
	ReadyTimeout *duration `yaml:"ready_timeout"`
}

// yamlSections names the part of the file each mirror type decodes, for errors.
var yamlSections = map[string]string{
	"fileYAML":      "the top level",
	"specYAML":      "a sandbox",
	"resourcesYAML": "resources",
	"networkYAML":   "network",
	"mountYAML":     "a mount",
	"poolYAML":      "pool",
}

var unknownFieldRE = regexp.MustCompile(`^line (\d+): field (.+) not found in type imagebuild\.(\w+)$`)

// explainYAMLError rewords the decoder's "field x not found in type
// imagebuild.poolYAML" as "unknown field "x" in pool", and gives a syntax error the
// line it is on (syntaxLine); other errors pass through.
func explainYAMLError(data []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return syntaxLine(data, err)
	}
	msgs := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		msgs[i] = e
		if m := unknownFieldRE.FindStringSubmatch(e); m != nil && yamlSections[m[3]] != "" {
			msgs[i] = fmt.Sprintf("line %s: unknown field %q in %s", m[1], m[2], yamlSections[m[3]])
		}
	}
	return errors.New(strings.Join(msgs, "\n"))
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxLine gives a YAML syntax error the line where the document stops parsing.
// The parser names where the construct it was reading started: a line indented one
// space too few, on line 5 of a mapping that starts on line 1, is "yaml: line 1: did
// not find expected key". The first prefix of the document, line by line, that fails
// with the same error ends on the line at fault; a prefix that fails otherwise (it
// cut a construct in two) does not count. err is returned as it is when no prefix
// tells.
func syntaxLine(data []byte, err error) error {
	m := yamlLineRE.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	what := err.Error()[len(m[0]):]
	lines := bytes.SplitAfter(data, []byte("\n"))
	for n := 1; n <= len(lines) && n <= 10_000; n++ {
		var v any
		perr := yaml.Unmarshal(bytes.Join(lines[:n], nil), &v)
		if perr == nil {
			continue
		}
		pm := yamlLineRE.FindStringSubmatch(perr.Error())
		if pm == nil || perr.Error()[len(pm[0]):] != what {
			continue
		}
		if fmt.Sprint(n) == m[1] {
			return err
		}
		return fmt.Errorf("line %d: %s (line %d: %q; the parser names line %s, where what it was reading began: check the indentation)", n, what, n, strings.TrimRight(string(lines[n-1]), "\r\n"), m[1])
	}
	return err
}

// duration is a time.Duration written as a string with a unit ("10m", "30s").
type duration time.Duration

func (d *duration) UnmarshalYAML(node *yaml.Node) error {
	var s string
	if node.Kind != yaml.ScalarNode || node.Decode(&s) != nil || node.Tag != "!!str" {
		return fmt.Errorf("line %d: %q is not a duration: write it with a unit, like 30s or 10m", node.Line, node.Value)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration: write it with a unit, like 30s or 10m", node.Line, s)
	}
	*d = duration(v)
	return nil
}

func (d duration) String() string { return time.Duration(d).String() }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
