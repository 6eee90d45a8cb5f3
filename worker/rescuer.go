package worker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// The rescuer of sessions (as River's JobRescuer is of jobs) ends the sessions whose
// owner is gone and finishes the ends cut short, on a timer, over its watch of
// BucketSessions: an open session whose entry its owner has not written for
// sessionTouchTimeout is ended (an update of the revision it saw, so that one worker
// ends it) and its calls get session_lost; an ended session whose calls have not all
// been answered endStall after its end began (its worker died or stopped during it)
// is finished by the worker that rewrites its entry first. Every worker runs one,
// for the sandboxes it serves.

// rescueEvery is how often the rescuer looks at the sessions it watches.
const rescueEvery = sessionTouch

// watched is what the rescuer knows of a session: its entry, the entry's revision and
// when it was written.
type watched struct {
	entry   *sessionEntry
	rev     uint64
	written time.Time
}

// rescue watches the sessions bucket, starting with w, and rescues what needs it
// every rescueEvery, until ctx ends. A watch that ends is made again, afresh.
func (s *sessions) rescue(ctx context.Context, w jetstream.KeyWatcher) {
	defer s.loops.Done()
	tick := time.NewTicker(rescueEvery)
	defer tick.Stop()
	for ctx.Err() == nil {
		if w != nil {
			s.rescueWith(ctx, w, tick.C)
			_ = w.Stop()
		}
		sleep(ctx, watchRetry)
		var err error
		if w, err = s.kv.WatchAll(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("watch the sessions", "err", err)
		}
	}
}

// rescueWith rescues over watch w until it ends or ctx does.
func (s *sessions) rescueWith(ctx context.Context, w jetstream.KeyWatcher, tick <-chan time.Time) {
	seen := map[string]watched{} // by session key: open sessions and unanswered ends
	for {
		select {
		case <-ctx.Done():
			return
		case kve, ok := <-w.Updates():
			if !ok {
				return
			}
			if kve != nil { // nil: every entry there was at the start has come
				s.note(seen, kve)
			}
		case <-tick:
			for key, wt := range seen {
				if ctx.Err() != nil {
					return
				}
				if s.rescueOne(ctx, key, wt) {
					delete(seen, key) // the watch brings its next state
				}
			}
		}
	}
}

// note keeps kve in seen when it is an entry the rescuer may have to act on.
func (s *sessions) note(seen map[string]watched, kve jetstream.KeyValueEntry) {
	var e sessionEntry
	if kve.Operation() != jetstream.KeyValuePut || json.Unmarshal(kve.Value(), &e) != nil ||
		(e.State == sessionEnded && e.Answered) || s.cfg.sandbox(e.Sandbox).Name == "" {
		delete(seen, kve.Key())
		return
	}
	// When it came, on this worker's clock: the entry's own time is the server's, and
	// a worker whose clock ran ahead would take every owner for dead. An entry the
	// watch's start brings counts from then: a dead owner's session ends up to
	// sessionTouchTimeout later.
	seen[kve.Key()] = watched{entry: &e, rev: kve.Revision(), written: time.Now()}
}

// rescueOne ends session key if its owner is gone, or finishes its end if that end
// stalled, and reports whether the rescuer is done with what it saw: it acted, another
// worker wrote the entry meanwhile (the watch brings that), or the entry is of no more
// use. A write that failed otherwise is tried again at the next tick.
func (s *sessions) rescueOne(ctx context.Context, key string, wt watched) bool {
	id := sessionKey(key)
	e := wt.entry
	switch {
	case time.Since(wt.written) > s.cfg.SessionMaxLife+s.cfg.EventsMaxAge:
		return true // aged out of the bucket, with no delete the watch would bring
	case e.State == sessionOpen && !s.alive(e, id, wt.written):
		return s.endDead(ctx, id, wt)
	case e.State == sessionEnded && time.Since(wt.written) > endStall:
		// Rewritten as it is: the first worker to do so finishes the end, and the
		// others see it written again.
		_, err := s.kv.Update(ctx, key, mustJSON(e), wt.rev)
		if err == nil {
			s.finishLater(ctx, e.Sandbox, id, e)
		}
		return written(err)
	}
	return false
}

// written reports whether an update of an entry is done with: it succeeded, or the
// entry had been written since (a revision that no longer matches).
func written(err error) bool {
	return err == nil || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// endDead ends open session id, whose owner is gone, and finishes its end in the
// background: its calls from the first its owner had not acked get session_lost. It
// reports whether the entry is done with (see written).
func (s *sessions) endDead(ctx context.Context, id sessionRef, wt watched) bool {
	e := &sessionEntry{Worker: wt.entry.Worker, Sandbox: wt.entry.Sandbox, State: sessionEnded, Reason: "its worker " + wt.entry.Worker + " died"}
	if c, err := s.js.Consumer(ctx, wire.StreamSessions, id.consumer()); err == nil {
		e.From = c.CachedInfo().AckFloor.Stream + 1
	}
	if _, err := s.kv.Update(ctx, id.key(), mustJSON(e), wt.rev); err != nil {
		if !written(err) {
			s.log.Warn("end a session whose owner is gone", "session_id", id.key(), "err", err)
		}
		return written(err) // written meanwhile: its owner lives, or another worker ended it
	}
	s.log.Info("session ended: its owner is gone", "session_id", id.key(), "sandbox", e.Sandbox, "owner", e.Worker)
	s.finishLater(ctx, e.Sandbox, id, e)
	return true
}

// sessionKey is the session a key of BucketSessions names: <tenant>.<id> or <id>
// (an id has no dot).
func sessionKey(key string) sessionRef {
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		return sessionRef{key[:i], key[i+1:]}
	}
	return sessionRef{"", key}
}
