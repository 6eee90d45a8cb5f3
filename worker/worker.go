package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// ErrStopped is returned by Start after Shutdown.
var ErrStopped = errors.New("worker: stopped")

// Worker pulls jobs from JetStream, runs them in the pool's containers and publishes
// their events. For each sandbox it runs one pull loop per container slot; a loop asks
// for exactly one job, and only while its slot is free.
type Worker struct {
	cfg Config
	log *slog.Logger
	js  jetstream.JetStream
	tel *telemetry

	consumers    map[string]jetstream.Consumer // by sandbox, set by Start
	eventsStream jetstream.Stream              // StreamEvents, set by Start
	cancels      jetstream.KeyValue            // BucketCancels
	live         *liveness                     // BucketWorkers and BucketFleet (liveness.go)

	mu      sync.Mutex // guards running and stopped
	running map[string]*execution
	stopped bool

	bg *background // cancels and triage (background.go)

	pulling     context.Context // ends when the worker stops taking jobs
	stopPulling context.CancelFunc
	jobs        context.Context // parent of every running job; ended after the grace period
	stopJobs    context.CancelFunc
	loops       sync.WaitGroup // pull loops and the jobs they run
	subs        []*nats.Subscription
}

// execution is a job running on this worker.
type execution struct {
	cancel  context.CancelCauseFunc
	claimed bool // a cancel request reached it here; guarded by Worker.mu
}

// errCancelRequested and errShuttingDown are the causes of a running job's cancel.
var (
	errCancelRequested = errors.New("cancel requested")
	errShuttingDown    = errors.New("worker shutting down")
)

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
	w := &Worker{
		tel:       tel,
		cfg:       cfg,
		log:       cfg.Logger,
		js:        js,
		consumers: map[string]jetstream.Consumer{},
		running:   map[string]*execution{},
		bg:        newBackground(cfg.Logger),
		live:      &liveness{id: cfg.WorkerID, ttl: cfg.LivenessTTL, log: cfg.Logger},
	}
	w.pulling, w.stopPulling = context.WithCancel(context.Background())
	w.jobs, w.stopJobs = context.WithCancel(context.Background())
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
	w.live.keep(w.pulling)
	for _, sb := range w.cfg.Sandboxes {
		for range sb.Slots {
			w.loops.Add(1)
			go w.pull(sb.Name, w.consumers[sb.Name])
		}
	}
	w.log.Info("worker started", "sandboxes", len(w.cfg.Sandboxes))
	return nil
}

// pull is one container slot of a sandbox: it asks for one job, runs it to the end,
// then asks for the next, until the worker stops pulling.
func (w *Worker) pull(sandbox string, cons jetstream.Consumer) {
	defer w.loops.Done()
	for w.pulling.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchContext(w.pulling))
		if err != nil {
			if w.pulling.Err() != nil {
				return
			}
			w.log.Warn("fetch a job", "sandbox", sandbox, "err", err)
			select {
			case <-time.After(time.Second):
			case <-w.pulling.Done():
				return
			}
			continue
		}
		for msg := range batch.Messages() {
			w.handle(sandbox, msg)
		}
		if err := batch.Error(); err != nil && w.pulling.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			w.log.Debug("fetch ended", "sandbox", sandbox, "err", err)
		}
	}
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
	finished := make(chan struct{})
	go func() { w.loops.Wait(); close(finished) }()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-finished:
	case <-timer.C:
		w.log.Warn("grace period over: handing running jobs back to the queue", "grace", grace)
		w.cancelRunning(errShuttingDown)
		w.stopJobs()
	case <-ctx.Done():
		w.cancelRunning(errShuttingDown)
		w.stopJobs()
	}
	var err error
	select {
	case <-finished:
	case <-ctx.Done():
		err = fmt.Errorf("worker: shutdown: %w", ctx.Err())
	}
	w.stopJobs()
	w.unsubscribe()
	w.bg.close()
	if w.tel.reg != nil {
		_ = w.tel.reg.Unregister()
	}
	w.live.withdraw(ctx)
	return err
}

func (w *Worker) cancelRunning(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.running {
		e.cancel(cause)
	}
}

func (w *Worker) unsubscribe() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	w.subs = nil
}

func nuidSuffix() string {
	id := nuid.Next()
	return id[len(id)-6:]
}

// publishContext bounds the wait for the acks of an execution's events.
func (w *Worker) publishContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), DefaultEventPublishLimit)
}
