package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jazzmine/worker/harness"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// Defaults of the NATS side (DESIGN.md section 9), used where a Config field is zero.
const (
	DefaultAckWait           = 30 * time.Second
	DefaultHeartbeat         = 10 * time.Second
	DefaultMaxDeliver        = 3
	DefaultEventsMaxAge      = time.Hour
	DefaultDuplicateWindow   = 2 * time.Minute
	DefaultNakDelay          = 2 * time.Second
	DefaultShutdownGrace     = 30 * time.Second
	DefaultMaxBacklog        = 100_000
	DefaultMaxBacklogBytes   = 1 << 30
	DefaultTenantBacklog     = 10_000 // per tenant and sandbox
	DefaultFilesMaxBytes     = 1 << 30
	DefaultTenantFilesBytes  = 256 << 20        // per tenant
	DefaultMaxSessions       = 16               // per worker
	DefaultSandboxSessions   = 4                // per sandbox and worker
	DefaultSessionIdleTTL    = 10 * time.Minute // a session idle this long ends
	DefaultSessionMaxLife    = time.Hour        // a session this old ends
	DefaultLivenessTTL       = 15 * time.Second
	DefaultUnservedGrace     = 10 * time.Minute
	DefaultExecutionTimeout  = harness.DefaultTimeout        // the harness's, one definition
	DefaultMaxOutputBytes    = harness.DefaultMaxOutputBytes // the harness's, one definition
	DefaultEventPublishLimit = 10 * time.Second
)

// Names of the key-value buckets the fleet shares.
const (
	// BucketWorkers holds one key per live worker, refreshed while it runs.
	BucketWorkers = "jazzmine_workers"
	// BucketCancels holds the execution ids that were cancelled.
	BucketCancels = "jazzmine_cancels"
	// BucketFleet remembers, for FleetMemory, every worker that served against this
	// NATS deployment. The reaper removes the containers of a worker it finds there but
	// not in BucketWorkers (one of this fleet that died), and never those of a worker
	// it does not find (another fleet's, sharing the Docker host).
	BucketFleet = "jazzmine_fleet"
	// BucketSessions holds the fleet's sessions, by session id (<tenant>.<session_id>
	// for a tenant's): the worker that holds each, and whether it ended and why.
	BucketSessions = "jazzmine_sessions"
)

// SandboxesTTL is how long an entry of the sandbox catalog (wire.SandboxesBucket)
// lives after it was last put. Every worker puts its sandboxes' entries every quarter
// of it, so that a sandbox no worker serves any more leaves the catalog within it.
const SandboxesTTL = time.Hour

// FleetMemory is how long BucketFleet remembers a worker after its last refresh. A
// worker refreshes its entry every FleetMemory/4 while it runs, so a dead worker stays
// known for a day at least: long enough for any surviving worker to reap its
// containers.
const FleetMemory = 24 * time.Hour

// Sandbox is one sandbox this worker serves.
type Sandbox struct {
	// Name is the sandbox's name; jobs arrive on jazzmine.exec.<Name>.
	Name string
	// Slots is how many of its jobs this worker runs at once: the sandbox's pool
	// capacity (pool size plus overflow). Required.
	Slots int
	// MaxAckPending caps the sandbox's jobs in flight across the whole fleet (the
	// durable consumer's MaxAckPending); zero means Slots, right for one worker.
	MaxAckPending int
	// MaxInputBytes bounds a job's input files added up: the size of the sandbox's
	// workspace, which holds them. Zero leaves it to the harness, which fails the job
	// when they do not fit.
	MaxInputBytes int64
	// MaxSessions caps the sessions of the sandbox this worker holds at once; zero
	// means DefaultSandboxSessions. Each holds a container of the pool.
	MaxSessions int
	// TenantSessions caps the sessions of the sandbox that one tenant holds on this
	// worker at once, so that a tenant does not take every session's room (and its
	// containers) from the others; the fleet's own account has no cap but
	// MaxSessions. Zero means half of MaxSessions (at least 1). A tenant also holds at
	// most half of the worker's MaxSessions, all sandboxes together.
	TenantSessions int
	// TenantRefusal, when not empty, is why the sandbox serves the fleet's own account
	// only: a tenant's job or session call of it ends with an invalid_job error that
	// says so, and opens no session. A fleet that requires gVisor for its tenants'
	// sandboxes sets it on each sandbox that runs under another runtime. Empty serves
	// every tenant.
	TenantRefusal string
	// Pending holds back the sandbox's jobs and session calls until Worker.Serve
	// names it: the pool has no container of it yet, its image being built. Its
	// consumers exist meanwhile and its jobs wait in the stream, for this worker or
	// another that serves it; the streams take them (see served.go).
	Pending bool
	// Info is what the fleet's sandbox catalog (wire.SandboxesBucket) says of the
	// sandbox besides what its containers loaded: its description, limits, packages
	// and allowed hosts. The worker fills in the name, the tools, Python, the default
	// timeout (when TimeoutSec is zero), its id and the time.
	Info wire.SandboxInfo
}

