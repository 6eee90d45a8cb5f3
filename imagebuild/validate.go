package imagebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/jazzmine/worker/proxy"
)

var (
	sandboxNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	envNameRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	toolNameRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*\.py$`)
	imageRefRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:@-]*$`)
	runtimeRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	hostnameRE    = regexp.MustCompile(`^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)
)

// Debian policy 5.6.1 and 5.6.12: a package name is lower-case letters, digits,
// + - and ., at least two long, starting with a letter or digit; a version is
// [epoch:]upstream[-revision], starting with a digit. Nothing else may pass: the
// entries are written into a RUN line of the generated Dockerfile.
var (
	aptPackageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	aptVersionRE = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~:-]*$`)
)

// harnessSettings are the JAZZMINE_* variables a sandbox's env may set: settings the
// harness reads when it starts (JAZZMINE_PRELOAD: comma-separated modules it imports
// once, before it forks any script). Every other JAZZMINE_* name is the harness's own.
var harnessSettings = map[string]bool{"JAZZMINE_PRELOAD": true}

// maxDescription bounds a sandbox's description, which every catalog entry carries.
const maxDescription = 1024

// reservedTargets are container paths a mount may neither replace nor sit under:
// the image's own directories, the tmpfs mounts the harness wipes, and the kernel's.
var reservedTargets = []string{WorkspaceDir, TmpDir, ToolsDir, filepath.Dir(HarnessPath), "/proc", "/sys", "/dev"}

// resolveSpec applies the defaults to one sandbox of the file, reads its tools and
// hashes its wheelhouse, and returns every problem it finds.
func resolveSpec(name string, in *specYAML, dir string) (*Spec, []error) {
	if in == nil {
		in = &specYAML{}
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if !sandboxNameRE.MatchString(name) {
		bad("the name must match ^[A-Za-z0-9_-]{1,64}$")
	}
	s := &Spec{
		Name:         name,
		Description:  in.Description,
		BaseImage:    in.BaseImage,
		Requirements: in.Requirements,
		Secrets:      in.Secrets,
		Env:          in.Env,
		Runtime:      in.Runtime,
		Network:      Network{AllowedHosts: in.Network.AllowedHosts},
	}
	if len(s.Description) > maxDescription {
		bad("description: %d bytes, at most %d are allowed", len(s.Description), maxDescription)
	}
	if s.BaseImage == "" {
		s.BaseImage = DefaultBaseImage
	} else if !imageRefRE.MatchString(s.BaseImage) {
		bad("base_image: %q is not an image reference", s.BaseImage)
	}
	if s.Env == nil {
		s.Env = map[string]string{}
	}
	if s.Runtime != "" && !runtimeRE.MatchString(s.Runtime) {
		bad("runtime: %q is not a runtime name", s.Runtime)
	}

	tools, err := resolveTools(in.Tools, dir)
	if err != nil {
		errs = append(errs, err)
	}
	s.Tools = tools

	s.AptPackages, err = resolveAptPackages(in.AptPackages)
	if err != nil {
		errs = append(errs, err)
	}
	for i, r := range s.Requirements {
		if strings.TrimSpace(r) == "" || strings.ContainsAny(r, "\r\n") {
			bad("requirements[%d]: %q must be one non-empty line", i, r)
		}
	}
	if in.Wheelhouse != "" {
		s.Wheelhouse = in.Wheelhouse
		if !filepath.IsAbs(s.Wheelhouse) {
			s.Wheelhouse = filepath.Join(dir, s.Wheelhouse)
		}
		s.Wheelhouse = filepath.Clean(s.Wheelhouse)
		wheels, err := hashWheelhouse(s.Wheelhouse)
		if err != nil {
			bad("wheelhouse: %w", err)
		}
		s.Wheels = wheels
	}

	errs = append(errs, checkEnv(s)...)
	errs = append(errs, resolveNetwork(s, in.Network)...)

	s.Mounts, err = resolveMounts(in.Mounts)
	if err != nil {
		errs = append(errs, err)
	}

	s.Resources, s.Pool = resolveLimits(&errs, in.Resources, in.Pool)
	return s, errs
}

// resolveAptPackages checks the Debian packages of a sandbox and returns them
// sorted. An entry is a package name, optionally with =version; a name listed
// twice is an error (with two versions apt would fail the build, and without, one
// of them is a slip).
func resolveAptPackages(in []string) ([]string, error) {
	if len(in) == 0 {
		return nil, nil
	}
	var errs []error
	seen := map[string]bool{}
	for i, p := range in {
		name, version, pinned := strings.Cut(p, "=")
		switch {
		case !aptPackageRE.MatchString(name):
			errs = append(errs, fmt.Errorf("apt_packages[%d]: %q is not a Debian package name (lower-case letters, digits, + - and ., at least two, starting with a letter or digit; optionally =version)", i, p))
		case !pinned && strings.HasSuffix(name, "-"):
			// apt-get install reads a trailing - as "remove this package" (a trailing
			// + is "install", and names such as g++ end in it).
			errs = append(errs, fmt.Errorf("apt_packages[%d]: %q ends in \"-\", which apt-get reads as \"remove\", not as part of the name", i, p))
		case pinned && !aptVersionRE.MatchString(version):
			errs = append(errs, fmt.Errorf("apt_packages[%d]: %q: %q is not a Debian version (a digit first, then letters, digits and . + ~ : -)", i, p, version))
		case seen[name]:
			errs = append(errs, fmt.Errorf("apt_packages[%d]: %q is listed twice", i, name))
		}
		seen[name] = true
	}
	out := slices.Clone(in)
	slices.Sort(out)
	return out, errors.Join(errs...)
}

// checkEnv checks the names of the secrets and the environment: valid, and none twice.
func checkEnv(s *Spec) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	seen := map[string]string{}
	for _, n := range s.Secrets {
		if err := checkEnvName(n); err != nil {
			bad("secrets: %w", err)
		} else if seen[n] != "" {
			bad("secrets: %q is listed twice", n)
		}
		seen[n] = "secrets"
	}
	for _, n := range sortedKeys(s.Env) {
		if err := checkEnvName(n); err != nil && !harnessSettings[n] {
			bad("env: %w", err)
		} else if seen[n] != "" {
			bad("env: %q is also a secret", n)
		}
	}

	return errs
}

