package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/wire"
)

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