// Config configures a Worker. Dependencies are required unless said otherwise.
type Config struct {
	// NATS is the connection to the NATS server or cluster.
	NATS *nats.Conn
	// Pool lends the containers; the Worker does not start or close it.
	Pool *sandboxpool.Pool
	// WorkerID identifies this worker in events and container labels; it must match
	// the pool's WorkerID. Empty means the pool's.
	WorkerID string
	// Sandboxes are the sandboxes this worker serves.
	Sandboxes []Sandbox
	// Replicas is the replica count of the streams, consumers and buckets the worker
	// creates; zero means 1. Use 3 on a three-node cluster.
	Replicas int
	// AckWait is how long a job may go without an ack or heartbeat before it is
	// redelivered; zero means DefaultAckWait.
	AckWait time.Duration
	// Heartbeat is how often a running job tells the server it is in progress; zero
	// means DefaultHeartbeat. It must be below AckWait.
	Heartbeat time.Duration
	// MaxDeliver is how many times a job may be delivered to run; the delivery after
	// the last publishes the job's end (an infrastructure error) instead of running
	// it, and the next ones try again until that end is stored. The consumer itself
	// delivers without limit. Zero means DefaultMaxDeliver.
	MaxDeliver int
	// NakDelay is the delay before an infrastructure failure is retried; zero means
	// DefaultNakDelay.
	NakDelay time.Duration
	// EventsMaxAge is how long events are kept; zero means DefaultEventsMaxAge.
	EventsMaxAge time.Duration
	// DuplicateWindow is the jobs stream's dedup window on Nats-Msg-Id; zero means
	// DefaultDuplicateWindow.
	DuplicateWindow time.Duration
	// MaxBacklog and MaxBacklogBytes bound the jobs stream; a publish beyond them
	// fails (DiscardNew). Zero means DefaultMaxBacklog and DefaultMaxBacklogBytes.
	MaxBacklog      int64
	MaxBacklogBytes int64
	// TenantBacklog bounds each subject of the jobs stream: a tenant's queued jobs
	// of one sandbox (jazzmine.exec.<tenant>.<sandbox>), or, without tenants, a
	// sandbox's; and of the sessions stream: one session's waiting calls. A publish
	// beyond it fails (DiscardNewPerSubject), so that one tenant or session cannot
	// fill the fleet's backlog for the others. Zero means DefaultTenantBacklog; a
	// negative value, no bound.
	TenantBacklog int64
	// MaxSessions caps the sessions this worker holds at once (one tenant's at most
	// half of them: Sandbox.TenantSessions); SessionIdleTTL and
	// SessionMaxLife end one idle that long, or that old. Zero means the defaults.
	MaxSessions    int
	SessionIdleTTL time.Duration
	SessionMaxLife time.Duration
	// FilesMaxBytes bounds the bucket wire.FilesBucket (input objects, artifacts,
	// display images): past it, an artifact is not stored and its execution fails.
	// Zero means DefaultFilesMaxBytes.
	FilesMaxBytes int64
	// TenantFilesMaxBytes bounds each tenant's bucket (wire.TenantFilesBucket), which
	// holds its executions' artifacts and display images: past it, an artifact of the
	// tenant is not stored and its execution fails as artifact_limit, and no other
	// tenant's is touched. Zero means DefaultTenantFilesBytes.
	TenantFilesMaxBytes int64
	// MaxScriptBytes bounds a job's script; zero means wire.DefaultMaxScriptBytes.
	MaxScriptBytes int
	// DefaultTimeout and DefaultMaxOutputBytes apply to jobs that set none; zero
	// means DefaultExecutionTimeout and DefaultMaxOutputBytes.
	DefaultTimeout        time.Duration
	DefaultMaxOutputBytes int64
	// LivenessTTL is how long a worker counts as alive after its last heartbeat in
	// BucketWorkers; zero means DefaultLivenessTTL.
	LivenessTTL time.Duration
	// UnservedGrace is how long the jobs and sessions streams keep taking the jobs
	// and calls of a sandbox that no live worker serves any more (they queue for the
	// next worker that does): past it, a publish for the sandbox is refused (see
	// served.go). Zero means DefaultUnservedGrace.
	UnservedGrace time.Duration
	// Logger receives the worker's logs; nil means slog.Default().
	Logger *slog.Logger
	// TracerProvider, MeterProvider and Propagator are OpenTelemetry's; nil means
	// otel's globals (no-ops until set). Jobs continue the trace context they carry.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
}

