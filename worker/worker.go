package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// ErrStopped is returned by Start after Shutdown.
var ErrStopped = errors.New("worker: stopped")

// Worker pulls jobs from JetStream, runs them in the pool's containers and publishes
// their events. For each sandbox it runs one pull loop per container slot; a loop asks
// for exactly one job, and only while its slot is free. It is the assembly of its
// parts, each a type and a file, built in Start once the fleet's streams, buckets and
// consumers are made (topology.go): the producer (pull loops), the processor (a
// delivery to its end), the canceller (the cancel protocol), sessions, liveness and
// the streams' served subjects, the catalog, the tenants' events consumers (source.go)
// and the background work of cancels and tenants' requests. Those that run are services, started in order and stopped in reverse.
type Worker struct {
	cfg   Config
	log   *slog.Logger
	js    jetstream.JetStream
	tel   *telemetry
	gates *gates // the pending sandboxes' loops held back, and the failed (pending.go)

	mu       sync.Mutex // guards what follows
	stopped  bool
	services []service          // in start order; nil until Start succeeded
	stopRun  context.CancelFunc // ends the services' loops
	proc     *processor         // one delivery to its end (job.go)
	producer *producer          // the pull loops (producer.go)
	sessions *sessions          // sessions (session.go, opener.go)
}

// service is a part of the worker that runs.
type service interface {
	// start does the part's setup, within setup's deadline; its loops run until run
	// ends.
	start(setup, run context.Context) error
	// stop waits for the loops to end, once run has, and releases what start took.
	stop(ctx context.Context)
}

// New validates cfg and returns a Worker; Start starts it.
func New(cfg Config) (*Worker, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// An event whose ack never comes (the server that took it died) fails after the
	// limit, instead of staying among nats.go's pending acks for good.
	js, err := jetstream.New(cfg.NATS, jetstream.WithPublishAsyncTimeout(DefaultEventPublishLimit))
	if err != nil {
		return nil, fmt.Errorf("worker: jetstream: %w", err)
	}
	tel, err := newTelemetry(&cfg)
	if err != nil {
		return nil, fmt.Errorf("worker: telemetry: %w", err)
	}
	return &Worker{cfg: cfg, log: cfg.Logger, js: js, tel: tel, gates: newGates(cfg.Sandboxes)}, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.WorkerID }

// Start creates or updates the streams, consumers and buckets, builds the parts and
// starts them: liveness, background work, subscriptions, the catalog, the pull loops
// and the session openers. ctx bounds the setup only; the loops run until Shutdown.
// A Start that failed may be called again.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return ErrStopped
	}
	if w.services != nil {
		return errors.New("worker: started already")
	}
	topo, err := makeTopology(ctx, w.js, &w.cfg)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	services := w.assemble(topo)
	run, stopRun := context.WithCancel(context.Background())
	for i, s := range services {
		if err := s.start(ctx, run); err != nil {
			stopRun()
			for _, started := range slices.Backward(services[:i]) {
				started.stop(ctx)
			}
			return fmt.Errorf("worker: %w", err)
		}
	}
	w.services, w.stopRun = services, stopRun
	w.log.Info("worker started", "sandboxes", len(w.cfg.Sandboxes))
	return nil
}

// assemble builds the parts on topo, and returns the services in start order.
func (w *Worker) assemble(topo *topology) []service {
	c := &w.cfg
	running := newRegistry()
	bg := newBackground(c.Logger)
	ev := &events{js: w.js, nc: c.NATS, stream: topo.events, workerID: c.WorkerID}
	cancels := &canceller{nc: c.NATS, js: w.js, kv: topo.cancels, workerID: c.WorkerID, log: c.Logger, events: ev, running: running, bg: bg}
	fs := &files{js: w.js, store: topo.files, tenantCfg: topo.tenantFiles, bg: bg, rates: newTenantRates(chunkRate, chunkBurst)}
	src := newSourcer(w.js, c.Replicas, bg, c.Logger)
	w.proc = newProcessor(c, w.tel, ev, cancels, running, fs, src)
	w.producer = newProducer(c.Sandboxes, topo.jobs, w.gates, w.proc.handle, c.Logger)
	w.sessions = newSessions(c, w.js, topo, w.proc, ev, w.gates)
	live := &liveness{workers: topo.workers, fleet: topo.fleet, id: c.WorkerID, ttl: c.LivenessTTL, log: c.Logger,
		served: newServed(w.js, topo, ev, c)}
	cat := &catalog{kv: topo.sandboxes, pool: c.Pool, gates: w.gates, sandboxes: c.Sandboxes, workerID: c.WorkerID, timeout: c.DefaultTimeout, log: c.Logger,
		bg: bg, rates: newTenantRates(catalogRate, catalogBurst), toolErrors: map[string]string{}}
	subs := &subscriptions{nc: c.NATS, list: []subscription{
		{cancelAll, groupCancel, cancels.coordinate},
		{subjectRunning + ">", "", cancels.answerRunning},
		{sourceAll, groupSource, src.serve},
		{filesAll, groupFiles, fs.see},
		{sandboxesAll, groupSandboxes, cat.serveTenants},
		{wire.SubjectSandboxes, groupSandboxes, cat.serveFleet},
	}}
	return []service{live, bg, subs, cat, w.producer, w.sessions}
}

