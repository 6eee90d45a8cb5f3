package sandboxpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/jazzmine/worker/harness"
)

// Defaults, used where a field is zero (see each field for what zero means).
const (
	DefaultMaxUses        = 500
	DefaultMaxAge         = time.Hour
	DefaultIdleTimeout    = 10 * time.Minute
	DefaultReadyTimeout   = 30 * time.Second
	DefaultResetTimeout   = 5 * time.Second
	DefaultHealthInterval = 30 * time.Second
	DefaultReapMinAge     = time.Minute
	DefaultReapGrace      = 2 * time.Minute
	DefaultReapInterval   = 30 * time.Second
	DefaultMemoryBytes    = 512 << 20
	DefaultNanoCPUs       = 1_000_000_000
	DefaultPIDs           = 128
	DefaultTmpfsBytes     = 64 << 20
	// SandboxUID is the uid and gid of the image's non-root user "sandbox" (imagebuild
	// creates it with this id): the group every container's processes run as.
	SandboxUID = harness.SandboxUID
	// SandboxUser is that user's name, each container's USER and LOGNAME.
	SandboxUser = harness.SandboxUser
	// Each container runs as a uid of its own, drawn at random from SandboxUIDs uids
	// from SandboxUIDBase, with the group SandboxUID; the harness owns /workspace and
	// /tmp as it. The kernel counts some things per uid, not per container: inotify
	// instances and watches, POSIX message-queue bytes, pending signals, processes
	// (RLIMIT_NPROC), keyrings. With one uid for every sandbox of a host, a script that
	// used one up (128 inotify instances) left none to every other container's
	// scripts. No two live containers of a pool share a uid; two of different pools on
	// one host (several workers) do with a chance of about n²/2^25 for n containers. The
	// range is far above the ids of a host's users and the subordinate ids of user
	// namespaces that /etc/subuid gives from 100000, and below 2^31; other allocators
	// of user namespaces (systemd-nspawn's --private-users=pick, Kubernetes's) may use
	// it, and a sandbox would then share its counters with such a container.
	SandboxUIDBase = 1 << 30
	SandboxUIDs    = 1 << 24
	// EgressDir is where a sandbox's EgressVolume is mounted in its containers.
	EgressDir = "/run/jazzmine/egress"
)

// Labels put on every container the pool creates.
const (
	LabelManaged  = harness.LabelManaged
	LabelWorker   = "jazzmine.worker"
	LabelSandbox  = harness.LabelSandbox
	LabelChecksum = harness.LabelChecksum
)

// Sentinel errors.
var (
	// ErrUnknownSandbox is returned by Checkout for a sandbox the pool was not given.
	ErrUnknownSandbox = errors.New("sandboxpool: unknown sandbox")
	// ErrClosed is returned by Checkout once Close has begun.
	ErrClosed = errors.New("sandboxpool: pool closed")
)

// Mount is a bind mount into a sandbox's containers.
type Mount struct {
	// Source is the path as the worker sees it; it is translated through the pool's
	// HostPathMap before Docker sees it.
	Source string
	// Target is the absolute path inside the container.
	Target string
	// ReadOnly mounts it read-only.
	ReadOnly bool
}

