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
	sweeps map[string]bool  // a sweep of the stream is queued (sweepSoon)
	calls  map[seenCall]int // noted calls not swept yet, and how often swept and not found
}

func newTriage(js jetstream.JetStream, sandboxes []Sandbox, ev *events, bg *background, log *slog.Logger) *triage {
	t := &triage{js: js, log: log, served: map[string]bool{}, events: ev, bg: bg, sweeps: map[string]bool{}, calls: map[seenCall]int{}}
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
	t.bg.run(tenant, m, func(ctx context.Context) {
		if exists, err := jobSubjects.served(ctx, t.js, sandbox); err != nil || exists {
			return
		}
		t.unknown(tenant, sandbox, m)
		t.sweepSoon(jobSubjects, m)
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

// sweepSoon sweeps the stream of s (sweep) for a message m just seen, as the fleet's
// background work: one sweep of a stream at a time, queued once however many
// messages ask for one (a tenant's flood of them would have dropped its own, and the
// messages that asked stayed for the stream's max age: a review's attack). A sweep
// asked for while one runs runs after it.
func (t *triage) sweepSoon(s subjects, m *nats.Msg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sweeps[s.stream] {
		return
	}
	t.sweeps[s.stream] = t.bg.run("", m, func(ctx context.Context) {
		t.mu.Lock()
		t.sweeps[s.stream] = false
		t.mu.Unlock()
		// The subscription that saw m may get it before the stream has stored it:
		// looked at again, twice at most, while nothing is removed or noted calls
		// were not found.
		for try := range 3 {
			removed := t.sweep(ctx, s, true)
			t.mu.Lock()
			pending := s.stream == wire.StreamSessions && len(t.calls) > 0
			t.mu.Unlock()
			if removed > 0 && !pending || try == 2 {
				return
			}
			sleep(ctx, 200*time.Millisecond)
		}
	})
}

// sweepAll sweeps both streams once, at start, of what no consumer can ever take:
// what was published while no worker ran is seen by no subscription.
func (t *triage) sweepAll() {
	for _, s := range []subjects{jobSubjects, sessionSubjects} {
		t.bg.run("", &nats.Msg{}, func(ctx context.Context) { t.sweep(ctx, s, false) })
	}
}

// sweep removes from the stream of s the messages of every subject that names no
// sandbox, and says how many subjects and calls it removed. Seen live, it also
// removes those of sandboxes no worker serves, answered with invalid_job unless they
// have their end: in the jobs stream every job of such a sandbox, in the sessions
// stream the calls noted (seeSession).
func (t *triage) sweep(ctx context.Context, s subjects, live bool) (removed int) {
	stream, err := t.js.Stream(ctx, s.stream)
	if err != nil {
		return 0
	}
	known := map[string]bool{}
	served := func(sandbox string) bool {
		v, ok := known[sandbox]
		if !ok {
			var err error
			if v, err = s.served(ctx, t.js, sandbox); err != nil {
				return true // not known: left alone
			}
			known[sandbox] = v
		}
		return v
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(s.all))
	if err != nil {
		return 0
	}
	for subject := range info.State.Subjects {
		sandbox, err := s.sandbox(subject)
		switch {
		case err != nil && strings.ContainsAny(subject, "*>"):
			deleteLiteral(ctx, stream, subject)
		case err != nil:
			if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
				t.log.Warn("purge messages that name no sandbox", "stream", s.stream, "subject", subject, "err", err)
			}
		case live && s.stream == wire.StreamExec && !served(sandbox):
			t.purgeUnserved(ctx, stream, subject, sandbox)
		default:
			continue
		}
		removed++
	}
	if live && s.stream == wire.StreamSessions {
		removed += t.sweepCalls(ctx, stream, served)
	}
	if removed > 0 {
		t.log.Info("removed what no worker can take", "stream", s.stream, "removed", removed)
	}
	return removed
}

// purgeUnserved answers each message of subject, whose sandbox no worker serves,
// unless it has its end (the triage that saw it answered it), and removes it.
func (t *triage) purgeUnserved(ctx context.Context, stream jetstream.Stream, subject, sandbox string) {
	tenant := tenantOf(subject)
	var through uint64
	_, _ = scan(ctx, stream, subject, 0, literalDeleteMax, func(m *jetstream.RawStreamMsg) bool {
		if !t.answer(ctx, tenant, sandbox, m) {
			return false
		}
		through = m.Sequence
		return true
	})
	if through == 0 {
		return
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(through+1)); err != nil {
		t.log.Warn("purge the messages of an unknown sandbox", "subject", subject, "err", err)
	}
}

// literalDeleteMax bounds how many messages one deleteLiteral removes.
const literalDeleteMax = 1000

// deleteLiteral removes the messages whose subject is literally subject, one that
// holds a wildcard token ("jazzmine.exec.<tenant>.*", published as it is): purging
// by it would take every subject it matches, other sandboxes' jobs with them.
func deleteLiteral(ctx context.Context, stream jetstream.Stream, subject string) {
	_, _ = scan(ctx, stream, subject, 0, literalDeleteMax, func(msg *jetstream.RawStreamMsg) bool {
		if msg.Subject == subject {
			_ = stream.DeleteMsg(ctx, msg.Sequence)
		}
		return true
	})
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

// seeSession is see for a session call. A call of a sandbox this worker does not serve
// is noted, and the sweep of the sessions stream answers it with invalid_job and
// removes it if no worker serves its sandbox (a call published while no worker ran
// at all waits for the first worker of its sandbox). A call on a subject that names
// no session (a literal wildcard) is removed by the sweep too. Either would hold room
// until the stream's max age (a flood of them refused every session's calls, a
// review's attack). The note, not a task a call, is what a flood cannot drop: a
// tenant's background queue is bounded. Should an opener come first, it skips such a
// call, since it has its end (opener.go).
func (t *triage) seeSession(m *nats.Msg) {
	_, sandbox, _, err := wire.ParseSessionSubject(m.Subject)
	if err == nil && t.served[sandbox] {
		return
	}
	if err == nil {
		t.mu.Lock()
		if len(t.calls) < seenCallsMax {
			t.calls[seenCall{m.Subject, m.Header.Get(wire.HeaderMsgID)}] = 0
		}
		t.mu.Unlock()
	}
	t.sweepSoon(sessionSubjects, m)
}

// seenCall is a session call of a sandbox this worker does not serve: its subject and
// its Nats-Msg-Id.
type seenCall struct{ subject, id string }

// seenCallsMax bounds the calls noted and not swept yet: the default max_backlog.
const seenCallsMax = DefaultMaxBacklog

// sweepCalls answers and removes the noted calls of sandboxes no worker serves.
func (t *triage) sweepCalls(ctx context.Context, stream jetstream.Stream, served func(string) bool) (removed int) {
	t.mu.Lock()
	calls := t.calls
	t.calls = map[seenCall]int{}
	t.mu.Unlock()
	for c, tries := range calls {
		tenant, sandbox, _, _ := wire.ParseSessionSubject(c.subject)
		if served(sandbox) {
			continue
		}
		found := false
		_, _ = scan(ctx, stream, c.subject, 0, literalDeleteMax, func(m *jetstream.RawStreamMsg) bool {
			if found = m.Header.Get(wire.HeaderMsgID) == c.id; !found {
				return true
			}
			if t.answer(ctx, tenant, sandbox, m) {
				_ = stream.DeleteMsg(ctx, m.Sequence)
				removed++
			}
			return false
		})
		// Not stored yet (the subscription got it first), or never (a duplicate the
		// stream dropped): looked for again by the next sweeps, three in all.
		if !found && tries < 2 {
			t.mu.Lock()
			t.calls[c] = max(t.calls[c], tries+1)
			t.mu.Unlock()
		}
	}
	return removed
}

// answer answers m, a message of a sandbox no worker serves, with invalid_job unless
// it has its end already; it reports whether m has its end now.
func (t *triage) answer(ctx context.Context, tenant, sandbox string, m *jetstream.RawStreamMsg) bool {
	id, _, _ := identify(m.Header, m.Data)
	if id == "" {
		return true // nothing is owed a message with no id of its own
	}
	ended, err := t.events.ended(ctx, execRef{tenant, id}.key())
	if err != nil {
		return false // kept, to be answered by a later sweep
	}
	if !ended {
		t.unknown(tenant, sandbox, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	}
	return true
}
