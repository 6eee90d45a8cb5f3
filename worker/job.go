package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// processor runs the deliveries the producer hands it: each decoded, run in a
// container of the pool, its events published and stored, and its message acked,
// nakked or terminated. It registers the jobs it runs (registry) and honours the
// cancels that came while they were queued (canceller).
type processor struct {
	cfg     *Config
	log     *slog.Logger
	tel     *telemetry
	events  *events
	cancels *canceller
	running *registry
	files   *files
	sources *sourcer

	jobs     context.Context // parent of every job it runs; ended by stop
	stopJobs context.CancelFunc
}

func newProcessor(cfg *Config, tel *telemetry, ev *events, cancels *canceller, running *registry, fs *files, src *sourcer) *processor {
	pr := &processor{cfg: cfg, log: cfg.Logger, tel: tel, events: ev, cancels: cancels, running: running, files: fs, sources: src}
	pr.jobs, pr.stopJobs = context.WithCancel(context.Background())
	return pr
}

// stop hands the running jobs back to the queue: it cancels them (errShuttingDown)
// and ends the jobs context, which also ends what a job waits for after its run. It
// is safe to call more than once.
func (pr *processor) stop() {
	pr.running.cancelAll(errShuttingDown)
	pr.stopJobs()
}

// handle runs one delivery of a job to its end: events published and acknowledged by
// the events stream, then the job acked, nakked or terminated.
func (pr *processor) handle(sandbox string, msg jetstream.Msg) { pr.handleIn(sandbox, msg, nil) }

// runStep runs a job that is decoded, registered, not ended nor cancelled, and whose
// inputs are ready, to its outcome. The processor's own checks a container out of the
// pool, runs the job and finishes it; a session's call runs in its session's
// container instead (session.go).
type runStep func(ctx context.Context, job *wire.Job, inputs []harness.InputFile, p *publisher, ref execRef, attempt int, log *slog.Logger) (outcome, string)

// handleIn is handle, with step in place of the processor's own run when it is not
// nil; it returns what it did with the message.
func (pr *processor) handleIn(sandbox string, msg jetstream.Msg, step runStep) action {
	attempt := 1
	if meta, err := msg.Metadata(); err == nil {
		attempt = int(meta.NumDelivered)
	}
	last := attempt >= pr.cfg.MaxDeliver
	sbAttr := attribute.String("sandbox", sandbox)

	// The process span continues the agent's trace carried in the job's headers.
	ctx := pr.tel.prop.Extract(context.Background(), wire.HeaderCarrier(msg.Headers()))
	ctx, span := pr.tel.tracer.Start(ctx, msg.Subject()+" process",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", msg.Subject()),
			attribute.String("messaging.consumer.group.name", wire.ConsumerName(sandbox)),
			attribute.String("messaging.message.id", msg.Headers().Get(wire.HeaderMsgID)),
			attribute.String("jazzmine.sandbox", sandbox),
			attribute.Int("jazzmine.attempt", attempt),
		))
	defer span.End()
	log := pr.log.With("sandbox", sandbox, "attempt", attempt)
	if sc := span.SpanContext(); sc.IsValid() {
		log = log.With("trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String())
	}
	if attempt > 1 {
		pr.tel.redeliveries.Add(ctx, 1, metric.WithAttributes(sbAttr))
	}

	// Keep the job ours while it waits for a container and runs.
	stopBeat := pr.heartbeat(msg)
	out, reason := pr.process(ctx, sandbox, msg, attempt, last, log, step)
	stopBeat()

	act, delay := decide(out, last, pr.nakDelay(attempt))
	span.SetAttributes(attribute.String("jazzmine.outcome", out.String()), attribute.String("jazzmine.action", act.String()))
	if out == outInfrastructure || out == outInvalid || out == outUnstored {
		span.SetStatus(codes.Error, reason)
	}
	pr.tel.jobs.Add(ctx, 1, metric.WithAttributes(sbAttr, attribute.String("outcome", out.String()), attribute.String("action", act.String())))
	var err error
	switch act {
	case actAck:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = msg.DoubleAck(ctx)
		cancel()
	case actNak:
		err = msg.NakWithDelay(delay)
	case actTerm:
		err = msg.TermWithReason(reason)
	case actNone:
	}
	if err != nil {
		log.Warn("answer the job message", "action", act.String(), "err", err)
	}
	return act
}

