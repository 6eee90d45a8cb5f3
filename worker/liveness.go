package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// announce records the worker as alive in BucketWorkers.
func (w *Worker) announce(ctx context.Context) error {
	if _, err := w.workers.Put(ctx, w.cfg.WorkerID, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		return fmt.Errorf("announce worker %s: %w", w.cfg.WorkerID, err)
	}
	return nil
}

// keepAlive refreshes the worker's liveness entry and, now and then, removes the
// containers of workers whose entries expired.
func (w *Worker) keepAlive() {
	defer w.background.Done()
	beat := time.NewTicker(w.cfg.LivenessTTL / 3)
	defer beat.Stop()
	reap := time.NewTicker(w.cfg.ReapInterval)
	defer reap.Stop()
	for {
		select {
		case <-w.pulling.Done():
			return
		case <-beat.C:
			ctx, cancel := context.WithTimeout(w.pulling, 5*time.Second)
			if err := w.announce(ctx); err != nil && w.pulling.Err() == nil {
				w.log.Warn("refresh liveness", "err", err)
			}
			cancel()
		case <-reap.C:
			ctx, cancel := context.WithTimeout(w.pulling, 30*time.Second)
			if n, err := w.cfg.Pool.ReapOrphans(ctx); err != nil && w.pulling.Err() == nil {
				w.log.Warn("reap containers of dead workers", "err", err)
			} else if n > 0 {
				w.log.Info("removed containers of dead workers", "count", n)
			}
			cancel()
		}
	}
}

// WorkerAlive reports whether the worker with the id has refreshed its liveness entry
// within the TTL. It is what the pool's reaper asks (sandboxpool.Config.WorkerAlive).
func WorkerAlive(js jetstream.JetStream) func(ctx context.Context, workerID string) (bool, error) {
	return func(ctx context.Context, workerID string) (bool, error) {
		kv, err := js.KeyValue(ctx, BucketWorkers)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		_, err = kv.Get(ctx, workerID)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return false, nil
		}
		return err == nil, err
	}
}