// resolveNetwork checks the egress allowlist and the private ranges it may reach.
func resolveNetwork(s *Spec, in networkYAML) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, h := range s.Network.AllowedHosts {
		if err := checkHostPort(h); err != nil {
			bad("network.allowed_hosts: %w", err)
		}
	}
	for i, n := range in.PrivateRanges {
		if n.Kind != yaml.ScalarNode {
			bad("line %d: network.private_ranges[%d]: must be a CIDR prefix like 10.20.0.0/16", n.Line, i)
			continue
		}
		if _, err := proxy.ParsePrivateRange(n.Value); err != nil {
			bad("line %d: network.private_ranges[%d]: %w", n.Line, i, err)
			continue
		}
		s.Network.PrivateRanges = append(s.Network.PrivateRanges, n.Value)
	}
	if len(in.PrivateRanges) > 0 && len(s.Network.AllowedHosts) == 0 {
		bad("line %d: network.private_ranges: set without network.allowed_hosts, it opens nothing: the sandbox has no way out", in.PrivateRanges[0].Line)
	}

	return errs
}

// resolveLimits checks the resources and the pool of a sandbox. What the file leaves
// out stays zero, which the pool reads as its own default (one definition, in
// sandboxpool), except the pool's size and overflow, defaults of the file.
func resolveLimits(errs *[]error, r resourcesYAML, p poolYAML) (Resources, PoolSettings) {
	res := Resources{
		MemoryMB:    positive(errs, "resources.memory_mb", r.MemoryMB, 0),
		PIDs:        positive(errs, "resources.pids", r.PIDs, 0),
		WorkspaceMB: positive(errs, "resources.workspace_mb", r.WorkspaceMB, 0),
		TmpMB:       positive(errs, "resources.tmp_mb", r.TmpMB, 0),
		CPUs:        positive(errs, "resources.cpus", r.CPUs, 0),
	}

	pool := PoolSettings{
		Size:         atLeast(errs, "pool.size", p.Size, 0, DefaultPoolSize),
		MaxOverflow:  atLeast(errs, "pool.max_overflow", p.MaxOverflow, 0, DefaultMaxOverflow),
		MaxUses:      atLeast(errs, "pool.max_uses", p.MaxUses, 1, 0),
		MaxAge:       time.Duration(positive(errs, "pool.max_age", p.MaxAge, 0)),
		IdleTimeout:  time.Duration(positive(errs, "pool.idle_timeout", p.IdleTimeout, 0)),
		ReadyTimeout: time.Duration(positive(errs, "pool.ready_timeout", p.ReadyTimeout, 0)),
	}
	return res, pool
}