// heartbeat tells the server the job is in progress every Heartbeat until stopped.
func (pr *processor) heartbeat(msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(pr.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// process decodes, validates and runs the job. It returns the outcome and, for a
// terminated job, the reason. Its steps: decode, then (unless an earlier attempt or
// a cancel ended the job) checkout, run and finish.
func (pr *processor) process(traced context.Context, sandbox string, msg jetstream.Msg, attempt int, last bool, log *slog.Logger, step runStep) (outcome, string) {
	job, ref, ct, err := decode(sandbox, msg, pr.cfg.MaxScriptBytes)
	if err == nil && ref.tenant != "" {
		err = refusedToTenants(pr.cfg.sandbox(sandbox))
	}
	if err != nil {
		return pr.invalid(traced, job, ref, ct, attempt, err, log)
	}
	pr.sources.ensureFor(ref.tenant) // the tenant's stream sources its events

	// Register first, then look for a cancel that came while the job was queued: a
	// cancel arriving in between finds the job registered (see cancel.go).
	ctx, cancel := context.WithCancelCause(pr.jobs)
	defer cancel(nil)
	ctx = trace.ContextWithSpan(ctx, trace.SpanFromContext(traced)) // cancelled with the worker, traced with the job
	ex := &execution{cancel: cancel}
	if !pr.running.register(ref.key(), ex) {
		// A redelivery of a job still running here: the running one answers for it.
		return outDuplicate, ""
	}
	defer pr.running.unregister(ref.key(), ex)
	p := pr.events.publisher(ref, attempt, ct, job.Metadata)
	p.traceFrom(ctx, pr.tel.prop)
	if out, reason, ok := pr.endedBefore(p, attempt, log); ok {
		return out, reason // ended by an earlier attempt, or delivered past the last (ended)
	}
	if handled, err := pr.cancels.cancelledWhileQueued(ctx, ref.key(), ex); err != nil {
		log.Warn("look up cancels", "execution_id", ref, "err", err)
	} else if handled {
		return pr.cancelledQueued(ctx, ref, ct, job.Metadata, log)
	}
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), errCancelRequested) {
		// Cancelled as it was taken (its cancel's entry said pending, cancel.go): it
		// ends without running, and a session call's session goes on (one cancelled
		// while it runs ends its session, as a kill does).
		return pr.endCancelled(ctx, p, log)
	}

	inputs, err := pr.files.inputs(ctx, ref, job, pr.cfg.sandbox(sandbox).MaxInputBytes)
	if err != nil {
		return pr.noInputs(ctx, p, sandbox, attempt, last, err, log)
	}
	if step != nil {
		return step(ctx, job, inputs, p, ref, attempt, log)
	}
	lease, err := pr.checkout(ctx, sandbox)
	if err != nil {
		return pr.noContainer(ctx, p, sandbox, attempt, last, err, log)
	}
	defer lease.Release()
	res, err := pr.run(ctx, lease, job, inputs, p, ref, attempt)
	// The container resets while the end is published: the agent that gets it and
	// sends its next job at once finds the container back, or coming back (the pool
	// waits for it rather than spawn another).
	lease.Release()
	if pr.handOver(ctx, ref, res, err, log) {
		return outHandedOver, ""
	}
	return pr.finish(ctx, p, res, err, log)
}

// invalid answers a job that decode refused: an invalid_job error and script_done
// under the id it owns, if any, and the job terminated with the reason.
func (pr *processor) invalid(traced context.Context, job *wire.Job, ref execRef, ct string, attempt int, err error, log *slog.Logger) (outcome, string) {
	log.Warn("invalid job", "execution_id", ref, "err", err)
	if ref.id != "" {
		var meta map[string]string
		if job != nil && wire.ValidateID("execution id", job.ExecutionID) == nil {
			meta = job.Metadata
		}
		p := pr.events.publisher(ref, attempt, ct, meta)
		p.traceFrom(traced, pr.tel.prop)
		if perr := p.terminal(wire.KindInvalidJob, err.Error()); perr != nil {
			log.Warn("publish the invalid job's error", "execution_id", ref, "err", perr)
		}
	}
	return outInvalid, truncateReason(err.Error())
}

// noInputs answers a job whose input files cannot be given to it: an input_file
// error when an object is missing or the files are too large, else (the object store
// failed) an infrastructure failure, retried like a missing container.
func (pr *processor) noInputs(ctx context.Context, p *publisher, sandbox string, attempt int, last bool, err error, log *slog.Logger) (outcome, string) {
	var ie *errInputFile
	if !errors.As(err, &ie) {
		return pr.failedBefore(ctx, p, attempt, last, "look up input files", err.Error(), log)
	}
	if perr := p.terminal(wire.KindInputFile, ie.msg); perr != nil {
		log.Warn("publish the input file error", "execution_id", p.ref, "err", perr)
		return outUnstored, truncateReason(ie.msg)
	}
	return outRan, ""
}

