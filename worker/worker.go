package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jazzmine/worker/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrStopped is returned by Start after Shutdown.
var ErrStopped = errors.New("worker: stopped")

// Worker pulls jobs from JetStream, runs them in the pool's containers and publishes
// their events. For each sandbox it runs one pull loop per container slot; a loop asks
// for exactly one job, and only while its slot is free. It is the assembly of its
// parts, each a type and a file: the producer (pull loops), the processor (a
// delivery to its end), the canceller (the cancel protocol), triage (jobs no worker
// serves), liveness, and the background work of cancels and triage.
type Worker struct {
	cfg Config
	log *slog.Logger
	js  jetstream.JetStream
	tel *telemetry

	events   *events     // StreamEvents: publishers and ends (events.go)
	producer *producer   // the pull loops (producer.go)
	proc     *processor  // one delivery to its end (job.go, ended.go)
	cancels  *canceller  // BucketCancels and the cancel protocol (cancel.go)
	triage   *triage     // jobs for sandboxes no worker serves (triage.go)
	live     *liveness   // BucketWorkers and BucketFleet (liveness.go)
	replays  *replayer   // tenants' events published again (replay.go)
	bg       *background // cancels', triage's and replays' work (background.go)
	files    *files      // wire.FilesBucket: input files and artifacts (files.go)
	sessions *sessions   // StreamSessions, BucketSessions: sessions (session.go)
	catalog  *catalog    // wire.SandboxesBucket: the sandbox catalog (catalog.go)
	gates    *gates      // the pending sandboxes' loops held back (pending.go)

	mu      sync.Mutex // guards stopped
	stopped bool

	pulling     context.Context // ends when the worker stops taking jobs
	stopPulling context.CancelFunc
	subs        []*nats.Subscription
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
	w := &Worker{cfg: cfg, log: cfg.Logger, js: js, tel: tel}
	running := newRegistry()
	w.bg = newBackground(cfg.Logger)
	w.events = &events{js: js, nc: cfg.NATS, workerID: cfg.WorkerID}
	w.cancels = &canceller{nc: cfg.NATS, js: js, workerID: cfg.WorkerID, log: cfg.Logger, events: w.events, running: running, bg: w.bg}
	w.files = &files{js: js, bg: w.bg, rates: newTenantRates(chunkRate, chunkBurst)}
	w.proc = newProcessor(&w.cfg, tel, w.events, w.cancels, running, w.files)
	w.gates = newGates(cfg.Sandboxes)
	w.producer = newProducer(cfg.Sandboxes, w.gates, w.proc.handle, cfg.Logger)
	w.sessions = newSessions(&w.cfg, js, w.proc, w.events, w.gates)
	w.replays = newReplayer(cfg.NATS, w.events, w.bg, cfg.Logger)
	w.triage = newTriage(js, cfg.Sandboxes, w.events, w.bg, cfg.Logger)
	w.live = &liveness{id: cfg.WorkerID, ttl: cfg.LivenessTTL, log: cfg.Logger}
	w.catalog = &catalog{pool: cfg.Pool, gates: w.gates, sandboxes: cfg.Sandboxes, workerID: cfg.WorkerID, timeout: cfg.DefaultTimeout, log: cfg.Logger,
		bg: w.bg, rates: newTenantRates(catalogRate, catalogBurst), failed: map[string]string{}, toolErrors: map[string]string{}, kick: make(chan struct{}, 1)}
	w.pulling, w.stopPulling = context.WithCancel(context.Background())
	return w, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.WorkerID }

// Start creates or updates the streams, consumers and buckets, announces the worker
// as alive, subscribes to cancels and starts the pull loops. ctx bounds the setup
// only; the loops run until Shutdown.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	stopped := w.stopped
	w.mu.Unlock()
	if stopped {
		return ErrStopped
	}
	if err := w.ensureStreams(ctx); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := w.live.announce(ctx); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := w.subscribe(); err != nil {
		w.unsubscribe()
		return fmt.Errorf("worker: %w", err)
	}
	w.bg.start() // what the subscriptions queued meanwhile waits for it
	w.triage.sweepAll()
	w.live.keep(w.pulling)
	w.catalog.keep(w.pulling)
	w.producer.start(w.pulling)
	w.sessions.start(w.pulling)
	w.log.Info("worker started", "sandboxes", len(w.cfg.Sandboxes))
	return nil
}

// subscribe subscribes the cancel protocol, triage, replays and tenants' chunk and
// catalog requests in the fleet's queue groups (one worker each message), and the
// answer for running executions on every worker.
func (w *Worker) subscribe() error {
	nc := w.cfg.NATS
	for _, s := range []struct {
		subject, queue string
		handler        nats.MsgHandler
	}{
		{cancelAll, groupCancel, w.cancels.coordinate},
		{subjectRunning + ">", "", w.cancels.answerRunning},
		{execAll, groupTriage, w.triage.see},
		{wire.SessionWildcard, groupTriage, w.triage.seeSession},
		{tenantSessionAll, groupTriage, w.triage.seeSession},
		{replayAll, groupReplay, w.replays.see},
		{filesAll, groupFiles, w.files.see},
		{sandboxesAll, groupSandboxes, w.catalog.serveTenants},
	} {
		var sub *nats.Subscription
		var err error
		if s.queue != "" {
			sub, err = nc.QueueSubscribe(s.subject, s.queue, s.handler)
		} else {
			sub, err = nc.Subscribe(s.subject, s.handler)
		}
		if err != nil {
			return err
		}
		w.subs = append(w.subs, sub)
	}
	return nc.Flush()
}

// Shutdown stops taking jobs, lets running ones finish for the grace period, then
// stops them and waits (until ctx ends) for the events of those that finished to be
// published and their acks sent; a job it stopped goes back to the queue (nak) for
// another worker, with no script_done of this attempt. It stops the worker's
// subscriptions and background work and withdraws its liveness key. It does not
// close the pool or the NATS connection. It is safe to call more than once.
func (w *Worker) Shutdown(ctx context.Context, grace time.Duration) error {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.stopPulling()
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
	w.unsubscribe()
	w.bg.close()
	w.catalog.stop()
	if w.tel.reg != nil {
		_ = w.tel.reg.Unregister()
	}
	w.live.withdraw(ctx)
	return err
}

func (w *Worker) unsubscribe() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	w.subs = nil
}

// finished is closed when the pull loops and the jobs they run, and the sessions and
// their calls, have ended. Sessions end once their running call has (their later
// calls get session_lost).
func (w *Worker) finished() <-chan struct{} {
	jobs := w.producer.done()
	done := make(chan struct{})
	go func() {
		w.sessions.stop()
		<-jobs
		close(done)
	}()
	return done
}
