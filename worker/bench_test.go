package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	dockerclient "github.com/moby/moby/client"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/proc"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// The benchmarks of this file measure the same trivial work (a Python one-liner that
// returns a result) four ways, on the same machine in the same run:
//
//	BenchmarkEndToEnd    publish a job, wait for its script_done, through one worker
//	BenchmarkAgentPace   the same with more time between calls, default recycling
//	BenchmarkThroughput  the same from 1, 2, 4, 8 and 16 concurrent agents
//	BenchmarkDockerRun   docker run --rm of the sandbox image per call
//	BenchmarkDockerExec  docker exec into one long-lived container per call
//
// Each reports the median and p99 latency of one call; run them with make bench-e2e.

const trivial = "emit_result(1)"

// callGap is the pause, untimed, between one agent's calls in the latency benchmarks:
// an agent thinks between tool calls, and the harness uses such a pause to fork and
// warm up the next child. Back to back, one agent's calls measure throughput instead:
// BenchmarkThroughput with agents=1.
const callGap = 5 * time.Millisecond

// BenchmarkEndToEnd runs with the default pool size (2), with containers recycled at
// the default max uses and never.
func BenchmarkEndToEnd(b *testing.B) {
	b.Run("pool=2", func(b *testing.B) { endToEnd(b, 2, benchMaxUses, callGap) })
	b.Run("pool=2-no-recycling", func(b *testing.B) { endToEnd(b, 2, 1<<30, callGap) })
}

// BenchmarkAgentPace is BenchmarkEndToEnd's default recycling with more time between
// one agent's calls. A container is replaced after max uses, so the agent's pace
// sets how often a spawn (~0.4 s of the machine's CPU) runs beside its calls.
func BenchmarkAgentPace(b *testing.B) {
	for _, gap := range []time.Duration{25 * time.Millisecond, 100 * time.Millisecond} {
		b.Run(fmt.Sprintf("gap=%v", gap), func(b *testing.B) { endToEnd(b, 2, benchMaxUses, gap) })
	}
}

func endToEnd(b *testing.B, pool, maxUses int, gap time.Duration) {
	_, nc := testenv.NATS(b)
	startWorkerWith(b, nc, pool, 0, maxUses, nil)
	c := newClient(b, nc)
	ctx := context.Background()
	run(b, ctx, c, 3) // warm up
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		b.StopTimer()
		time.Sleep(gap)
		b.StartTimer()
		t0 := time.Now()
		run(b, ctx, c, 1)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	rate := float64(b.N) / time.Since(start).Seconds()
	testenv.ReportLatencyValues(b, "", lat, map[string]float64{"gap_ms": float64(gap.Milliseconds()), "calls_per_s": rate, "max_uses": float64(maxUses)})
}

// BenchmarkThroughput runs agents that each submit the trivial job and wait for its
// result, back to back, against one worker with a pool of 4, with containers never
// recycled; the last sub-benchmark has 8 agents and the default recycling, to show
// what recycling costs at this rate. Jobs that fail are counted, not
// fatal, and reported as errors.
func BenchmarkThroughput(b *testing.B) {
	for _, agents := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("agents=%d", agents), func(b *testing.B) { throughput(b, agents, 1<<30) })
	}
	b.Run("agents=8-default-recycling", func(b *testing.B) { throughput(b, 8, benchMaxUses) })
}

