package worker

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// triage sees every job published (one worker of the fleet, queue group) and answers
// those for a sandbox that no worker serves: the jobs stream captures
// jazzmine.exec.>, but only sandboxes with a durable consumer are ever pulled. Such a
// job gets an invalid_job error and a script_done, and its subject is purged so that
// it does not sit in the backlog.
func (w *Worker) triage(m *nats.Msg) {
	tenant, sandbox, err := parseExecSubject(m.Subject)
	if err != nil {
		// A subject no consumer can ever match (a literal wildcard, a character no
		// sandbox name has): nothing would take it, and it would hold backlog room
		// for good.
		w.goBackground(tenantToken(m.Subject), m, w.purgeUnserved)
		return
	}
	if _, ok := w.consumers[sandbox]; ok {
		return // ours: the common case costs a map lookup
	}
	w.goBackground(tenant, m, func(ctx context.Context) {
		if exists, err := w.consumerExists(ctx, sandbox); err != nil || exists {
			return
		}
		id, ct, meta := identify(m.Header, m.Data)
		msg := fmt.Sprintf("unknown sandbox %q: no worker serves it (this worker serves %s)", sandbox, strings.Join(w.sandboxNames(), ", "))
		w.log.Warn("job for an unknown sandbox", "sandbox", sandbox, "execution_id", id)
		if id != "" {
			p := w.newPublisher(execRef{tenant, id}, 1, ct, meta)
			if err := p.terminal(wire.KindInvalidJob, msg); err != nil {
				w.log.Warn("publish the error of a job for an unknown sandbox", "execution_id", id, "err", err)
			}
		}
		w.purgeUnserved(ctx)
	})
}

// tenantToken is the tenant token of a job subject that does not parse: the third
// token of jazzmine.exec.<tenant>.<...> (or "" for a subject of three tokens), so
// that its purge is queued as that tenant's background work.
func tenantToken(subject string) string {
	tokens := strings.Split(subject, ".")
	if len(tokens) < 4 {
		return ""
	}
	return tokens[2]
}

// purgeUnserved removes the jobs of every subject that no consumer serves, or can:
// one that is no job subject at all.
func (w *Worker) purgeUnserved(ctx context.Context) {
	stream, err := w.js.Stream(ctx, wire.StreamExec)
	if err != nil {
		return
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(execAll))
	if err != nil {
		return
	}
	for subject := range info.State.Subjects {
		_, sandbox, err := parseExecSubject(subject)
		if err == nil {
			exists, err := w.consumerExists(ctx, sandbox)
			if err != nil || exists {
				continue
			}
		}
		if strings.ContainsAny(subject, "*>") {
			deleteLiteral(ctx, stream, subject)
			continue
		}
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
			w.log.Warn("purge jobs of an unknown sandbox", "subject", subject, "err", err)
		}
	}
}

// literalDeleteMax bounds how many messages one deleteLiteral removes.
const literalDeleteMax = 1000

// deleteLiteral removes the messages whose subject is literally subject, one that
// holds a wildcard token ("jazzmine.exec.<tenant>.*", published as it is): purging
// by it would take every subject it matches, other sandboxes' jobs with them.
func deleteLiteral(ctx context.Context, stream jetstream.Stream, subject string) {
	var seq uint64 = 1
	for range literalDeleteMax {
		msg, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if err != nil {
			return
		}
		if msg.Subject == subject {
			_ = stream.DeleteMsg(ctx, msg.Sequence)
		}
		seq = msg.Sequence + 1
	}
}

func (w *Worker) sandboxNames() []string {
	var names []string
	for _, sb := range w.cfg.Sandboxes {
		names = append(names, sb.Name)
	}
	slices.Sort(names)
	return names
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
