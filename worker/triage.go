package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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
}

func newTriage(js jetstream.JetStream, sandboxes []Sandbox, ev *events, bg *background, log *slog.Logger) *triage {
	t := &triage{js: js, log: log, served: map[string]bool{}, events: ev, bg: bg}
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
		t.bg.run(tenantToken(m.Subject, 3), m, t.purgeSoon)
		return
	}
	if t.served[sandbox] {
		return // ours: the common case costs a map lookup
	}
	t.bg.run(tenant, m, func(ctx context.Context) {
		if exists, err := consumerExists(ctx, t.js, sandbox); err != nil || exists {
			return
		}
		t.unknown(tenant, sandbox, m)
		t.purgeSoon(ctx)
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

// tenantToken is the tenant token of a subject that does not parse: the third token
// of jazzmine.exec.<tenant>.<...> or jazzmine.session.<tenant>.<...>, or "" for a
// subject of no more than the plain tokens of the fleet's own account (3 for a job,
// 4 for a session call), so that its removal is queued as that tenant's background
// work.
func tenantToken(subject string, plain int) string {
	tokens := strings.Split(subject, ".")
	if len(tokens) <= plain {
		return ""
	}
	return tokens[2]
}

// purgeSoon is purgeUnserved for a job just seen: the subscription that saw it may
// get it before the stream has stored it, so it looks again, twice at most, while
// it removes nothing (a job left would hold backlog room until another came).
func (t *triage) purgeSoon(ctx context.Context) {
	for range 3 {
		if t.purgeUnserved(ctx) > 0 {
			return
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// purgeUnserved removes the jobs of every subject that no consumer serves, or can
// (one that is no job subject at all), and says how many subjects it found.
func (t *triage) purgeUnserved(ctx context.Context) (removed int) {
	stream, err := t.js.Stream(ctx, wire.StreamExec)
	if err != nil {
		return 0
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(execAll))
	if err != nil {
		return 0
	}
	for subject := range info.State.Subjects {
		_, sandbox, err := wire.ParseExecSubject(subject)
		if err == nil {
			exists, err := consumerExists(ctx, t.js, sandbox)
			if err != nil || exists {
				continue
			}
		}
		removed++
		if strings.ContainsAny(subject, "*>") {
			deleteLiteral(ctx, stream, subject)
			continue
		}
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
			t.log.Warn("purge jobs of an unknown sandbox", "subject", subject, "err", err)
		}
	}
	return removed
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

// seeSession is see for a session call: one of a sandbox no worker serves (no opener
// consumer) gets invalid_job, and is deleted from the sessions stream, where it would
// hold room until the stream's max age (a flood of them refused every session's
// calls, a review's attack). Should an opener come first, it skips it, since it has
// its end (opener.go).
func (t *triage) seeSession(m *nats.Msg) {
	tenant, sandbox, _, err := wire.ParseSessionSubject(m.Subject)
	switch {
	case err != nil:
		// A call no opener can take apart (a tenant's literal '*' token), which
		// would hold room in the stream until its max age.
		t.bg.run(tenantToken(m.Subject, 4), m, func(ctx context.Context) { t.dropCall(ctx, m) })
		return
	case t.served[sandbox]:
		return
	}
	t.bg.run(tenant, m, func(ctx context.Context) {
		if _, err := t.js.Consumer(ctx, wire.StreamSessions, wire.SessionOpenerName(sandbox)); errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.unknown(tenant, sandbox, m)
			t.dropCall(ctx, m)
		}
	})
}

// dropCall deletes session call m from the sessions stream: the call of its subject
// with its Nats-Msg-Id, looked for twice while the stream may not have stored it yet.
func (t *triage) dropCall(ctx context.Context, m *nats.Msg) {
	stream, err := t.js.Stream(ctx, wire.StreamSessions)
	if err != nil {
		return
	}
	id, found := m.Header.Get(wire.HeaderMsgID), false
	for try := 0; try < 2 && !found; try++ {
		if try > 0 {
			sleep(ctx, 100*time.Millisecond)
		}
		_, _ = scan(ctx, stream, m.Subject, 0, literalDeleteMax, func(got *jetstream.RawStreamMsg) bool {
			// The subject may hold a literal wildcard, which the filter takes as one.
			if found = got.Subject == m.Subject && got.Header.Get(wire.HeaderMsgID) == id; found {
				_ = stream.DeleteMsg(ctx, got.Sequence)
			}
			return !found
		})
	}
}