// resolveTools expands the tool patterns relative to dir and reads the files.
func resolveTools(patterns []string, dir string) ([]ToolFile, error) {
	var errs []error
	byName := map[string]string{} // file name -> path
	var tools []ToolFile
	for _, pattern := range patterns {
		full := pattern
		if !filepath.IsAbs(full) {
			full = filepath.Join(dir, full)
		}
		matches, err := filepath.Glob(full)
		if err != nil {
			errs = append(errs, fmt.Errorf("tools: %q is not a valid pattern: %w", pattern, err))
			continue
		}
		if len(matches) == 0 {
			errs = append(errs, fmt.Errorf("tools: %q matches no file (relative to %s)", pattern, dir))
			continue
		}
		isGlob := strings.ContainsAny(pattern, "*?[")
		files := 0
		for _, path := range matches {
			info, err := os.Stat(path)
			if err != nil {
				errs = append(errs, fmt.Errorf("tools: %w", err))
				continue
			}
			if info.IsDir() {
				if !isGlob {
					errs = append(errs, fmt.Errorf("tools: %s is a directory; name its files, e.g. %s", pattern, filepath.Join(pattern, "*.py")))
				}
				continue
			}
			files++
			name := filepath.Base(path)
			if prev, ok := byName[name]; ok {
				if prev != path {
					errs = append(errs, fmt.Errorf("tools: two tools are named %s (%s and %s)", name, prev, path))
				}
				continue
			}
			byName[name] = path
			if !toolNameRE.MatchString(name) {
				errs = append(errs, fmt.Errorf("tools: %s: a tool file must be a Python file named like name.py", path))
				continue
			}
			content, err := os.ReadFile(path)
			if err != nil {
				errs = append(errs, fmt.Errorf("tools: %w", err))
				continue
			}
			tools = append(tools, ToolFile{Name: name, Path: path, Content: content})
		}
		if files == 0 && isGlob {
			errs = append(errs, fmt.Errorf("tools: %q matches no file, only directories", pattern))
		}
	}
	sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
	return tools, errors.Join(errs...)
}

// hashWheelhouse lists and hashes the regular files at the top of dir.
func hashWheelhouse(dir string) ([]WheelFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var wheels []WheelFile
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		sum, size, err := hashFile(path)
		if err != nil {
			return nil, err
		}
		wheels = append(wheels, WheelFile{Name: e.Name(), Path: path, SHA256: sum, Size: size})
	}
	return wheels, nil // ReadDir sorts by name
}

func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func resolveMounts(in []mountYAML) ([]Mount, error) {
	var errs []error
	targets := map[string]bool{}
	var mounts []Mount
	for i, m := range in {
		field := fmt.Sprintf("mounts[%d]", i)
		if m.Source == "" || !filepath.IsAbs(m.Source) {
			errs = append(errs, fmt.Errorf("%s.source: %q must be an absolute path", field, m.Source))
		}
		target := filepath.Clean(m.Target)
		switch {
		case m.Target == "" || !filepath.IsAbs(m.Target):
			errs = append(errs, fmt.Errorf("%s.target: %q must be an absolute path", field, m.Target))
		case target == "/":
			errs = append(errs, fmt.Errorf("%s.target: a mount may not replace /", field))
		case targets[target]:
			errs = append(errs, fmt.Errorf("%s.target: %s is mounted twice", field, target))
		default:
			for _, r := range reservedTargets {
				if target == r || strings.HasPrefix(target, r+"/") {
					errs = append(errs, fmt.Errorf("%s.target: %s is reserved (%s belongs to the sandbox)", field, target, r))
					break
				}
			}
		}
		targets[target] = true
		readOnly := true
		if m.ReadOnly != nil {
			readOnly = *m.ReadOnly
		}
		mounts = append(mounts, Mount{Source: filepath.Clean(m.Source), Target: target, ReadOnly: readOnly})
	}
	return mounts, errors.Join(errs...)
}

func checkEnvName(name string) error {
	if !envNameRE.MatchString(name) {
		return fmt.Errorf("%q is not an environment variable name (letters, digits and _, not starting with a digit)", name)
	}
	if strings.HasPrefix(strings.ToUpper(name), "JAZZMINE_") {
		return fmt.Errorf("%q is reserved: JAZZMINE_* variables belong to the harness", name)
	}
	return nil
}

// checkHostPort accepts host:port with a DNS name (optionally *.-prefixed), an IPv4
// address or a bracketed IPv6 address, and a port from 1 to 65535.
func checkHostPort(entry string) error {
	host, port, err := net.SplitHostPort(entry)
	if err != nil {
		return fmt.Errorf("%q must be host:port, e.g. api.example.com:443", entry)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: the port must be a number from 1 to 65535", entry)
	}
	if net.ParseIP(host) == nil && !hostnameRE.MatchString(host) {
		return fmt.Errorf("%q: %q is neither a host name nor an IP address", entry, host)
	}
	return nil
}

type number interface {
	~int | ~int64 | ~float64
}

// positive returns *v, or def when v is nil; a value <= 0 is recorded as an error.
func positive[T number](errs *[]error, field string, v *T, def T) T {
	if v == nil {
		return def
	}
	if *v <= 0 {
		*errs = append(*errs, fmt.Errorf("%s: must be positive, got %v", field, *v))
	}
	return *v
}

// atLeast returns *v, or def when v is nil; a value below min is recorded as an error.
func atLeast(errs *[]error, field string, v *int, min, def int) int {
	if v == nil {
		return def
	}
	if *v < min {
		*errs = append(*errs, fmt.Errorf("%s: must be at least %d, got %d", field, min, *v))
	}
	return *v
}
