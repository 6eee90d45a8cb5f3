package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// groupTriage is the queue group of the fleet's triage: one worker sees each job.
const groupTriage = "jazzmine-triage"

// triage sees every job published (one worker of the fleet, queue group) and answers
// those for a sandbox that no worker serves: the jobs stream captures
// jazzmine.exec.>, but only sandboxes with a durable consumer are ever pulled. Such a
// job gets an invalid_job error and a script_done, and its subject is purged so that
// it does not sit in the backlog.
type triage struct {
	js     jetstream.JetStream
	log    *slog.Logger
	served map[string]bool // the sandboxes this worker serves
	names  string          // the same, sorted, for an error message
	events *events         // the error of a job for an unknown sandbox
	bg     *background     // where the look-ups and purges run

	mu     sync.Mutex
	sweeps map[string]int            // by stream: sweepIdle, sweepQueued, sweepAgain
	noted  map[string]map[string]int // by stream: subjects to sweep, and their passes left
}

func newTriage(js jetstream.JetStream, sandboxes []Sandbox, ev *events, bg *background, log *slog.Logger) *triage {
	t := &triage{js: js, log: log, served: map[string]bool{}, events: ev, bg: bg, sweeps: map[string]int{},
		noted: map[string]map[string]int{wire.StreamExec: {}, wire.StreamSessions: {}}}
	var names []string
	for _, sb := range sandboxes {
		t.served[sb.Name] = true
		names = append(names, sb.Name)
	}
	slices.Sort(names)
	t.names = strings.Join(names, ", ")
	return t
}

// see answers the job m, if no worker serves its sandbox.
func (t *triage) see(m *nats.Msg) {
	tenant, sandbox, err := wire.ParseExecSubject(m.Subject)
	if err != nil {
		// A subject no consumer can ever match (a literal wildcard, a character no
		// sandbox name has): nothing would take it, and it would hold backlog room
		// for good.
		t.sweepSoon(jobSubjects, m)
		return
	}
	if t.served[sandbox] {
		return // ours: the common case costs a map lookup
	}
	t.sweepSoon(jobSubjects, m)
	t.bg.run(tenant, m, func(ctx context.Context) {
		if exists, err := jobSubjects.served(ctx, t.js, sandbox); err == nil && !exists {
			t.unknown(tenant, sandbox, m)
		}
	})
}

// unknown answers job m, of a sandbox no worker serves, with invalid_job under its id,
// if it has one.
func (t *triage) unknown(tenant, sandbox string, m *nats.Msg) {
	id, ct, meta := identify(m.Header, m.Data)
	t.log.Warn("job for an unknown sandbox", "sandbox", sandbox, "execution_id", id)
	if id == "" {
		return
	}
	p := t.events.publisher(execRef{tenant, id}, 1, ct, meta)
	msg := fmt.Sprintf("unknown sandbox %q: no worker serves it (this worker serves %s)", sandbox, t.names)
	if err := p.terminal(wire.KindInvalidJob, msg); err != nil {
		t.log.Warn("publish the error of a job for an unknown sandbox", "execution_id", id, "err", err)
	}
}

// subjects is a stream whose subjects name a sandbox, as the triage sweeps it.
type subjects struct {
	stream, all string
	// sandbox returns the sandbox a subject names, or an error for a subject that
	// names none.
	sandbox func(subject string) (string, error)
	// consumer is the durable consumer that serves a sandbox's subjects.
	consumer func(sandbox string) string
}

var (
	jobSubjects = subjects{stream: wire.StreamExec, all: execAll, consumer: wire.ConsumerName,
		sandbox: func(s string) (string, error) { _, sb, err := wire.ParseExecSubject(s); return sb, err }}
	sessionSubjects = subjects{stream: wire.StreamSessions, all: wire.SubjectPrefixSession + ".>", consumer: wire.SessionOpenerName,
		sandbox: func(s string) (string, error) { _, sb, _, err := wire.ParseSessionSubject(s); return sb, err }}
)

