package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/worker"
)

// TestTheReaperRemovesOnlyContainersOfDeadWorkersOfItsOwnFleet asks WorkerAlive, the
// reaper's question, about a live worker, a worker of the fleet that shut down, and a
// worker this NATS deployment never knew (another fleet's, sharing the Docker host):
// only the one that shut down may lose its containers.
func TestTheReaperRemovesOnlyContainersOfDeadWorkersOfItsOwnFleet(t *testing.T) {
	_, nc := testenv.NATS(t)
	live := startWorker(t, nc, 1, 0, nil)
	gone := startWorker(t, nc, 1, 0, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := gone.Shutdown(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	alive := worker.WorkerAlive(js)
	for _, tc := range []struct {
		name, id string
		want     bool
	}{
		{"a live worker is alive", live.ID(), true},
		{"a worker of the fleet that shut down is dead", gone.ID(), false},
		{"a worker of another fleet counts as alive", "another-fleets-worker-1234-abcdef", true},
		{"a pool's id that is no valid key counts as alive", "bench-fork+reset-1234", true},
	} {
		got, err := alive(ctx, tc.id)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: WorkerAlive(%s) = %v, want %v", tc.name, tc.id, got, tc.want)
		}
	}
}