func throughput(b *testing.B, agents, maxUses int) {
	srv, nc := testenv.NATS(b)
	w := startWorkerWith(b, nc, 4, 0, maxUses, nil)
	c := newClient(b, nc)
	ctx := context.Background()
	run(b, ctx, c, 4)
	// CPU by process around the load: this process (the agents, the embedded NATS
	// server and the worker: the Go side), the Docker engine's, the containers'.
	self0, engine0, ctrs0 := testenv.SelfCPU(), testenv.ProcessCPU(engineProcesses...), workerCPU(b, w.ID())
	msgs0 := serverMsgs(b, srv)
	lat, errs, elapsed := agentLoad(b, ctx, c, agents)
	self, engine, ctrs := testenv.SelfCPU()-self0, testenv.ProcessCPU(engineProcesses...)-engine0, workerCPU(b, w.ID())-ctrs0
	msgs := serverMsgs(b, srv) - msgs0
	rate := float64(len(lat)) / elapsed.Seconds()
	perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	// What the same messages cost with nats.go alone (floor (b): the server and both
	// clients, in this process), per round trip, for the Go side's ratio.
	floor := testenv.NewNATSFloor(b, srv.ClientURL())
	runtime.GC() // the load's garbage is not the floor's
	floorCPU0 := testenv.SelfCPU()
	for range 1000 {
		floor.RoundTrip(b)
	}
	natsFloor := float64((testenv.SelfCPU() - floorCPU0).Microseconds()) / 1000 / 1000
	// And the job's whole pattern with nats.go alone (the cancel look-up and three
	// acked events too): the Go side's aim is at most 1.5x of it.
	pattern := testenv.NewJobPatternFloor(b, srv.ClientURL())
	runtime.GC()
	patternCPU0, patternMsgs0 := testenv.SelfCPU(), serverMsgs(b, srv)
	for range 1000 {
		pattern.RoundTrip(b)
	}
	patternFloor := float64((testenv.SelfCPU() - patternCPU0).Microseconds()) / 1000 / 1000
	patternMsgs := float64(serverMsgs(b, srv)-patternMsgs0) / 1000
	b.ReportMetric(rate, "jobs/s")
	b.ReportMetric(float64(errs), "errors")
	b.ReportMetric(perJob(self), "go-side-cpu-ms/job")
	b.ReportMetric(perJob(engine), "docker-engine-cpu-ms/job")
	b.ReportMetric(perJob(ctrs), "container-cpu-ms/job")
	b.ReportMetric(natsFloor, "nats-floor-cpu-ms/op")
	b.ReportMetric(patternFloor, "job-pattern-cpu-ms/op")
	b.ReportMetric(perJob(self)/patternFloor, "go-side/job-pattern")
	b.ReportMetric(float64(msgs)/float64(b.N), "server-msgs/job")
	b.ReportMetric(patternMsgs, "server-msgs/pattern")
	testenv.ReportLatencyValues(b, "", lat, map[string]float64{"jobs_per_s": rate, "agents": float64(agents), "errors": float64(errs), "max_uses": float64(maxUses),
		"go_side_cpu_ms_per_job": perJob(self), "docker_engine_cpu_ms_per_job": perJob(engine), "container_cpu_ms_per_job": perJob(ctrs), "nats_floor_cpu_ms": natsFloor, "job_pattern_cpu_ms": patternFloor,
		"server_msgs_per_job": float64(msgs) / float64(b.N), "server_msgs_per_pattern": patternMsgs})
}

// serverMsgs is the messages the NATS server has taken in and sent out, its own
// internal ones (JetStream's API, acks, stream stores) included.
func serverMsgs(b *testing.B, srv *server.Server) int64 {
	v, err := srv.Varz(nil)
	if err != nil {
		b.Fatal(err)
	}
	return v.InMsgs + v.OutMsgs
}

// engineProcesses are the Docker engine's processes, by the start of their command
// name: the daemon, containerd and the shims (containerd-shim), and the overlay
// filesystem (on this host, fuse-overlayfs); host-wide.
var engineProcesses = []string{"dockerd", "containerd", "fuse-overlayfs"}