// served reports whether any worker of the fleet serves the sandbox's subjects.
func (s subjects) served(ctx context.Context, js jetstream.JetStream, sandbox string) (bool, error) {
	_, err := js.Consumer(ctx, s.stream, s.consumer(sandbox))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Sweeps. A subject no consumer can take is noted when one of its messages is seen,
// and the stream's sweep removes the noted subjects' messages: it purges a subject of
// a sandbox no worker serves (its messages were answered as they were seen), and
// deletes those of a subject that names no sandbox. A sweep is the fleet's background
// work, one of a stream at a time however many messages ask (a tenant's flood of them
// would fill its own queue, and the messages behind would stay); a
// sweep asked for while one runs, or cut short by its deadline, runs after it.
const (
	sweepIdle    = iota
	sweepQueued            // queued or running
	sweepAgain             // asked for again while queued or running
	notedMax     = 100_000 // subjects noted and not swept yet, per stream
	sweepPasses  = 2       // a subject is swept again 200 ms later: its message may not have been stored
	literalBatch = 1000    // messages a deleteLiteral looks at before it checks its deadline
)

// sweepSoon notes the subject of m, just seen, and sweeps the stream of s.
func (t *triage) sweepSoon(s subjects, m *nats.Msg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := t.noted[s.stream]; len(n) < notedMax {
		n[m.Subject] = sweepPasses
	}
	switch t.sweeps[s.stream] {
	case sweepIdle:
		t.queueSweep(s, m)
	case sweepQueued:
		t.sweeps[s.stream] = sweepAgain
	}
}

// queueSweep queues a sweep of the stream of s; t.mu is held.
func (t *triage) queueSweep(s subjects, m *nats.Msg) {
	t.sweeps[s.stream] = sweepIdle
	if t.bg.run("", m, func(ctx context.Context) { t.sweepOnce(ctx, s, m) }) {
		t.sweeps[s.stream] = sweepQueued
	}
}

// sweepOnce sweeps the stream of s and queues the next sweep if one was asked for
// meanwhile or this one left noted subjects.
func (t *triage) sweepOnce(ctx context.Context, s subjects, m *nats.Msg) {
	t.sweep(ctx, s)
	sleep(ctx, 200*time.Millisecond)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sweeps[s.stream] == sweepAgain || len(t.noted[s.stream]) > 0 {
		t.queueSweep(s, m)
		return
	}
	t.sweeps[s.stream] = sweepIdle
}

// sweep removes the messages of the noted subjects of s that no worker serves or can.
// A subject it did not finish stays noted.
func (t *triage) sweep(ctx context.Context, s subjects) {
	t.mu.Lock()
	noted := t.noted[s.stream]
	t.noted[s.stream] = map[string]int{}
	t.mu.Unlock()
	stream, err := t.js.Stream(ctx, s.stream)
	known := map[string]bool{} // by sandbox: whether a worker serves it
	for subject, passes := range noted {
		left := passes - 1
		if err != nil || ctx.Err() != nil || !t.remove(ctx, s, stream, subject, known) {
			left = passes
		}
		if left > 0 {
			t.mu.Lock()
			t.noted[s.stream][subject] = max(t.noted[s.stream][subject], left)
			t.mu.Unlock()
		}
	}
}

// remove removes the messages of subject of stream s if no worker serves its sandbox
// or it names none, and says whether it is done with it.
func (t *triage) remove(ctx context.Context, s subjects, stream jetstream.Stream, subject string, known map[string]bool) bool {
	sandbox, err := s.sandbox(subject)
	switch {
	case err != nil && strings.ContainsAny(subject, "*>"):
		return deleteLiteral(ctx, stream, subject)
	case err == nil:
		served, ok := known[sandbox]
		if !ok {
			if served, err = s.served(ctx, t.js, sandbox); err != nil {
				return false
			}
			known[sandbox] = served
		}
		if served {
			return true
		}
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		t.log.Warn("purge messages no worker can take", "stream", s.stream, "subject", subject, "err", err)
		return false
	}
	return true
}

// sweepAll removes, at start, the messages of every subject of both streams that
// names no sandbox: those published while no worker ran were seen by no subscription.
func (t *triage) sweepAll() {
	for _, s := range []subjects{jobSubjects, sessionSubjects} {
		t.bg.run("", &nats.Msg{}, func(ctx context.Context) {
			stream, err := t.js.Stream(ctx, s.stream)
			if err != nil {
				return
			}
			info, err := stream.Info(ctx, jetstream.WithSubjectFilter(s.all))
			if err != nil {
				return
			}
			for subject := range info.State.Subjects {
				if _, err := s.sandbox(subject); err != nil {
					t.sweepSoon(s, &nats.Msg{Subject: subject})
				}
			}
		})
	}
}

// deleteLiteral removes the messages whose subject is literally subject, one that
// holds a wildcard token ("jazzmine.exec.<tenant>.*", published as it is): purging
// by it would take every subject it matches, other sandboxes' jobs with them. It
// reports whether it looked at every message the subject matches before ctx ended.
func deleteLiteral(ctx context.Context, stream jetstream.Stream, subject string) bool {
	var from uint64
	for {
		complete, err := scan(ctx, stream, subject, from, literalBatch, func(msg *jetstream.RawStreamMsg) bool {
			if msg.Subject == subject {
				_ = stream.DeleteMsg(ctx, msg.Sequence)
			}
			from = msg.Sequence + 1
			return true
		})
		if err != nil || ctx.Err() != nil {
			return false
		}
		if complete {
			return true
		}
	}
}

// identify reads what a job message says about itself for an error event: a usable
// execution id (or ""), its encoding (JSON when the header names none that is known),
// and its metadata.
func identify(h nats.Header, data []byte) (id, ct string, meta map[string]string) {
	id = h.Get(wire.HeaderMsgID)
	ct, err := wire.ParseContentType(h.Get(wire.HeaderContentType))
	if err != nil {
		ct = wire.ContentTypeJSON
	}
	job, err := wire.DecodeJob(ct, data)
	if err != nil {
		return ownedID(nil, id), ct, nil
	}
	return ownedID(job, id), ct, job.Metadata
}

// seeSession is see for a session call: one of a sandbox no worker serves (no opener
// consumer) gets invalid_job, and the sweep removes its session's calls (a call of
// another session published while no worker ran at all waits for the first worker of
// its sandbox); a call on a subject that names no session (a literal wildcard) is
// removed by the sweep too. Either would hold room until the stream's max age (a
// flood of them would refuse every session's calls). Should an opener
// come first, it skips such a call, since it has its end (opener.go).
func (t *triage) seeSession(m *nats.Msg) {
	tenant, sandbox, _, err := wire.ParseSessionSubject(m.Subject)
	if err == nil && t.served[sandbox] {
		return
	}
	t.sweepSoon(sessionSubjects, m)
	if err != nil {
		return
	}
	t.bg.run(tenant, m, func(ctx context.Context) {
		if exists, err := sessionSubjects.served(ctx, t.js, sandbox); err == nil && !exists {
			t.unknown(tenant, sandbox, m)
		}
	})
}
