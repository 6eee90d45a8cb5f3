package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jazzmine/worker/client"
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
