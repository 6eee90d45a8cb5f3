package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// announce records the worker as alive in BucketWorkers and as a member of the fleet
// in BucketFleet.
func (w *Worker) announce(ctx context.Context) error {
	now := []byte(time.Now().UTC().Format(time.RFC3339))
	if _, err := w.workers.Put(ctx, w.cfg.WorkerID, now); err != nil {
		return fmt.Errorf("announce worker %s: %w", w.cfg.WorkerID, err)
	}
	if _, err := w.fleet.Put(ctx, w.cfg.WorkerID, now); err != nil {
		return fmt.Errorf("record worker %s in the fleet: %w", w.cfg.WorkerID, err)
	}
	return nil
}

// keepAlive refreshes the worker's liveness entry and, now and then, its fleet entry.
// (The pool's reaper, asking WorkerAlive, removes the containers of the workers whose
// entries expired.)
func (w *Worker) keepAlive() {
	defer w.background.Done()
	beat := time.NewTicker(w.cfg.LivenessTTL / 3)
	defer beat.Stop()
	member := time.NewTicker(FleetMemory / 4)
	defer member.Stop()
	for {
		select {
		case <-w.pulling.Done():
			return
		case <-beat.C:
			ctx, cancel := context.WithTimeout(w.pulling, 5*time.Second)
			if _, err := w.workers.Put(ctx, w.cfg.WorkerID, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil && w.pulling.Err() == nil {
				w.log.Warn("refresh liveness", "err", err)
			}
			cancel()
		case <-member.C:
			ctx, cancel := context.WithTimeout(w.pulling, 5*time.Second)
			if _, err := w.fleet.Put(ctx, w.cfg.WorkerID, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil && w.pulling.Err() == nil {
				w.log.Warn("refresh fleet membership", "err", err)
			}
			cancel()
		}
	}
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
