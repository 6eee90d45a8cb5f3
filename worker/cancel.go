package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// Cancel protocol. An agent publishes on jazzmine.cancel.<id>; one worker of the fleet
// (queue group) coordinates, with the id's entry in BucketCancels as the arbiter:
//
//  1. It creates the entry as "pending" (a second cancel of the same id stops here).
//  2. It asks the fleet, on jazzmine.internal.running.<id>, who runs the execution;
//     the worker that does cancels it, answers, and publishes the cancelled events.
//  3. Without an answer, it looks for the job in the jobs stream (a work queue holds
//     it until its ack), or for the session call in the sessions stream (which holds
//     a call until it is done with: waiting behind an earlier call of its session, or
//     just run). With none there the cancel is void, and the entry deleted. With one,
//     the job is queued (or has just ended): the coordinator swaps "pending" for
//     "queued" and, unless the job already has a script_done, publishes the cancelled
//     error and script_done itself, at once, under attempt 0.
//
// A worker that takes a job looks the id up after registering it: "queued" means the
// end is the coordinator's (the job is acked without running; the worker publishes the
// same end under the same ids if it is not there, so a coordinator that died after its
// swap loses no end); "pending" is swapped for "running" (the worker cancels the job
// and publishes its end; losing the swap to the coordinator means "queued"); "running"
// means a cancel reached an earlier delivery, so this one is cancelled too. The swaps
// are compare-and-set, so one of the two owns the end. A worker that takes the job
// after the question of 2 swaps "pending" itself, so the look of 3 may come after it.
const (
	cancelPending = "pending"
	cancelQueued  = "queued"
	cancelRunning = "running"

	subjectRunning = "jazzmine.internal.running."
	groupCancel    = "jazzmine-cancel"

	// askRunningTimeout is how long the coordinator waits for the worker running an
	// execution to answer.
	askRunningTimeout = 300 * time.Millisecond

	// cancelledBeforeRun is the error of a job cancelled while it was queued.
	cancelledBeforeRun = "Execution cancelled before it ran"
)

// canceller is this worker's part in the cancel protocol: the coordinator (steps 1
// to 3, for the cancels the fleet's queue group gives it), the answer for the
// executions running here, and the look-up of the worker that takes a job.
type canceller struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	kv       jetstream.KeyValue // BucketCancels
	workerID string
	log      *slog.Logger
	events   *events     // the end of a queued job it cancels
	running  *registry   // the executions it may find running here
	bg       *background // where the coordination runs
}

// coordinate is step 1 to 3 of the protocol, on one worker of the fleet.
func (c *canceller) coordinate(m *nats.Msg) {
	ref, err := parseCancelSubject(m.Subject)
	if err != nil {
		c.log.Warn("ignored a cancel", "subject", m.Subject, "err", err)
		return
	}
	key := ref.key()
	c.bg.run(ref.tenant, m, func(ctx context.Context) {
		rev, err := c.kv.Create(ctx, key, []byte(cancelPending))
		if errors.Is(err, jetstream.ErrKeyExists) {
			return // already being cancelled
		}
		if err != nil {
			c.log.Warn("record a cancel", "execution_id", ref, "err", err)
			return
		}
		if c.askRunning(ctx, key) {
			return // the worker running it answered and publishes its end
		}
		queued, err := c.queued(ctx, ref)
		switch {
		case ctx.Err() != nil:
			// Out of time: the entry stays pending, and the worker that takes the job
			// cancels it then.
			c.log.Warn("look for a cancelled job in the queue: out of time", "execution_id", ref, "err", err)
			return
		case err != nil:
			c.log.Warn("look for a cancelled job in the queue; taken as queued", "execution_id", ref, "err", err)
		case !queued:
			c.void(ctx, ref, rev)
			return // nothing queued or running, or it ended meanwhile
		}
		if _, err := c.kv.Update(ctx, key, []byte(cancelQueued), rev); err != nil {
			return // a worker took the job meanwhile and publishes its end
		}
		if ended, _ := c.events.ended(ctx, key); ended {
			return // it had finished: nothing to cancel
		}
		p := c.events.publisher(ref, 0, wire.ContentTypeMsgpack, nil)
		if err := p.terminal(wire.KindCancelled, cancelledBeforeRun); err != nil {
			c.log.Warn("publish the end of a cancelled queued job", "execution_id", ref, "err", err)
		}
		c.log.Info("cancelled a queued job or session call", "execution_id", ref)
	})
}