// Sandbox describes the containers of one sandbox.
type Sandbox struct {
	// Name identifies the sandbox; required.
	Name string
	// Image is the image reference to run; required.
	Image string
	// Checksum labels the containers (jazzmine.checksum); may be empty.
	Checksum string
	// Env are plain environment variables.
	Env map[string]string
	// Secrets are environment variables resolved at spawn from Config.Secrets, then the
	// worker's environment; one found in neither is left unset (an execution that
	// requires it fails with missing_secrets).
	Secrets []string
	// Runtime is the OCI runtime of the containers, a name the engine knows
	// (CheckRuntimes): GVisor for gVisor's kernel, runc for the host's; empty means
	// the engine's default.
	Runtime string
	// MemoryBytes limits memory, with no swap; zero means DefaultMemoryBytes.
	MemoryBytes int64
	// NanoCPUs limits CPU in billionths of a CPU; zero means DefaultNanoCPUs.
	NanoCPUs int64
	// PIDs limits processes; zero means DefaultPIDs.
	PIDs int64
	// WorkspaceBytes and TmpBytes size the tmpfs at /workspace and /tmp; zero means
	// DefaultTmpfsBytes.
	WorkspaceBytes, TmpBytes int64
	// EgressVolume is the Docker volume that holds the socket of the sandbox's
	// egress proxy (imagebuild.EnsureEgressVolume); it is mounted read-only at
	// EgressDir, so that a script can connect to the socket but not replace it.
	// Empty means none. The containers have no network either way.
	EgressVolume string
	// Mounts are bind mounts.
	Mounts []Mount
	// PoolSize is how many containers are kept warm; zero means none (all on demand).
	PoolSize int
	// MaxOverflow is how many containers may run above PoolSize; zero means none.
	// PoolSize+MaxOverflow must be at least 1.
	MaxOverflow int
	// MaxUses retires a container after that many executions; zero means
	// DefaultMaxUses.
	MaxUses int
	// MaxAge retires a container that old: at its release, or idle at a moment
	// nobody waits for the sandbox (a replacement starts first, as for MaxUses).
	// Zero means DefaultMaxAge.
	MaxAge time.Duration
	// IdleTimeout removes idle containers above PoolSize; zero means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// ReadyTimeout bounds the wait for the harness's ready line; zero means
	// DefaultReadyTimeout.
	ReadyTimeout time.Duration
}

// capacity is the most containers the sandbox may have at once.
func (s *Sandbox) capacity() int { return s.PoolSize + s.MaxOverflow }

// WithDefaults is s with the defaults in its zero fields, as the pool runs it.
func (s Sandbox) WithDefaults() Sandbox {
	s.setDefaults()
	return s
}

func (s *Sandbox) setDefaults() {
	if s.MemoryBytes == 0 {
		s.MemoryBytes = DefaultMemoryBytes
	}
	if s.NanoCPUs == 0 {
		s.NanoCPUs = DefaultNanoCPUs
	}
	if s.PIDs == 0 {
		s.PIDs = DefaultPIDs
	}
	if s.WorkspaceBytes == 0 {
		s.WorkspaceBytes = DefaultTmpfsBytes
	}
	if s.TmpBytes == 0 {
		s.TmpBytes = DefaultTmpfsBytes
	}
	if s.MaxUses == 0 {
		s.MaxUses = DefaultMaxUses
	}
	if s.MaxAge == 0 {
		s.MaxAge = DefaultMaxAge
	}
	if s.IdleTimeout == 0 {
		s.IdleTimeout = DefaultIdleTimeout
	}
	if s.ReadyTimeout == 0 {
		s.ReadyTimeout = DefaultReadyTimeout
	}
}

func (s *Sandbox) validate() error {
	switch {
	case s.Name == "":
		return errors.New("sandbox name is empty")
	case s.Image == "":
		return fmt.Errorf("sandbox %q: image is empty", s.Name)
	case s.PoolSize < 0 || s.MaxOverflow < 0:
		return fmt.Errorf("sandbox %q: pool size %d and max overflow %d must not be negative", s.Name, s.PoolSize, s.MaxOverflow)
	case s.capacity() < 1:
		return fmt.Errorf("sandbox %q: pool size plus max overflow must be at least 1", s.Name)
	case s.MemoryBytes < 0 || s.NanoCPUs < 0 || s.PIDs < 0 || s.MaxUses < 0 || s.MaxAge < 0:
		return fmt.Errorf("sandbox %q: resource limits must not be negative", s.Name)
	}
	for _, m := range s.Mounts {
		if !path.IsAbs(m.Target) || !path.IsAbs(m.Source) {
			return fmt.Errorf("sandbox %q: mount %s:%s: source and target must be absolute paths", s.Name, m.Source, m.Target)
		}
	}
	return nil
}

