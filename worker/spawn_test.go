package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// TestASequentialAgentSpawnsNothingBeyondTheWarmSize sends 60 jobs back to back, each
// as soon as the last one ended, to a sandbox of one warm container and room for four
// more: each job arrives while the container of the last is still being reset, and
// waits for it rather than spawn a container (a second or more of CPU, memory held
// for the idle timeout) that would sit idle.
func TestASequentialAgentSpawnsNothingBeyondTheWarmSize(t *testing.T) {
	srv, nc := testenv.NATS(t)
	_, pool := startWorkerPool(t, nc, sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 4}, nil, nil)
	c, err := client.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := range 60 {
		res, err := c.Run(ctx, wire.Job{Script: "6 * 7"})
		if err != nil || !res.Success {
			t.Fatalf("job %d: %v %+v", i, err, res)
		}
	}
	if s := pool.Stats().Sandboxes["default"]; s.Spawned != 1 || s.CheckoutWaits == 0 {
		t.Errorf("%d containers spawned for 60 jobs one after another (%d checkouts waited), want the one warm", s.Spawned, s.CheckoutWaits)
	}
}

// BenchmarkSequentialAgent is the test above at the default pool (two warm, room for
// four more; never recycled) and b.N jobs: one agent sending the trivial job back to back, each as
// soon as the last ended. It reports the containers spawned beyond the warm size (the
// aim: none), and the jobs' latency.
func BenchmarkSequentialAgent(b *testing.B) {
	_, nc := testenv.NATS(b)
	warm := imagebuild.DefaultPoolSize
	overflow := imagebuild.DefaultMaxOverflow
	// Never recycled: a replacement after max_uses would count as a spawn.
	_, pool := startWorkerPool(b, nc, sandboxpool.Sandbox{PoolSize: warm, MaxOverflow: overflow, MaxUses: 1 << 30}, nil, nil)
	c := newClient(b, nc)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		run(b, ctx, c, 1)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	s := pool.Stats().Sandboxes["default"]
	beyond := float64(s.Spawned) - float64(warm)
	b.ReportMetric(beyond, "spawned-beyond-warm")
	b.ReportMetric(float64(s.CheckoutWaits), "checkout-waits")
	testenv.ReportLatencyValues(b, "", lat, map[string]float64{"spawned_beyond_warm": beyond, "warm": float64(warm), "overflow": float64(overflow), "checkout_waits": float64(s.CheckoutWaits)})
}
