package nats_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/internal/fakeengine"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/worker"
)

// simWorkerEnv, when set in the environment of this package's test binary, makes it
// one simulated worker instead of running tests: the variable holds the worker's
// simWorkerSpec as JSON (see TestMain and runSimWorker).
const simWorkerEnv = "JAZZMINE_SIM_WORKER"

// simWorkerSpec is what a simulated worker process is told.
type simWorkerSpec struct {
	URL, Seed, ID, Sandbox string
	// Workers is how many there are: each sandbox's MaxAckPending covers them all.
	Workers int
	// Sessions, when not zero, is its room for sessions (each a container of its own).
	Sessions int
}

// simWorkerReady is what a simulated worker prints once it serves.
const simWorkerReady = "jazzmine-sim-worker-ready\n"

// simSlots is each simulated worker's container slots.
const simSlots = 4

// startSimWorkers runs n workers of sandbox on url, each as a process of its own (this
// test binary, in simWorkerEnv's mode) whose pool runs simSlots containers on the
// engine in memory, and returns once each has started; they stop at the end of the
// benchmark.
func startSimWorkers(b *testing.B, url string, keys clusterKeys, sandbox string, n, sessions int) []*process {
	var procs []*process
	for i := range n {
		spec, err := json.Marshal(simWorkerSpec{URL: url, Seed: keys.worker, Sandbox: sandbox, Workers: n, Sessions: sessions,
			ID: fmt.Sprintf("sim-%s-%d-%d", sandbox, i, time.Now().UnixNano())})
		if err != nil {
			b.Fatal(err)
		}
		procs = append(procs, start(b, fmt.Sprintf("sim worker %d", i), time.Minute, []string{simWorkerEnv + "=" + string(spec)}, os.Args[0]))
	}
	for _, p := range procs {
		p.waitUntil(b, 3*time.Minute, p.name+" to start", func() bool { return strings.Contains(p.log.String(), simWorkerReady) })
	}
	return procs
}

// runSimWorker is a simulated worker process's life: it starts the worker its
// environment describes, says simWorkerReady on stdout, and serves until SIGTERM, or
// until the benchmark that started it is gone (killed, or past its -timeout: its
// cleanups then never run).
func runSimWorker() int {
	var spec simWorkerSpec
	if err := json.Unmarshal([]byte(os.Getenv(simWorkerEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "sim worker:", err)
		return 2
	}
	if err := serveSimWorker(spec); err != nil {
		fmt.Fprintln(os.Stderr, "sim worker:", err)
		return 1
	}
	return 0
}

func serveSimWorker(spec simWorkerSpec) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	parent := os.Getppid()
	go func() {
		for ctx.Err() == nil && os.Getppid() == parent {
			time.Sleep(time.Second)
		}
		stop()
	}()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nkey, err := nats.NkeyOptionFromSeed(spec.Seed)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(spec.URL, nkey, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	pool, err := sandboxpool.New(sandboxpool.Config{Docker: &fakeengine.Engine{}, WorkerID: spec.ID, Logger: log,
		Sandboxes: []sandboxpool.Sandbox{{Name: spec.Sandbox, Image: "fake", PoolSize: simSlots, MaxOverflow: spec.Sessions}}})
	if err != nil {
		return err
	}
	sb := worker.Sandbox{Name: spec.Sandbox, Slots: simSlots, MaxAckPending: spec.Workers * simSlots}
	cfg := worker.Config{NATS: nc, Pool: pool, WorkerID: spec.ID, Replicas: 3, Logger: log,
		MaxBacklog: 1_000_000, TenantBacklog: -1, Sandboxes: []worker.Sandbox{sb}}
	if spec.Sessions > 0 {
		cfg.Sandboxes[0].MaxSessions, cfg.Sandboxes[0].TenantSessions = spec.Sessions, spec.Sessions
		cfg.MaxSessions = 2 * spec.Sessions // a tenant holds at most half of them
	}
	w, err := worker.New(cfg)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := pool.Start(sctx); err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = pool.Close(ctx)
	}()
	// Each try bounded, as `worker serve` does: a cluster electing its leaders leaves
	// some requests unanswered.
	for {
		tctx, tcancel := context.WithTimeout(sctx, 10*time.Second)
		err := w.Start(tctx)
		tcancel()
		if err == nil {
			break
		}
		if !worker.Transient(err) || sctx.Err() != nil {
			return fmt.Errorf("start worker %s: %w", spec.ID, err)
		}
		time.Sleep(time.Second)
	}
	fmt.Print(simWorkerReady)
	<-ctx.Done()
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	return w.Shutdown(dctx, 10*time.Second)
}