// Config configures a Pool.
type Config struct {
	// Docker is the engine client; nil means a client for the engine the environment
	// names (DOCKER_HOST, as the docker CLI reads it), made by New and closed by Close.
	Docker Docker
	// WorkerID labels every container (jazzmine.worker); required. It must be unique to
	// this process: containers of another worker id are never touched while that
	// worker is alive.
	WorkerID string
	// Sandboxes are the sandboxes the pool serves.
	Sandboxes []Sandbox
	// Secrets holds secret values by name; a secret not here is looked up with
	// LookupEnv.
	Secrets map[string]string
	// LookupEnv reads the worker's environment; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// HostPathMap translates bind-mount sources for Docker-out-of-Docker: a source
	// under a key (a path inside the worker's container) is rewritten under its value
	// (the same directory on the Docker host). The longest matching key wins.
	HostPathMap map[string]string
	// WorkerAlive tells the reaper whether another worker is alive. Containers of a
	// worker it reports dead are removed. Nil means other workers' containers are never
	// removed.
	WorkerAlive func(ctx context.Context, workerID string) (bool, error)
	// ReapInterval is how often the started pool runs ReapOrphans; zero means
	// DefaultReapInterval, a negative value only at Start.
	ReapInterval time.Duration
	// ReapMinAge spares containers younger than this from the reaper, so that a worker
	// that is still starting (its liveness not yet recorded) keeps its containers;
	// zero means DefaultReapMinAge.
	ReapMinAge time.Duration
	// ReapGrace is how long a worker must have been reported dead, in every check
	// since the first, before its containers are removed: a worker cut off from NATS
	// for a while (its liveness entry expired, its jobs still running) is not dead, and
	// removing its containers would crash its jobs. Zero means DefaultReapGrace; a
	// negative value removes them at the first check.
	ReapGrace time.Duration
	// Executor runs executions for Lease.Run; nil means a zero harness.Executor.
	Executor *harness.Executor
	// ResetTimeout bounds a reset on return; zero means DefaultResetTimeout.
	ResetTimeout time.Duration

	// ResetOnReturn sends the harness an explicit reset request when a container comes
	// back, and lends it again at the answer. Off, the pool waits for the reset_done
	// the harness sends unasked after every execute: the same reset, without a round
	// trip through Docker (measured: about 1.4 ms of CPU per job less, fork included
	// either way). It exists to measure that difference.
	ResetOnReturn bool
	// SharedUID runs every container as SandboxUID, as before each had a uid of its
	// own: for an engine that maps its containers' uids into a range of its own
	// (userns-remap, rootless), where a uid from SandboxUIDBase has no mapping (see
	// RemapsUIDs). The kernel's per-uid counters are then shared by its containers.
	SharedUID bool
	// HealthInterval is how often idle containers are pinged; zero means
	// DefaultHealthInterval.
	HealthInterval time.Duration
	// Logger receives the pool's logs; nil means slog.Default().
	Logger *slog.Logger
	// TracerProvider traces the spawns a Checkout waits for, as children of the
	// caller's span; nil means otel's global provider.
	TracerProvider trace.TracerProvider
}

// translatePath rewrites p through m, the longest matching prefix winning. A prefix
// matches whole path elements only: /data matches /data and /data/x, not /database.
func translatePath(p string, m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	clean := path.Clean(p)
	for _, k := range keys {
		from := path.Clean(k)
		if clean == from || strings.HasPrefix(clean, strings.TrimSuffix(from, "/")+"/") {
			return path.Join(m[k], strings.TrimPrefix(clean, from))
		}
	}
	return p
}

func (c *Config) lookupSecret(name string) (string, bool) {
	if v, ok := c.Secrets[name]; ok {
		return v, true
	}
	if c.LookupEnv != nil {
		return c.LookupEnv(name)
	}
	return os.LookupEnv(name)
}
