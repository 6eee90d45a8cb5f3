package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// liveness is the worker's standing in the fleet: its entry in BucketWorkers, which
// names its sandboxes, refreshed every third of the TTL while it runs, and in
// BucketFleet, refreshed now and then. At each beat it checks its sandboxes' subjects
// in the streams, and now and then retires those of sandboxes nobody serves (served).
// (The pool's reaper, asking WorkerAlive, removes the containers of the workers whose
// entries expired.)
type liveness struct {
	workers, fleet jetstream.KeyValue
	served         *served
	id             string
	ttl            time.Duration
	log            *slog.Logger
	done           sync.WaitGroup
}

// start announces the worker and keeps its entries until run ends.
func (l *liveness) start(setup, run context.Context) error {
	if err := l.announce(setup); err != nil {
		return err
	}
	l.keep(run)
	return nil
}

// stop withdraws the worker (withdraw).
func (l *liveness) stop(ctx context.Context) { l.withdraw(ctx) }

// announce records the worker as alive and as a member of the fleet.
func (l *liveness) announce(ctx context.Context) error {
	if err := l.put(ctx, l.workers, l.served.entry()); err != nil {
		return fmt.Errorf("announce worker %s: %w", l.id, err)
	}
	if err := l.put(ctx, l.fleet, nil); err != nil {
		return fmt.Errorf("record worker %s in the fleet: %w", l.id, err)
	}
	return nil
}

// put puts the worker's entry in kv: value, or the time for none.
func (l *liveness) put(ctx context.Context, kv jetstream.KeyValue, value []byte) error {
	if value == nil {
		value = []byte(time.Now().UTC().Format(time.RFC3339))
	}
	_, err := kv.Put(ctx, l.id, value)
	return err
}

// keep refreshes both entries until ctx ends; stop waits for it.
func (l *liveness) keep(ctx context.Context) {
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		beat := time.NewTicker(l.ttl / 3)
		defer beat.Stop()
		member := time.NewTicker(FleetMemory / 4)
		defer member.Stop()
		retire := time.NewTicker(max(l.served.grace/4, time.Second))
		defer retire.Stop()
		for {
			var step func(context.Context) (string, error)
			select {
			case <-ctx.Done():
				return
			case <-beat.C:
				step = func(ctx context.Context) (string, error) {
					if err := l.put(ctx, l.workers, l.served.entry()); err != nil {
						return "refresh liveness", err
					}
					return "keep the sandboxes' subjects in the streams", l.served.ensure(ctx)
				}
			case <-member.C:
				step = func(ctx context.Context) (string, error) {
					return "refresh fleet membership", l.put(ctx, l.fleet, nil)
				}
			case <-retire.C:
				step = func(ctx context.Context) (string, error) {
					return "retire the subjects of sandboxes nobody serves", l.served.retire(ctx)
				}
			}
			// The step's time starts when its tick came, not when the wait for it began.
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			what, err := step(sctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				l.log.Warn(what, "err", err)
			}
		}
	}()
}

// withdraw waits for keep to end and deletes the liveness entry: the worker is gone
// at once, not after the TTL.
func (l *liveness) withdraw(ctx context.Context) {
	l.done.Wait()
	if l.workers == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = l.workers.Delete(dctx, l.id)
}

// WorkerAlive reports whether the containers of the worker with the id must be left
// alone. It is what the pool's reaper asks (sandboxpool.Config.WorkerAlive), and it
// answers false only for a worker of this fleet that is gone: one BucketFleet
// remembers whose liveness entry in BucketWorkers has expired (or was withdrawn at
// shutdown). A worker the fleet does not know counts as alive: it serves another NATS
// deployment from the same Docker host (another fleet, a test, a benchmark), and its
// own fleet reaps its containers; removing them from here would kill its jobs.
func WorkerAlive(js jetstream.JetStream) func(ctx context.Context, workerID string) (bool, error) {
	return func(ctx context.Context, workerID string) (bool, error) {
		found := func(bucket string) (bool, error) {
			kv, err := js.KeyValue(ctx, bucket)
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			_, err = kv.Get(ctx, workerID)
			// An id that is no valid key (a pool used without a worker may have any)
			// was never announced: it is in neither bucket.
			if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) || errors.Is(err, jetstream.ErrInvalidKey) {
				return false, nil
			}
			return err == nil, err
		}
		live, err := found(BucketWorkers)
		if err != nil || live {
			return live, err
		}
		member, err := found(BucketFleet)
		if err != nil {
			return false, err
		}
		return !member, nil
	}
}