// checkout waits for a container of the sandbox, traced and measured.
func (pr *processor) checkout(ctx context.Context, sandbox string) (*sandboxpool.Lease, error) {
	cctx, cspan := pr.tel.tracer.Start(ctx, "checkout", trace.WithAttributes(attribute.String("jazzmine.sandbox", sandbox)))
	defer cspan.End()
	waitStart := time.Now()
	lease, err := pr.cfg.Pool.Checkout(cctx, sandbox)
	pr.tel.checkoutWait.Record(ctx, seconds(time.Since(waitStart)), metric.WithAttributes(attribute.String("sandbox", sandbox)))
	if err != nil {
		cspan.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	cspan.SetAttributes(attribute.String("jazzmine.container_id", lease.ContainerID()))
	return lease, nil
}

// noContainer answers a job that got no container (see failedBefore).
func (pr *processor) noContainer(ctx context.Context, p *publisher, sandbox string, attempt int, last bool, err error, log *slog.Logger) (outcome, string) {
	return pr.failedBefore(ctx, p, attempt, last, "checkout", fmt.Sprintf("no container for sandbox %q: %v", sandbox, err), log)
}

// failedBefore answers a job whose step (a checkout, the look-up of its input files)
// failed with msg before it ran: cancelled (or handed over) if its context ended,
// else an infrastructure failure, retried until the last delivery, which publishes
// the job's end.
func (pr *processor) failedBefore(ctx context.Context, p *publisher, attempt int, last bool, step, msg string, log *slog.Logger) (outcome, string) {
	if ctx.Err() != nil {
		return pr.endCancelled(ctx, p, log)
	}
	log.Warn(step+" failed", "execution_id", p.ref, "last_delivery", last, "err", msg)
	if last {
		if perr := p.terminal(wire.KindInfrastructure, fmt.Sprintf("gave up after %d deliveries: %s", attempt, msg)); perr != nil {
			log.Warn("publish terminal event", "execution_id", p.ref, "err", perr)
			return outUnstored, truncateReason(msg) // not terminated: the delivery after the last ends it (ended)
		}
	}
	return outInfrastructure, truncateReason(msg)
}

// run executes the job in the leased container, publishing its events as they come
// and storing its artifacts and display images.
func (pr *processor) run(ctx context.Context, lease *sandboxpool.Lease, job *wire.Job, inputs []harness.InputFile, p *publisher, ref execRef, attempt int) (*harness.Result, error) {
	sandbox := job.Sandbox
	_ = p.publish(&wire.Event{Type: wire.EventStarted, Sandbox: sandbox, ContainerID: lease.ContainerID()})
	req := harness.Request{
		ExecutionID:      job.ExecutionID,
		Script:           job.Script,
		Mode:             harness.Mode(job.Mode),
		Timeout:          time.Duration(job.TimeoutSec * float64(time.Second)),
		MaxOutputBytes:   job.MaxOutputBytes,
		RequiredSecrets:  job.RequiredSecrets,
		Files:            inputs,
		Artifacts:        job.Artifacts,
		MaxArtifacts:     job.MaxArtifacts,
		MaxArtifactBytes: job.MaxArtifactBytes,
		Session:          job.SessionID != "",
	}
	var unstored error // the first artifact or image the bucket did not take
	if req.Timeout <= 0 {
		req.Timeout = pr.cfg.DefaultTimeout
	}
	if req.MaxOutputBytes <= 0 {
		req.MaxOutputBytes = pr.cfg.DefaultMaxOutputBytes
	}
	ectx, espan := pr.tel.tracer.Start(ctx, "execute", trace.WithAttributes(
		attribute.String("jazzmine.execution_id", job.ExecutionID), attribute.String("jazzmine.container_id", lease.ContainerID())))
	defer espan.End()
	// The script's process gets the execute span as TRACEPARENT, so a tool can go on.
	tc := propagation.MapCarrier{}
	pr.tel.prop.Inject(ectx, tc)
	req.TraceParent, req.TraceState = tc["traceparent"], tc["tracestate"]
	res, err := lease.Run(ectx, req, func(runCtx context.Context, hev harness.Event) error {
		ev, ok := fromHarness(hev)
		if !ok {
			return nil
		}
		if err := pr.files.put(runCtx, ref, attempt, hev, ev); err != nil {
			// The bucket is full, or failing: the run goes on, and fails at its end.
			// Not an error of the callback, which would retry the job for as long.
			if unstored == nil {
				unstored = err
			}
			if ev.Type == wire.EventArtifact {
				return nil // announces nothing it has not stored
			}
		}
		if ev.Type == wire.EventError && hev.Kind == wire.KindCancelled && handedOver(ctx) {
			return nil // not cancelled: the job goes back to the queue (ended)
		}
		return p.publish(ev)
	})
	if res != nil && unstored != nil {
		res.Success = false
		if res.Error == "" {
			res.Error, res.ErrorKind = unstored.Error(), wire.KindInfrastructure
			if errors.As(unstored, new(*errBucketFull)) {
				res.ErrorKind = wire.KindArtifactLimit // the tenant's own bound
			}
			_ = p.publish(&wire.Event{Type: wire.EventError, Kind: res.ErrorKind, Error: res.Error})
		}
	}
	if res != nil {
		outcome := res.ErrorKind
		if res.Success {
			outcome = "success"
		}
		espan.SetAttributes(attribute.Bool("jazzmine.success", res.Success), attribute.String("jazzmine.outcome", outcome), attribute.Int64("jazzmine.output_bytes", res.OutputBytes))
		pr.tel.execDuration.Record(ctx, float64(res.DurationMS)/1000, metric.WithAttributes(attribute.String("sandbox", sandbox), attribute.String("outcome", outcome)))
		pr.tel.outputBytes.Record(ctx, res.OutputBytes, metric.WithAttributes(attribute.String("sandbox", sandbox)))
	}
	return res, err
}

// finish publishes the run's script_done and waits until the stream holds every
// event of the attempt.
func (pr *processor) finish(ctx context.Context, p *publisher, res *harness.Result, err error, log *slog.Logger) (outcome, string) {
	_, pspan := pr.tel.tracer.Start(ctx, "publish events")
	if err == nil {
		err = p.publish(scriptDone(res))
	}
	if err == nil {
		err = p.store(pr.jobs.Done(), log)
	}
	pspan.SetAttributes(attribute.Int64("jazzmine.events", int64(p.seq)))
	if err != nil {
		pspan.SetStatus(codes.Error, err.Error())
	}
	pspan.End()
	if err != nil {
		// The events did not all reach the stream: run it again rather than lose them.
		log.Warn("publish events", "execution_id", p.ref, "err", err)
		return outUnstored, truncateReason(err.Error())
	}
	if res.ErrorKind == wire.KindCancelled {
		return outCancelled, ""
	}
	return outRan, ""
}

// cancelledQueued answers a job whose cancel's coordinator took it for queued (the
// entry says "queued"): its end is the coordinator's, under attempt 0, and the job
// runs nothing. Should that end not be there (the coordinator died or failed to store
// it after its swap), this publishes it, the same events under the same ids, so that
// the stream keeps one end however the two meet.
func (pr *processor) cancelledQueued(ctx context.Context, ref execRef, ct string, meta map[string]string, log *slog.Logger) (outcome, string) {
	ended, err := pr.events.ended(ctx, ref.key())
	if err == nil && !ended {
		err = pr.events.publisher(ref, 0, ct, meta).terminal(wire.KindCancelled, cancelledBeforeRun)
	}
	if err != nil {
		log.Warn("the end of a job cancelled while queued", "execution_id", ref, "err", err)
		return outUnstored, truncateReason(err.Error())
	}
	return outCancelled, ""
}

// endCancelled publishes the end of a job cancelled before it got a container; one
// that the worker's shutdown stopped goes back to the queue instead.
func (pr *processor) endCancelled(ctx context.Context, p *publisher, log *slog.Logger) (outcome, string) {
	if handedOver(ctx) {
		return outHandedOver, ""
	}
	msg := "Execution cancelled"
	if err := p.terminal(wire.KindCancelled, msg); err != nil {
		log.Warn("publish cancel events", "execution_id", p.ref, "err", err)
		return outUnstored, "cancel events not published"
	}
	return outCancelled, ""
}

// A job's one end. An execution has one script_done in the events stream, however
// often its job is delivered:
//
//   - A redelivery (attempt > 1) looks the execution's script_done up before it takes
//     a container. When an earlier attempt stored it (its worker died, or lost its
//     connection, after storing its events and before its ack reached the server),
//     the job is acked without running again. A first delivery is not looked up: the
//     server counts a delivery before it hands the message over (a replicated
//     consumer once its peers have the count), so no earlier attempt of a job whose
//     delivery count is 1 has run.
//   - A job still running when the worker's shutdown grace ends goes back to the
//     queue at once (nak) with no script_done and no error event: its next attempt, on
//     another worker, ends it.
//   - A job delivered more than MaxDeliver times is not run again: the worker that
//     gets the delivery publishes its end (an infrastructure error and script_done,
//     under that delivery's attempt number) and terminates it. The consumer's own
//     MaxDeliver is unlimited so that this delivery always comes. (The server's
//     max-deliveries advisory, which ended such jobs before, is sent once, only if
//     someone listens at that instant, and reads the same whoever publishes it.) When
//     the end cannot be stored, the job is nakked with a growing delay and the next
//     delivery, on whichever worker, tries again: the job stays in the work queue
//     until it has its end, whichever workers stop meanwhile.
const (
	// endMaxDelay caps the delay before a delivery past MaxDeliver whose end could
	// not be stored comes again.
	endMaxDelay = 30 * time.Second
	// endLookupLimit bounds how long one delivery asks the events stream for a
	// script_done that the stream cannot tell yet; then the job is nakked.
	endLookupLimit = time.Minute
)

// endedBefore answers a delivery whose end is not a run of its own: one of a job that
// an earlier attempt ended, or one past MaxDeliver. It returns ok false when the job
// is to run. p is the delivery's publisher.
func (pr *processor) endedBefore(p *publisher, attempt int, log *slog.Logger) (out outcome, reason string, ok bool) {
	if attempt <= 1 {
		return 0, "", false
	}
	ended, err := pr.hasEnd(p.ref.key(), log)
	switch {
	case err != nil && pr.jobs.Err() != nil:
		return outHandedOver, "", true
	case err != nil:
		return outUnstored, truncateReason(err.Error()), true
	case ended:
		log.Info("a redelivered job had ended already: acked without running it again", "execution_id", p.ref)
		return outEnded, "", true
	case attempt <= pr.cfg.MaxDeliver:
		return 0, "", false
	}
	msg := fmt.Sprintf("gave up after %d deliveries: the workers that took the job stopped before finishing it", pr.cfg.MaxDeliver)
	if err := p.terminal(wire.KindInfrastructure, msg); err != nil {
		log.Warn("the end of a job out of deliveries was not stored; its next delivery tries again",
			"execution_id", p.ref, "in", pr.nakDelay(attempt), "err", err)
		return outUnstored, truncateReason(err.Error()), true
	}
	log.Warn("gave up a job out of deliveries", "execution_id", p.ref, "deliveries", attempt-1)
	return outGaveUp, truncateReason(msg), true
}

// hasEnd reports whether the events stream holds a script_done of the execution.
// While the stream cannot tell (its leader is being elected, the stream is gone for a
// while), it asks again, a little later each time, until the stream answers, the
// worker's jobs end at shutdown, or endLookupLimit.
func (pr *processor) hasEnd(id string, log *slog.Logger) (bool, error) {
	deadline := time.Now().Add(endLookupLimit)
	delay := storeMinDelay
	for {
		ctx, cancel := publishContext()
		ended, err := pr.events.ended(ctx, id)
		cancel()
		if err == nil {
			return ended, nil
		}
		err = fmt.Errorf("look up the script_done of %s: %w", id, err)
		if time.Now().Add(delay).After(deadline) {
			return false, err
		}
		log.Warn("the events stream cannot tell whether a redelivered job has ended; asking again", "execution_id", id, "in", delay, "err", err)
		select {
		case <-time.After(delay):
		case <-pr.jobs.Done():
			return false, err
		}
		delay = min(2*delay, storeMaxDelay)
	}
}

// nakDelay is the delay before a nakked delivery of the given attempt comes again:
// NakDelay up to the last delivery, then doubled for each delivery past it, at most
// endMaxDelay.
func (pr *processor) nakDelay(attempt int) time.Duration {
	d := pr.cfg.NakDelay
	for n := pr.cfg.MaxDeliver; n < attempt && d < endMaxDelay; n++ {
		d = min(2*d, endMaxDelay)
	}
	return d
}

// handedOver reports whether the job's context was ended by the worker's shutdown
// grace: the job goes back to the queue, and this attempt publishes no end.
func handedOver(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errShuttingDown)
}

// handOver tells whether a run that returned res and err was cut by the worker's
// shutdown, and logs it: such a job goes back to the queue with its partial events
// and no script_done. A script that finished as the grace ended keeps its result.
func (pr *processor) handOver(ctx context.Context, ref execRef, res *harness.Result, err error, log *slog.Logger) bool {
	if !handedOver(ctx) || (err == nil && res.ErrorKind != wire.KindCancelled) {
		return false
	}
	log.Warn("the shutdown grace ended a running job: it goes back to the queue for another worker", "execution_id", ref)
	return true
}