// Serve starts taking the jobs and session calls of a pending sandbox (see
// Sandbox.Pending), which the pool now has. Serving a sandbox that serves already
// does nothing.
func (w *Worker) Serve(sandbox string) error {
	if err := w.gates.serve(sandbox); err != nil {
		return err
	}
	w.gates.recover(sandbox)
	w.log.Info("sandbox serving", "sandbox", sandbox)
	return nil
}

// Unavailable reports a pending sandbox that this worker cannot serve (yet): its
// image could not be built, or the pool could not take it. Its jobs and sessions
// stay in their streams for a worker that serves it, and the catalog says why (the
// first line of reason), unless another worker serves it (see catalog.putUnserved),
// until Serve names it.
func (w *Worker) Unavailable(sandbox string, reason error) {
	w.gates.fail(sandbox, reason.Error())
}

// subscriptions are the worker's core NATS subscriptions: the cancel protocol,
// and tenants' source, chunk and catalog requests in the fleet's queue groups (one
// worker each message), and the answer for running executions on every worker.
type subscriptions struct {
	nc   *nats.Conn
	list []subscription
	subs []*nats.Subscription
}

// subscription is a subject, its queue group ("" for every worker) and its handler.
type subscription struct {
	subject, queue string
	handler        nats.MsgHandler
}

func (s *subscriptions) start(_, _ context.Context) error {
	for _, sub := range s.list {
		var ns *nats.Subscription
		var err error
		if sub.queue != "" {
			ns, err = s.nc.QueueSubscribe(sub.subject, sub.queue, sub.handler)
		} else {
			ns, err = s.nc.Subscribe(sub.subject, sub.handler)
		}
		if err != nil {
			s.stop(context.Background())
			return err
		}
		s.subs = append(s.subs, ns)
	}
	if err := s.nc.Flush(); err != nil {
		s.stop(context.Background()) // a Start tried again subscribes anew
		return err
	}
	return nil
}

func (s *subscriptions) stop(context.Context) {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
}

// Shutdown stops taking jobs, lets running ones finish for the grace period, then
// stops them and waits (until ctx ends) for the events of those that finished to be
// published and their acks sent; a job it stopped goes back to the queue (nak) for
// another worker, with no script_done of this attempt. It then stops the other
// services in the reverse order of their start: the catalog, the subscriptions, the
// background work and liveness, whose key it withdraws. It does not close the pool or
// the NATS connection. It is safe to call more than once.
func (w *Worker) Shutdown(ctx context.Context, grace time.Duration) error {
	w.mu.Lock()
	first := !w.stopped
	w.stopped = true
	services, stopRun := w.services, w.stopRun
	w.services = nil
	w.mu.Unlock()
	if services == nil { // never started, or stopped already
		if first {
			w.tel.unregister()
		}
		return nil
	}
	stopRun()
	finished := w.finished()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-finished:
	case <-timer.C:
		w.log.Warn("grace period over: handing running jobs back to the queue", "grace", grace)
		w.proc.stop()
	case <-ctx.Done():
		w.proc.stop()
	}
	var err error
	select {
	case <-finished:
	case <-ctx.Done():
		err = fmt.Errorf("worker: shutdown: %w", ctx.Err())
	}
	w.proc.stop()
	for _, s := range slices.Backward(services) {
		s.stop(ctx)
	}
	w.tel.unregister()
	return err
}

// finished is closed when the pull loops and the jobs they run, and the sessions and
// their calls, have ended. Sessions end once their running call has (their later
// calls get session_lost).
func (w *Worker) finished() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		w.sessions.stop(context.Background())
		w.producer.stop(context.Background())
		close(done)
	}()
	return done
}