func (c *Config) setDefaults() {
	if c.WorkerID == "" && c.Pool != nil {
		c.WorkerID = c.Pool.WorkerID()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.AckWait, DefaultAckWait)
	def(&c.Heartbeat, DefaultHeartbeat)
	def(&c.NakDelay, DefaultNakDelay)
	def(&c.EventsMaxAge, DefaultEventsMaxAge)
	def(&c.DuplicateWindow, DefaultDuplicateWindow)
	def(&c.DefaultTimeout, DefaultExecutionTimeout)
	def(&c.LivenessTTL, DefaultLivenessTTL)
	def(&c.UnservedGrace, DefaultUnservedGrace)
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.MaxBacklog == 0 {
		c.MaxBacklog = DefaultMaxBacklog
	}
	if c.TenantBacklog == 0 {
		c.TenantBacklog = DefaultTenantBacklog
	}
	def(&c.SessionIdleTTL, DefaultSessionIdleTTL)
	def(&c.SessionMaxLife, DefaultSessionMaxLife)
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	for i := range c.Sandboxes {
		if c.Sandboxes[i].MaxSessions == 0 {
			c.Sandboxes[i].MaxSessions = DefaultSandboxSessions
		}
		if c.Sandboxes[i].TenantSessions == 0 {
			c.Sandboxes[i].TenantSessions = tenantShare(c.Sandboxes[i].MaxSessions)
		}
	}
	if c.FilesMaxBytes == 0 {
		c.FilesMaxBytes = DefaultFilesMaxBytes
	}
	if c.TenantFilesMaxBytes == 0 {
		c.TenantFilesMaxBytes = DefaultTenantFilesBytes
	}
	if c.MaxBacklogBytes == 0 {
		c.MaxBacklogBytes = DefaultMaxBacklogBytes
	}
	if c.MaxScriptBytes == 0 {
		c.MaxScriptBytes = wire.DefaultMaxScriptBytes
	}
	if c.DefaultMaxOutputBytes == 0 {
		c.DefaultMaxOutputBytes = DefaultMaxOutputBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for i := range c.Sandboxes {
		if c.Sandboxes[i].MaxAckPending == 0 {
			c.Sandboxes[i].MaxAckPending = c.Sandboxes[i].Slots
		}
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.NATS == nil {
		errs = append(errs, errors.New("Config.NATS is nil"))
	}
	if c.Pool == nil {
		errs = append(errs, errors.New("Config.Pool is nil"))
	}
	if c.WorkerID == "" || strings.ContainsAny(c.WorkerID, " .*>") {
		errs = append(errs, fmt.Errorf("worker id %q must be non-empty without spaces, '.', '*' or '>'", c.WorkerID))
	}
	if len(c.Sandboxes) == 0 {
		errs = append(errs, errors.New("no sandboxes to serve"))
	}
	seen := map[string]bool{}
	for _, sb := range c.Sandboxes {
		if err := wire.ValidateID("sandbox", sb.Name); err != nil {
			errs = append(errs, err)
		}
		if seen[sb.Name] {
			errs = append(errs, fmt.Errorf("sandbox %q is listed twice", sb.Name))
		}
		seen[sb.Name] = true
		if sb.Slots < 1 || sb.MaxAckPending < 1 {
			errs = append(errs, fmt.Errorf("sandbox %q: slots (%d) and max ack pending (%d) must be at least 1", sb.Name, sb.Slots, sb.MaxAckPending))
		}
	}
	if c.Heartbeat >= c.AckWait {
		errs = append(errs, fmt.Errorf("heartbeat %v must be shorter than ack wait %v", c.Heartbeat, c.AckWait))
	}
	if c.MaxDeliver < 1 {
		errs = append(errs, fmt.Errorf("max deliver %d must be at least 1", c.MaxDeliver))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker: invalid config: %w", err)
	}
	return nil
}

// NewWorkerID returns an id for this process: host name, process id and a random
// suffix, so that a restarted worker never takes over its predecessor's containers.
func NewWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, host)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), nuidSuffix())
}

func nuidSuffix() string {
	id := nuid.Next()
	return id[len(id)-6:]
}

// sandbox returns the sandbox of that name this worker serves (the zero Sandbox when
// none).
func (c *Config) sandbox(name string) Sandbox {
	for _, sb := range c.Sandboxes {
		if sb.Name == name {
			return sb
		}
	}
	return Sandbox{}
}

// tenantShare is the most of n sessions one tenant may hold: half, at least one.
func tenantShare(n int) int { return max(1, n/2) }
