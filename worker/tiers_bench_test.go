package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	dockerclient "github.com/moby/moby/client"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// BenchmarkTiers measures the trivial job under each isolation tier in one run, so
// that runc (the host's kernel) and gVisor (runsc) are seen side by side on the same
// machine (make bench-tiers prints the table). Per tier, as sub-benchmarks:
//
//	latency  one agent, callGap between calls, a pool of 2: as BenchmarkEndToEnd
//	agents=8 eight agents back to back, a pool of 4: as BenchmarkThroughput
//	spawn    a cold container to its harness's ready line (one at a time)
//	memory   each warm container, idle, after jobs: its cgroup's usage (run with 1x)
//
// The first two also report the containers' CPU per job (Docker's stats: under
// gVisor its kernel's work is the container's), and neither recycles a container.
func BenchmarkTiers(b *testing.B) {
	for _, rt := range testenv.Runtimes {
		b.Run("runtime="+rt, func(b *testing.B) {
			testenv.RequireRuntime(b, rt)
			b.Run("latency", func(b *testing.B) { tierLatency(b, rt) })
			b.Run("agents=8", func(b *testing.B) { tierThroughput(b, rt, 8) })
			b.Run("spawn", func(b *testing.B) { tierSpawn(b, rt) })
			b.Run("memory", func(b *testing.B) { tierMemory(b, rt) })
		})
	}
}

// tierWorker starts a worker of the example sandbox under runtime, with pool warm
// containers never recycled, and returns the id its containers are labelled with.
func tierWorker(b *testing.B, runtime string, pool int) (*client.Client, string) {
	_, nc := testenv.NATS(b)
	id := fmt.Sprintf("bench-tiers-%s-%d", runtime, time.Now().UnixNano())
	startWorkerPool(b, nc, sandboxpool.Sandbox{PoolSize: pool, MaxUses: 1 << 30, Runtime: runtime}, func(c *sandboxpool.Config) { c.WorkerID = id }, nil)
	c := newClient(b, nc)
	run(b, context.Background(), c, 2*pool) // every container has run a job
	return c, id
}

func tierLatency(b *testing.B, runtime string) {
	c, id := tierWorker(b, runtime, 2)
	ctx := context.Background()
	cpu0 := workerCPU(b, id)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		time.Sleep(callGap)
		b.StartTimer()
		t0 := time.Now()
		run(b, ctx, c, 1)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	perJob := float64((workerCPU(b, id) - cpu0).Microseconds()) / 1000 / float64(b.N)
	b.ReportMetric(perJob, "container-cpu-ms/job")
	testenv.ReportLatencyValues(b, "", lat, map[string]float64{"container_cpu_ms_per_job": perJob})
}

func tierThroughput(b *testing.B, runtime string, agents int) {
	c, id := tierWorker(b, runtime, 4)
	ctx := context.Background()
	cpu0 := workerCPU(b, id)
	lat, errs, elapsed := agentLoad(b, ctx, c, agents)
	rate := float64(len(lat)) / elapsed.Seconds()
	perJob := float64((workerCPU(b, id) - cpu0).Microseconds()) / 1000 / float64(b.N)
	b.ReportMetric(rate, "jobs/s")
	b.ReportMetric(perJob, "container-cpu-ms/job")
	b.ReportMetric(float64(errs), "errors")
	testenv.ReportLatencyValues(b, "", lat, map[string]float64{"jobs_per_s": rate, "agents": float64(agents), "errors": float64(errs), "container_cpu_ms_per_job": perJob})
}

func tierSpawn(b *testing.B, runtime string) {
	img := testenv.SandboxImage(b)
	id := fmt.Sprintf("bench-tiers-spawn-%s-%d", runtime, time.Now().UnixNano())
	p, err := sandboxpool.New(sandboxpool.Config{Docker: testenv.Docker(b), WorkerID: id, Sandboxes: []sandboxpool.Sandbox{{
		Name: "cold", Image: img.Tag, Runtime: runtime, MaxOverflow: 1, MaxUses: 1, ReadyTimeout: time.Minute,
	}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = p.Close(ctx)
		testenv.RemoveContainersOf(b, id)
	})
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		l, err := p.Checkout(ctx, "cold")
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		l.Release() // its last use: removed
		b.StopTimer()
		for deadline := time.Now().Add(time.Minute); len(testenv.ContainersOf(b, id)) > 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("the spawned container was not removed")
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	testenv.ReportLatency(b, "", lat)
}

func tierMemory(b *testing.B, runtime string) {
	_, id := tierWorker(b, runtime, 2)
	time.Sleep(2 * time.Second) // the returned containers reset, their next children warm
	b.ResetTimer()
	ids := testenv.ContainersOf(b, id)
	var usage, anon float64
	for _, cid := range ids {
		u, a := containerMemory(b, cid)
		usage, anon = usage+u, anon+a
	}
	b.StopTimer()
	n := float64(len(ids))
	b.ReportMetric(usage/n, "container-usage-mb")
	b.ReportMetric(anon/n, "container-anon-mb")
	testenv.Record(b, "", nil, map[string]float64{"container_mean_usage_mb": usage / n, "container_mean_anon_mb": anon / n})
}

// workerCPU is the CPU time the worker's containers have used, from Docker's stats.
func workerCPU(b *testing.B, workerID string) time.Duration {
	var total time.Duration
	for _, id := range testenv.ContainersOf(b, workerID) {
		res, err := testenv.Docker(b).ContainerStats(context.Background(), id, dockerclient.ContainerStatsOptions{})
		if errdefs.IsNotFound(err) {
			continue // retired between the list and now (recycling): its CPU is not counted
		}
		if err != nil {
			b.Fatal(err)
		}
		var st container.StatsResponse
		err = json.NewDecoder(res.Body).Decode(&st)
		res.Body.Close()
		if err != nil {
			if _, ierr := testenv.Docker(b).ContainerInspect(context.Background(), id, dockerclient.ContainerInspectOptions{}); errdefs.IsNotFound(ierr) {
				continue // removed while its stats were read
			}
			b.Fatal(err)
		}
		total += time.Duration(st.CPUStats.CPUUsage.TotalUsage)
	}
	return total
}