// agentLoad runs b.N trivial jobs through c from agents goroutines at once, with the
// benchmark's timer running; it returns the latencies of the jobs that succeeded, how
// many failed, and the time the load took.
func agentLoad(b *testing.B, ctx context.Context, c *client.Client, agents int) (lat []time.Duration, errs int64, elapsed time.Duration) {
	var mu sync.Mutex
	var failed atomic.Int64
	jobs := make(chan struct{}, b.N)
	for range b.N {
		jobs <- struct{}{}
	}
	close(jobs)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range agents {
		wg.Go(func() {
			for range jobs {
				t0 := time.Now()
				res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: trivial})
				d := time.Since(t0)
				if err != nil || !res.Success {
					failed.Add(1)
					continue
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed = time.Since(start)
	b.StopTimer()
	return lat, failed.Load(), elapsed
}

func BenchmarkDockerRun(b *testing.B) {
	img := testenv.SandboxImage(b).Tag
	lat := make([]time.Duration, 0, b.N)
	for range b.N {
		t0 := time.Now()
		out, err := exec.Command("docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", img, "-c", "print(1)").CombinedOutput()
		lat = append(lat, time.Since(t0))
		if err != nil || string(out) != "1\n" {
			b.Fatalf("docker run: %v %q", err, out)
		}
	}
	testenv.ReportLatency(b, "", lat)
}

func BenchmarkDockerExec(b *testing.B) {
	img := testenv.SandboxImage(b).Tag
	out, err := exec.Command("docker", "run", "-d", "--rm", "--network", "none", "--label", "jazzmine.managed=true", "--label", "jazzmine.worker=bench-exec",
		"--entrypoint", "sleep", img, "600").Output()
	if err != nil {
		b.Fatal(err)
	}
	id := string(out[:12])
	b.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", id).Run() })
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		out, err := exec.Command("docker", "exec", id, "python3", "-c", "print(1)").CombinedOutput()
		lat = append(lat, time.Since(t0))
		if err != nil || string(out) != "1\n" {
			b.Fatalf("docker exec: %v %q", err, out)
		}
	}
	b.StopTimer()
	testenv.ReportLatency(b, "", lat)
}

func newClient(b testing.TB, nc *nats.Conn) *client.Client {
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func run(b testing.TB, ctx context.Context, c *client.Client, n int) {
	for range n {
		res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: trivial})
		if err != nil || !res.Success {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
}

// toggleSampler samples every span while on, none while off.
type toggleSampler struct{ on atomic.Bool }

func (s *toggleSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if s.on.Load() {
		return sdktrace.AlwaysSample().ShouldSample(p)
	}
	return sdktrace.NeverSample().ShouldSample(p)
}

func (s *toggleSampler) Description() string { return "toggle" }

// BenchmarkTracingCost measures what tracing adds to the end-to-end benchmark: one
// worker whose spans (and the agent's) are recorded and batched to an exporter that
// drops them in the "on" rounds, and not sampled in the "off" rounds. Rounds of 100
// jobs alternate, so that both see the same machine; it reports both medians and
// their ratio.
func BenchmarkTracingCost(b *testing.B) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	b.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	sampler := &toggleSampler{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, nc := testenv.NATS(b)
	startWorker(b, nc, 2, 0, func(c *worker.Config) { c.TracerProvider = tp; c.Propagator = propagation.TraceContext{} })
	c := newClient(b, nc)
	agent := tp.Tracer("agent")
	run(b, context.Background(), c, 3)
	var on, off []time.Duration
	b.ResetTimer()
	for i := range b.N {
		traced := (i/100)%2 == 1
		sampler.on.Store(traced)
		t0 := time.Now()
		ctx, span := agent.Start(context.Background(), "tool call")
		run(b, ctx, c, 1)
		span.End()
		if d := time.Since(t0); traced {
			on = append(on, d)
		} else {
			off = append(off, d)
		}
	}
	b.StopTimer()
	slices.Sort(on)
	slices.Sort(off)
	if len(on) > 0 && len(off) > 0 {
		mOn, mOff := on[len(on)/2], off[len(off)/2]
		b.ReportMetric(float64(mOff.Microseconds())/1000, "off-median-ms")
		b.ReportMetric(float64(mOn.Microseconds())/1000, "on-median-ms")
		b.ReportMetric(float64(mOn)/float64(mOff), "on/off")
	}
}

// BenchmarkMemory starts `worker serve` as its own process with two sandboxes of two
// warm containers each, runs jobs on both, and reports the worker's resident size and
// each idle container's memory (Docker's stats: the cgroup's usage, and its anonymous
// memory). The worker talks to the test's NATS server (nats=external), or runs its
// embedded one (nats=embedded, as make run does), whose memory then counts as the
// worker's. Run it with -benchtime 1x.
func BenchmarkMemory(b *testing.B) {
	b.Run("nats=external", func(b *testing.B) { memory(b, false) })
	b.Run("nats=embedded", func(b *testing.B) { memory(b, true) })
}

func memory(b *testing.B, embedded bool) {
	tools := filepath.Join(testenv.RepoRoot(), "examples", "tools", "*.py")
	cfg := filepath.Join(b.TempDir(), "config.yaml")
	sandbox := fmt.Sprintf("{tools: [%q], pool: {size: 2, max_overflow: 0}}", tools)
	if err := os.WriteFile(cfg, []byte("sandboxes:\n  default: "+sandbox+"\n  second: "+sandbox+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	id := fmt.Sprintf("bench-memory-%d", time.Now().UnixNano())
	var pid int
	var nc *nats.Conn
	var logs func() string
	if embedded {
		addr := freeAddr(b)
		cmd := exec.Command(workerBinary(b), "serve", "--config", cfg, "--worker-id", id, "--metrics-addr", "", "--nats-listen", addr, "--store-dir", b.TempDir())
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "NATS_URL=") {
				env = append(env, kv)
			}
		}
		cmd.Env = env
		log, _ := startChild(b, cmd, func() { testenv.RemoveContainersOf(b, id) })
		pid, logs = cmd.Process.Pid, log.String
		var err error
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if nc, err = nats.Connect("nats://" + addr); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("the embedded NATS server never answered: %v\n%s", err, log.String())
			}
		}
		b.Cleanup(nc.Close)
	} else {
		var srv interface{ ClientURL() string }
		srv, nc = testenv.NATS(b)
		proc := startProcess(b, cfg, srv.ClientURL(), id)
		pid, logs = proc.cmd.Process.Pid, proc.log.String
	}
	c := newClient(b, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	for _, sb := range []string{"default", "second"} {
		// The worker builds the images it lacks, then creates the consumers.
		for {
			if _, err := js.Consumer(ctx, wire.StreamExec, wire.ConsumerName(sb)); err == nil {
				break
			}
			if ctx.Err() != nil {
				b.Fatalf("the worker never served sandbox %s:\n%s", sb, logs())
			}
			time.Sleep(100 * time.Millisecond)
		}
		for range 200 {
			res, err := c.Run(ctx, wire.Job{Sandbox: sb, Script: trivial})
			if err != nil || !res.Success {
				b.Fatalf("run on %s: %v %+v", sb, err, res)
			}
		}
	}
	time.Sleep(2 * time.Second) // returned containers reset, the worker settles
	b.ResetTimer()
	kb, err := proc.StatusKB(pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	values := map[string]float64{"worker_rss_mb": float64(kb) / 1024}
	ids := testenv.ContainersOf(b, id)
	if len(ids) != 4 {
		b.Fatalf("worker %s has %d containers, want 4", id, len(ids))
	}
	var usage, anon float64
	for i, cid := range ids {
		u, a := containerMemory(b, cid)
		values[fmt.Sprintf("container_%d_usage_mb", i+1)], values[fmt.Sprintf("container_%d_anon_mb", i+1)] = u, a
		usage, anon = usage+u, anon+a
	}
	values["container_mean_usage_mb"], values["container_mean_anon_mb"] = usage/4, anon/4
	b.StopTimer()
	for k, v := range values {
		b.ReportMetric(v, strings.ReplaceAll(k, "_", "-"))
	}
	testenv.Record(b, "", nil, values)
}

// containerMemory is a container's memory from Docker's stats, in MiB: the cgroup's
// usage (page cache included) and its anonymous memory (rss on cgroup v1, anon on v2).
func containerMemory(b *testing.B, id string) (usage, anon float64) {
	res, err := testenv.Docker(b).ContainerStats(context.Background(), id, dockerclient.ContainerStatsOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	var st container.StatsResponse
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		b.Fatal(err)
	}
	a, ok := st.MemoryStats.Stats["rss"]
	if !ok {
		a = st.MemoryStats.Stats["anon"]
	}
	return float64(st.MemoryStats.Usage) / (1 << 20), float64(a) / (1 << 20)
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
