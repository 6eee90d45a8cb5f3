package worker_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// BenchmarkCPUByProcess is BenchmarkThroughput's 8 agents (a pool of 4, never
// recycled) with each part a process of its own, so that the CPU a job splits by
// process: a nats-server process (JetStream, file storage), `worker serve` as
// production runs it (info log, metrics served), the agents (this process: the Go
// client), the Docker engine (dockerd, containerd, fuse-overlayfs) and the
// containers. Run it with -benchtime 2000x.
func BenchmarkCPUByProcess(b *testing.B) {
	url, natsPID := natsServerProcess(b)
	tools := filepath.Join(testenv.RepoRoot(), "examples", "tools", "*.py")
	cfg := filepath.Join(b.TempDir(), "config.yaml")
	sandbox := fmt.Sprintf("{tools: [%q], pool: {size: 4, max_overflow: 0, max_uses: 1000000000}}", tools)
	if err := os.WriteFile(cfg, []byte("sandboxes:\n  default: "+sandbox+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	id := fmt.Sprintf("bench-cpu-%d", time.Now().UnixNano())
	worker := exec.Command(workerBinary(b), "serve", "--config", cfg, "--worker-id", id, "--metrics-addr", "127.0.0.1:0")
	worker.Env = append(os.Environ(), "NATS_URL="+url)
	log, exited := startChild(b, worker, func() { testenv.RemoveContainersOf(b, id) })
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for {
		if _, err := js.Consumer(ctx, wire.StreamExec, wire.ConsumerName("default")); err == nil {
			break
		}
		select {
		case <-exited:
			b.Fatalf("the worker exited before it served:\n%s", log.String())
		case <-ctx.Done():
			b.Fatalf("the worker never served:\n%s", log.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	c := newClient(b, nc)
	run(b, ctx, c, 20) // every container warm
	cpu := func() [5]time.Duration {
		return [5]time.Duration{testenv.PIDCPU(natsPID), testenv.PIDCPU(worker.Process.Pid), testenv.SelfCPU(),
			testenv.ProcessCPU(engineProcesses...), workerCPU(b, id)}
	}
	before := cpu()
	lat, errs, elapsed := agentLoad(b, ctx, c, 8)
	after := cpu()
	values := map[string]float64{"jobs_per_s": float64(len(lat)) / elapsed.Seconds(), "errors": float64(errs), "agents": 8}
	for i, name := range []string{"nats_server", "worker", "agents", "docker_engine", "containers"} {
		perJob := float64((after[i] - before[i]).Microseconds()) / 1000 / float64(b.N)
		values[name+"_cpu_ms_per_job"] = perJob
		b.ReportMetric(perJob, strings.ReplaceAll(name, "_", "-")+"-cpu-ms/job")
	}
	b.ReportMetric(values["jobs_per_s"], "jobs/s")
	b.ReportMetric(float64(errs), "errors")
	testenv.ReportLatencyValues(b, "", lat, values)
}

// natsServerProcess runs nats-server (built from the module this repository
// requires) as a process of its own with JetStream on a free loopback port until the
// end of the benchmark, and returns its URL and pid once it accepts clients.
func natsServerProcess(b *testing.B) (url string, pid int) {
	addr := freeAddr(b)
	host, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command(testenv.StaticBinary(b, "github.com/nats-io/nats-server/v2"), "-js", "-a", host, "-p", port, "-sd", b.TempDir())
	log, _ := startChild(b, cmd, nil)
	url = "nats://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		nc, err := nats.Connect(url)
		if err == nil {
			nc.Close()
			return url, cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			b.Fatalf("nats-server never answered: %v\n%s", err, log.String())
		}
	}
}
