package worker_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// The benchmarks of this file measure the same trivial work (a Python one-liner that
// returns a result) four ways, on the same machine in the same run:
//
//	BenchmarkEndToEnd    publish a job, wait for its script_done, through one worker
//	BenchmarkThroughput  the same from 1, 2, 4, 8 and 16 concurrent agents
//	BenchmarkDockerRun   docker run --rm of the sandbox image per call
//	BenchmarkDockerExec  docker exec into one long-lived container per call
//
// Each reports the median and p99 latency of one call; run them with make bench-e2e.

const trivial = "emit_result(1)"

func BenchmarkEndToEnd(b *testing.B) {
	for _, pool := range []int{2, 4} {
		b.Run(fmt.Sprintf("pool=%d", pool), func(b *testing.B) { endToEnd(b, pool) })
	}
}

func endToEnd(b *testing.B, pool int) {
	_, nc := testenv.NATS(b)
	startWorker(b, nc, pool, 0, nil)
	c := newClient(b, nc)
	ctx := context.Background()
	run(b, ctx, c, 3) // warm up
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		run(b, ctx, c, 1)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	testenv.ReportLatency(b, "", lat)
}

func BenchmarkThroughput(b *testing.B) {
	for _, agents := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("agents=%d", agents), func(b *testing.B) {
			_, nc := testenv.NATS(b)
			startWorker(b, nc, 4, 0, nil)
			c := newClient(b, nc)
			ctx := context.Background()
			run(b, ctx, c, 4)
			var mu sync.Mutex
			var lat []time.Duration
			jobs := make(chan struct{}, b.N)
			for range b.N {
				jobs <- struct{}{}
			}
			close(jobs)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for range agents {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range jobs {
						t0 := time.Now()
						run(b, ctx, c, 1)
						d := time.Since(t0)
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
			testenv.ReportLatency(b, "", lat)
		})
	}
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
