package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Served subjects. The jobs stream and the sessions stream capture the subjects of
// the sandboxes the fleet serves, and no others: a job or a session call for a
// sandbox nobody serves, or on a subject with a literal wildcard, finds no stream and
// the server answers its publish with "no responders" (the client's
// ErrUnknownSandbox), whether or not a worker runs. Nothing is stored that no worker
// would take, so nothing has to be answered or swept afterwards.
//
// Each worker adds its sandboxes' subjects when it starts (a sandbox whose image is
// still being built included: its jobs queue), checks them at every liveness beat
// (two workers updating a stream at once may each write the subjects it read, and
// one's are lost until its next beat), and names its sandboxes in its liveness entry.
// A sandbox that no live worker names for DefaultUnservedGrace (Config.UnservedGrace)
// leaves the subjects; its jobs published before stay stored, and run when a worker
// serves it again. Subjects of another shape (an earlier version's jazzmine.exec.>)
// are replaced.

// liveEntry is a worker's entry in BucketWorkers.
type liveEntry struct {
	At        time.Time `json:"at"`
	Sandboxes []string  `json:"sandboxes"`
}

// served keeps this worker's sandboxes among the streams' subjects, and takes out
// those of the sandboxes no live worker serves any more.
type served struct {
	js      jetstream.JetStream
	workers jetstream.KeyValue // BucketWorkers
	own     []string           // this worker's sandboxes
	grace   time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	missing map[string]time.Time // sandboxes of the subjects no live worker named, since when
}

func newServed(js jetstream.JetStream, workers jetstream.KeyValue, sandboxes []Sandbox, grace time.Duration, log *slog.Logger) *served {
	return &served{js: js, workers: workers, own: sandboxNames(sandboxes), grace: grace, log: log, missing: map[string]time.Time{}}
}

// ensure adds this worker's subjects to both streams where they are missing.
func (sv *served) ensure(ctx context.Context) error {
	for _, s := range servedStreams {
		if err := sv.update(ctx, s, sv.own, nil); err != nil {
			return err
		}
	}
	return nil
}

// update adds the subjects of the sandboxes add to stream s and takes out those of
// drop, if that changes them.
func (sv *served) update(ctx context.Context, s servedStream, add, drop []string) error {
	stream, err := sv.js.Stream(ctx, s.name)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", s.name, err)
	}
	cfg := stream.CachedInfo().Config
	subjects, changed := s.mergeSubjects(cfg.Subjects, add, drop)
	if !changed {
		return nil
	}
	if len(subjects) == 0 {
		return nil // a stream has a subject at least: the last sandbox's stay
	}
	cfg.Subjects = subjects
	if _, err := sv.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("update the subjects of stream %s: %w", s.name, err)
	}
	sv.log.Info("stream subjects updated", "stream", s.name, "added", add, "removed", drop)
	return nil
}

// entry is this worker's liveness entry.
func (sv *served) entry() []byte {
	b, _ := json.Marshal(liveEntry{At: time.Now().UTC(), Sandboxes: sv.own})
	return b
}

// retire takes out of both streams the subjects of the sandboxes that no live worker
// has named for the grace. An entry it cannot read (a worker of an earlier version,
// whose entry named no sandbox) stops it: that worker may serve any of them.
func (sv *served) retire(ctx context.Context) error {
	names, err := sv.workers.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("list live workers: %w", err)
	}
	live := map[string]bool{}
	for id := range names.Keys() {
		e, err := sv.workers.Get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read the liveness of worker %s: %w", id, err)
		}
		var entry liveEntry
		if json.Unmarshal(e.Value(), &entry) != nil {
			return nil
		}
		for _, sb := range entry.Sandboxes {
			live[sb] = true
		}
	}
	now := time.Now()
	for _, s := range servedStreams {
		stream, err := sv.js.Stream(ctx, s.name)
		if err != nil {
			return fmt.Errorf("look up stream %s: %w", s.name, err)
		}
		var gone []string
		sv.mu.Lock()
		for _, subject := range stream.CachedInfo().Config.Subjects {
			sb, ok := s.sandbox(subject)
			if !ok || live[sb] {
				delete(sv.missing, sb)
				continue
			}
			since, seen := sv.missing[sb]
			if !seen {
				sv.missing[sb] = now
			} else if now.Sub(since) >= sv.grace && !slices.Contains(gone, sb) {
				gone = append(gone, sb)
			}
		}
		sv.mu.Unlock()
		if len(gone) > 0 {
			if err := sv.update(ctx, s, nil, gone); err != nil {
				return err
			}
		}
	}
	return nil
}