// askRunning asks the fleet who runs the execution with key, and reports whether the
// worker running it answered: it cancels it and publishes its end.
func (c *canceller) askRunning(ctx context.Context, key string) bool {
	ask, stop := context.WithTimeout(ctx, askRunningTimeout)
	defer stop()
	_, err := c.nc.RequestWithContext(ask, subjectRunning+key, nil)
	return err == nil
}

// void drops a cancel that named nothing queued or running: its entry, of revision
// rev, is deleted (a worker that took the job meanwhile changed the entry, and the
// delete fails), and a job published later under the id runs.
func (c *canceller) void(ctx context.Context, ref execRef, rev uint64) {
	if err := c.kv.Delete(ctx, ref.key(), jetstream.LastRevision(rev)); err == nil {
		c.log.Info("a cancel named no queued or running job: ignored", "execution_id", ref)
	}
}

// queuedScanMax bounds how many of a tenant's queued jobs, and as many of its
// waiting session calls, one cancel reads; past it the job is taken as queued, and
// the cancel stands.
const queuedScanMax = 10000

// queued reports whether a job or a session call of ref waits: in the jobs stream
// (waiting, or delivered and not yet acked: the stream is a work queue, an acked job
// is gone), or in the sessions stream (a call waiting behind an earlier call of its
// session, running, or run and not yet dropped: its end, if it has one, is looked up
// before the cancel publishes one). It reads the tenant's jobs, then its session
// calls, one by one (a work queue takes no second consumer over them), from the
// first to the last one published when it starts: a cancel is rare, and a tenant pays
// only for its own backlog.
func (c *canceller) queued(ctx context.Context, ref execRef) (bool, error) {
	jobs, calls := wire.ExecWildcard, wire.SessionWildcard
	if ref.tenant != "" {
		jobs = wire.SubjectPrefixExec + "." + ref.tenant + ".*"
		calls = wire.SubjectPrefixSession + "." + ref.tenant + ".*.*"
	}
	for _, where := range []struct{ stream, filter string }{{wire.StreamExec, jobs}, {wire.StreamSessions, calls}} {
		stream, err := c.js.Stream(ctx, where.stream)
		if err != nil {
			return false, err
		}
		found := false
		complete, err := scan(ctx, stream, where.filter, 0, queuedScanMax, func(msg *jetstream.RawStreamMsg) bool {
			found = msg.Header.Get(wire.HeaderMsgID) == ref.id
			return !found
		})
		if err == nil && !complete {
			err = fmt.Errorf("more than %d waiting messages of %s to look through", queuedScanMax, where.filter)
		}
		if found || err != nil {
			return found, err
		}
	}
	return false, nil
}

// answerRunning cancels the execution if it runs here, and says so.
func (c *canceller) answerRunning(m *nats.Msg) {
	ex := c.running.claim(m.Subject[len(subjectRunning):])
	if ex == nil {
		return
	}
	ex.cancel(errCancelRequested)
	_ = m.Respond([]byte(c.workerID))
}

// cancelledWhileQueued is the taking worker's side of the protocol. It returns true
// when the job's end was already published and the job is to be acked silently; when
// the job is to be cancelled and ended here, it cancels ex and returns false.
func (c *canceller) cancelledWhileQueued(ctx context.Context, id string, ex *execution) (bool, error) {
	entry, err := c.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, nil
		}
		return false, err
	}
	claimed := c.running.claimed(ex)
	switch string(entry.Value()) {
	case cancelQueued:
		return !claimed, nil
	case cancelPending:
		if _, err := c.kv.Update(ctx, id, []byte(cancelRunning), entry.Revision()); err != nil && !claimed {
			return true, nil // the coordinator published the end
		}
	}
	ex.cancel(errCancelRequested)
	return false, nil
}
