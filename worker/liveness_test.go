package worker_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
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

// TestAWorkerCutOffFromNATSKeepsItsContainersAndFinishesItsJob cuts a worker off from
// NATS for 20 s while it runs a job. Its liveness entry expires and a peer on the same
// Docker host takes it for dead, but not for long enough to remove its containers: the
// job finishes in its first attempt and its events arrive once the worker is back.
func TestAWorkerCutOffFromNATSKeepsItsContainersAndFinishesItsJob(t *testing.T) {
	srv, nc := testenv.NATS(t)
	link := testenv.NewLink(t, srv.Addr().String())
	cut, err := nats.Connect("nats://"+link.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cut.Close)
	fast := func(c *worker.Config) { c.LivenessTTL = 2 * time.Second }
	_, pool := startWorkerPool(t, cut, sandboxpool.Sandbox{PoolSize: 1}, nil, fast)
	a := newAgent(t, nc)
	id := newID("cutoff")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", TimeoutSec: 60,
		Script: "import time\ntime.sleep(25)\nemit_result('done')"})
	testenv.WaitFor(t, time.Minute, "the job to start on the worker to be cut off", func() bool { return find(a.allEvents(id), wire.EventStarted) != nil })
	// The peer: its reaper runs often and counts a worker dead at once; only the grace
	// (the default) stands between it and the cut-off worker's containers.
	startWorkerPool(t, nc, sandboxpool.Sandbox{PoolSize: 1}, func(c *sandboxpool.Config) { c.ReapMinAge, c.ReapInterval = time.Millisecond, 200*time.Millisecond }, fast)

	link.Cut()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	alive := worker.WorkerAlive(js)
	testenv.WaitFor(t, 30*time.Second, "the cut-off worker to be taken for dead", func() bool {
		ok, err := alive(context.Background(), pool.WorkerID())
		return err == nil && !ok
	})
	time.Sleep(15 * time.Second) // the rest of a 20 s partition, dozens of the peer's reaps
	if n := len(testenv.ContainersOf(t, pool.WorkerID())); n == 0 {
		t.Fatal("a peer removed the containers of a worker that was only cut off")
	}
	link.Restore()

	evs := a.events(id, time.Minute)
	if done := last(evs); !done.Success || done.FinalData != "done" {
		t.Errorf("the job: %s", describe(evs))
	}
	a.oneAttemptOneEnd(id)
}

// TestAWorkersBeatsKeepItAlive: a worker's liveness entry is refreshed at every beat
// (a third of its TTL), each beat's requests with five seconds of their own. With a
// beat longer than those five seconds, a worker whose beats took their time from the
// wait for the tick (as one did) found its requests' time gone when the tick came,
// refreshed nothing, and was taken for dead one TTL after it started.
func TestAWorkersBeatsKeepItAlive(t *testing.T) {
	_, nc := testenv.NATS(t)
	logs := &syncWriter{w: &bytes.Buffer{}}
	const ttl = 16500 * time.Millisecond // a beat of 5.5 s
	w := startBareWorker(t, nc, func(c *worker.Config) { c.LivenessTTL = ttl }, slog.New(slog.NewTextHandler(logs, nil)))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 3*time.Second)
	alive, err := worker.WorkerAlive(js)(t.Context(), w.ID())
	if err != nil {
		t.Fatal(err)
	}
	if !alive || strings.Contains(logs.String(), "refresh liveness") {
		t.Errorf("one TTL after its start the worker is alive: %v; its log:\n%s", alive, logs.String())
	}
}
