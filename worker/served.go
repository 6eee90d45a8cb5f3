package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jazzmine/worker/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// Served subjects. The jobs stream and the sessions stream capture the subjects of
// the sandboxes the fleet serves, and no others: a job or a session call for a
// sandbox nobody serves, or with a literal wildcard for its sandbox, finds no stream
// and the server answers its publish with "no responders" (the client's
// ErrUnknownSandbox), whether or not a worker runs. Nothing is stored that no worker
// would take. (A session call with a literal '*' for its session id matches its
// sandbox's subject: the opener deletes it.)
//
// Each worker adds its sandboxes' subjects when it starts (a sandbox whose image is
// still being built included: its jobs queue), checks them at every liveness beat,
// and names its sandboxes in its liveness entry. A change of the subjects is made
// holding the fleet's lock on them (withSubjectsLock): JetStream replaces a stream's
// config whole, with no revision to check, and two workers changing it at once would
// each write what it read. A sandbox that no live worker names for
// DefaultUnservedGrace (Config.UnservedGrace) leaves the subjects, and the jobs it
// still held get their end: an invalid_job error saying so (retire). Subjects of
// another shape (an earlier version's jazzmine.exec.>) are replaced, once no worker
// of that version is alive: its entry names no sandbox, and such a worker may serve
// any.

// served keeps this worker's sandboxes among the streams' subjects, and takes out
// those of the sandboxes no live worker serves any more.
type served struct {
	js             jetstream.JetStream
	workers, fleet jetstream.KeyValue // BucketWorkers, BucketFleet (the lock)
	events         *events            // the ends of the jobs of a retired sandbox
	id             string
	own            []string // this worker's sandboxes
	grace          time.Duration
	maxScript      int
	log            *slog.Logger

	mu      sync.Mutex
	missing map[string]time.Time // sandboxes of the subjects no live worker named, since when
}

func newServed(js jetstream.JetStream, topo *topology, ev *events, c *Config) *served {
	return &served{js: js, workers: topo.workers, fleet: topo.fleet, events: ev, id: c.WorkerID, own: sandboxNames(c.Sandboxes),
		grace: c.UnservedGrace, maxScript: c.MaxScriptBytes, log: c.Logger, missing: map[string]time.Time{}}
}

// ensure adds this worker's subjects to both streams where they are missing.
func (sv *served) ensure(ctx context.Context) error {
	for _, s := range servedStreams {
		stream, err := sv.js.Stream(ctx, s.name)
		if err != nil {
			return fmt.Errorf("look up stream %s: %w", s.name, err)
		}
		if _, changed := s.mergeSubjects(stream.CachedInfo().Config.Subjects, sv.own, nil); !changed {
			continue // the common case: one look, no lock
		}
		if err := withSubjectsLock(ctx, sv.fleet, sv.id, func() error { return sv.update(ctx, s, sv.own, nil) }); err != nil {
			return err
		}
	}
	return nil
}

// update adds the subjects of the sandboxes add to stream s and takes out those of
// drop, if that changes them; the caller holds the lock. It changes nothing while a
// worker of an earlier version lives and the stream has its subjects.
func (sv *served) update(ctx context.Context, s servedStream, add, drop []string) error {
	stream, err := sv.js.Stream(ctx, s.name)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", s.name, err)
	}
	cfg := stream.CachedInfo().Config
	subjects, changed := s.mergeSubjects(cfg.Subjects, add, drop)
	if !changed || len(subjects) == 0 { // a stream has a subject at least: the last sandbox's stay
		return nil
	}
	if earlier, err := earlierVersionLives(ctx, sv.workers, s, cfg.Subjects); err != nil || earlier {
		return err
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
// has named for the grace, and ends the jobs the jobs stream holds on subjects it no
// longer takes (ended). A worker of an earlier version alive stops it: it may serve
// any sandbox.
func (sv *served) retire(ctx context.Context) error {
	live, earlier, err := liveSandboxes(ctx, sv.workers)
	if err != nil || earlier {
		return err
	}
	now := time.Now()
	for _, s := range servedStreams {
		stream, err := sv.js.Stream(ctx, s.name)
		if err != nil {
			return fmt.Errorf("look up stream %s: %w", s.name, err)
		}
		var gone []string
		sv.mu.Lock()
		missing := map[string]time.Time{} // only what is still missing: a sandbox served again waits the grace anew
		for _, subject := range stream.CachedInfo().Config.Subjects {
			if sb, ok := s.sandbox(subject); ok && !live[sb] {
				missing[sb] = now
				if since, seen := sv.missing[sb]; seen {
					missing[sb] = since
					if now.Sub(since) >= sv.grace && !slices.Contains(gone, sb) {
						gone = append(gone, sb)
					}
				}
			}
		}
		sv.missing = missing
		sv.mu.Unlock()
		if len(gone) > 0 {
			err := withSubjectsLock(ctx, sv.fleet, sv.id, func() error {
				// Read again under the lock: a worker that announced itself meanwhile
				// keeps its sandboxes. (One that has added its subjects and not yet
				// announced itself, in its first second, gets them back at its
				// first beat.)
				live, earlier, err := liveSandboxes(ctx, sv.workers)
				if err != nil || earlier {
					return err
				}
				return sv.update(ctx, s, nil, slices.DeleteFunc(gone, func(sb string) bool { return live[sb] }))
			})
			if err != nil {
				return err
			}
		}
	}
	return sv.endOrphans(ctx)
}

// endOrphans ends each job the jobs stream holds on a subject it no longer takes (a
// sandbox retired, or a shape of an earlier version): an invalid_job error under its
// id, if it owns one, and the subject purged. Nobody would ever take them, and they
// would hold the backlog's room for good.
func (sv *served) endOrphans(ctx context.Context) error {
	stream, err := sv.js.Stream(ctx, wire.StreamExec)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", wire.StreamExec, err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return fmt.Errorf("list the subjects of stream %s: %w", wire.StreamExec, err)
	}
	for subject := range info.State.Subjects {
		if slices.ContainsFunc(info.Config.Subjects, func(taken string) bool { return subjectMatches(taken, subject) }) {
			continue
		}
		_, err := scan(ctx, stream, subject, 0, math.MaxInt, func(m *jetstream.RawStreamMsg) bool {
			if m.Subject == subject { // a literal wildcard matches others too
				sv.endOrphan(storedMsg{m})
				// One at a time: a purge by a subject with a literal wildcard
				// would take every subject it matches.
				if err := stream.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
					sv.log.Warn("delete a job nobody takes", "subject", subject, "seq", m.Sequence, "err", err)
				}
			}
			return ctx.Err() == nil
		})
		if err != nil {
			return fmt.Errorf("read the jobs of %s: %w", subject, err)
		}
	}
	return nil
}

// endOrphan publishes the end of a job nobody takes.
func (sv *served) endOrphan(m storedMsg) {
	tenant, sandbox, _ := wire.ParseExecSubject(m.Subject())
	job, ref, ct, err := decode(sandbox, m, sv.maxScript)
	if ref.id == "" {
		return // nothing can be published under it
	}
	var meta map[string]string
	if err == nil {
		meta = job.Metadata
	}
	ref.tenant = tenant
	msg := fmt.Sprintf("unknown sandbox %q: no worker has served it for %v, and its queued jobs end", sandbox, sv.grace)
	if perr := sv.events.publisher(ref, 1, ct, meta).terminal(wire.KindInvalidJob, msg); perr != nil {
		sv.log.Warn("publish the end of a job nobody takes", "execution_id", ref, "err", perr)
	}
}
