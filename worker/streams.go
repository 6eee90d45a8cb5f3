package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// ensureStreams creates or updates the jobs, events and session streams, the files
// bucket, the key-value buckets and the consumers of each sandbox, so that every
// worker of a fleet converges on the same definitions whichever starts first.
func (w *Worker) ensureStreams(ctx context.Context) error {
	c := &w.cfg
	streams := []jetstream.StreamConfig{{
		Name:        wire.StreamExec,
		Description: "jazzmine jobs, one subject per sandbox (and tenant)",
		Subjects:    []string{execAll},
		Retention:   jetstream.WorkQueuePolicy,
		Duplicates:  c.DuplicateWindow,
		// Bounded as below; a tenant's jobs of a sandbox are one subject.
	}, {
		Name:        wire.StreamEvents,
		Description: "jazzmine execution events, one subject per execution and type",
		Subjects:    []string{wire.AllEventsWildcard},
		MaxAge:      c.EventsMaxAge,
		Duplicates:  min(c.DuplicateWindow, c.EventsMaxAge),
	}, {
		Name:        wire.StreamSessions,
		Description: "jazzmine session calls, one subject per session",
		Subjects:    []string{wire.SessionWildcard, tenantSessionAll},
		MaxAge:      c.SessionMaxLife + c.EventsMaxAge,
		Duplicates:  c.DuplicateWindow,
		// A call is deleted once done with (run, or answered): what the stream holds
		// is waiting, and a full stream refuses a call rather than drop a waiting one
		// of another session (one that kept them and dropped the oldest let a flood
		// of one session's calls lose another's). One session is one subject.
	}}
	for _, cfg := range streams {
		cfg.Replicas, cfg.Storage = c.Replicas, jetstream.FileStorage
		if cfg.Name != wire.StreamEvents {
			// The backlog's bounds: a publish beyond them fails, and each subject
			// (a tenant's jobs of a sandbox, a session's calls) has its own.
			cfg.Discard, cfg.MaxMsgs, cfg.MaxBytes = jetstream.DiscardNew, c.MaxBacklog, c.MaxBacklogBytes
			cfg.MaxMsgsPerSubject, cfg.DiscardNewPerSubject = max(c.TenantBacklog, -1), c.TenantBacklog > 0
			if err := w.keepStored(ctx, &cfg); err != nil {
				return err
			}
		}
		stream, err := w.js.CreateOrUpdateStream(ctx, cfg)
		if err != nil {
			return fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
		}
		switch cfg.Name {
		case wire.StreamEvents:
			w.events.stream = stream
		case wire.StreamSessions:
			w.sessions.stream = stream
		}
	}
	var err error
	w.files.store, err = w.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      wire.FilesBucket,
		Description: "jazzmine input files, artifacts and display images; they expire with the events",
		TTL:         c.EventsMaxAge,
		MaxBytes:    c.FilesMaxBytes,
		Replicas:    c.Replicas,
		Storage:     jetstream.FileStorage,
	})
	// Each tenant's bucket is made at the first store of its artifacts (files.bucket).
	w.files.tenantCfg = jetstream.ObjectStoreConfig{
		Description: "a jazzmine tenant's artifacts and display images; they expire with the events",
		TTL:         c.EventsMaxAge,
		MaxBytes:    c.TenantFilesMaxBytes,
		Replicas:    c.Replicas,
		Storage:     jetstream.FileStorage,
	}
	if err != nil {
		return fmt.Errorf("create or update object store %s: %w", wire.FilesBucket, err)
	}
	if err := w.ensureBuckets(ctx); err != nil {
		return err
	}
	return w.ensureConsumers(ctx)
}

// keepStored keeps what an existing stream holds from the server's making room for
// cfg: while a subject holds more messages than cfg's lower bound per subject, the
// bound stays where it is (the server would delete the oldest, jobs or calls that
// were accepted); a stream that dropped its oldest when full and holds more than half
// cfg's bounds goes on doing so (an earlier version's sessions stream kept every call
// once run: refusing new calls, it would refuse every one until they aged out). Either is logged; a later start applies cfg.
func (w *Worker) keepStored(ctx context.Context, cfg *jetstream.StreamConfig) error {
	stream, err := w.js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("look up stream %s: %w", cfg.Name, err)
	}
	old, st := stream.CachedInfo().Config, stream.CachedInfo().State
	if old.Discard == jetstream.DiscardOld && cfg.Discard == jetstream.DiscardNew &&
		(cfg.MaxMsgs > 0 && int64(st.Msgs) > cfg.MaxMsgs/2 || cfg.MaxBytes > 0 && int64(st.Bytes) > cfg.MaxBytes/2) {
		w.log.Warn("a stream keeps dropping its oldest messages for now: it holds more than half its bounds, messages an earlier version kept",
			"stream", cfg.Name, "msgs", st.Msgs, "bytes", st.Bytes, "max_backlog", cfg.MaxMsgs, "max_backlog_bytes", cfg.MaxBytes)
		cfg.Discard, cfg.MaxMsgsPerSubject, cfg.DiscardNewPerSubject = jetstream.DiscardOld, old.MaxMsgsPerSubject, false
		return nil
	}
	if cfg.MaxMsgsPerSubject <= 0 || (old.MaxMsgsPerSubject > 0 && old.MaxMsgsPerSubject <= cfg.MaxMsgsPerSubject) {
		return nil
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(cfg.Subjects[0]))
	if err != nil {
		return fmt.Errorf("count the queued messages of stream %s: %w", cfg.Name, err)
	}
	for subject, n := range info.State.Subjects {
		if int64(n) > cfg.MaxMsgsPerSubject {
			w.log.Warn("a stream's bound per subject (tenant_backlog) is not lowered yet: a subject holds more messages than it, which the server would delete",
				"stream", cfg.Name, "subject", subject, "queued", n, "tenant_backlog", cfg.MaxMsgsPerSubject, "kept", old.MaxMsgsPerSubject)
			cfg.MaxMsgsPerSubject, cfg.DiscardNewPerSubject = old.MaxMsgsPerSubject, old.DiscardNewPerSubject
			return nil
		}
	}
	return nil
}

// ensureBuckets creates or updates the key-value buckets and hands them to the parts
// that use them.
func (w *Worker) ensureBuckets(ctx context.Context) error {
	c := &w.cfg
	for _, b := range []jetstream.KeyValueConfig{
		{Bucket: BucketWorkers, Description: "live jazzmine workers", TTL: c.LivenessTTL},
		{Bucket: BucketCancels, Description: "cancelled jazzmine executions", TTL: c.EventsMaxAge},
		{Bucket: BucketFleet, Description: "jazzmine workers of this fleet, alive or dead", TTL: FleetMemory},
		{Bucket: BucketSessions, Description: "jazzmine sessions: their worker, or why they ended", TTL: c.SessionMaxLife + c.EventsMaxAge},
		{Bucket: wire.SandboxesBucket, Description: "jazzmine sandboxes the fleet serves: their tools and limits", TTL: SandboxesTTL},
	} {
		b.Replicas, b.History = c.Replicas, 1
		kv, err := w.js.CreateOrUpdateKeyValue(ctx, b)
		if err != nil {
			return fmt.Errorf("create or update bucket %s: %w", b.Bucket, err)
		}
		switch b.Bucket {
		case BucketWorkers:
			w.live.workers = kv
		case BucketCancels:
			w.cancels.kv = kv
		case BucketFleet:
			w.live.fleet = kv
		case BucketSessions:
			w.sessions.kv = kv
		case wire.SandboxesBucket:
			w.catalog.kv = kv
		}
	}
	return nil
}

// ensureConsumers creates or updates each sandbox's jobs consumer and session opener.
func (w *Worker) ensureConsumers(ctx context.Context) error {
	c := &w.cfg
	for _, sb := range c.Sandboxes {
		cons, err := w.js.CreateOrUpdateConsumer(ctx, wire.StreamExec, jetstream.ConsumerConfig{
			Durable:        wire.ConsumerName(sb.Name),
			Description:    "jobs of sandbox " + sb.Name,
			FilterSubjects: tenantExecSubjects(sb.Name),
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        c.AckWait,
			// Unlimited: the worker counts the deliveries, and the one after the
			// last publishes the job's end instead of running it (ended.go).
			MaxDeliver:    -1,
			MaxAckPending: sb.MaxAckPending,
			Replicas:      c.Replicas,
		})
		if err != nil {
			return fmt.Errorf("create or update consumer for sandbox %q: %w", sb.Name, err)
		}
		w.producer.consumers[sb.Name] = cons
		opener, err := w.ensureOpener(ctx, jetstream.ConsumerConfig{
			Durable:        wire.SessionOpenerName(sb.Name),
			Description:    "calls of sandbox " + sb.Name + "'s sessions, to open and answer for them",
			FilterSubjects: tenantSessionSubjects(sb.Name),
			// From the first call stored, as the jobs consumer: a call published
			// while no worker served the sandbox yet runs when the first one comes.
			// One that another worker answered meanwhile (an unknown sandbox) has its
			// end, and the opener skips it (session.go).
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       c.AckWait,
			MaxDeliver:    -1,
			// Unlimited: the opener holds the last call of every live session until it
			// has its end (session.go); at the default 1,000, when it held every call,
			// one session's queue of calls kept the sandbox's others from opening.
			MaxAckPending: -1,
			Replicas:      c.Replicas,
		})
		if err != nil {
			return fmt.Errorf("create or update the session opener of sandbox %q: %w", sb.Name, err)
		}
		w.sessions.openers[sb.Name] = opener
	}
	return nil
}

// ensureOpener creates or updates a session opener. An opener a fleet made before
// keeps its deliver policy, which JetStream does not let an update change (openers
// used to deliver only the calls stored after they were made).
func (w *Worker) ensureOpener(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	old, err := w.js.Consumer(ctx, wire.StreamSessions, cfg.Durable)
	switch {
	case err == nil:
		kept := old.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartTime = kept.DeliverPolicy, kept.OptStartTime
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, err
	}
	return w.js.CreateOrUpdateConsumer(ctx, wire.StreamSessions, cfg)
}

// scan calls f with each message of stream whose subject matches filter, in order,
// from stream sequence from (the first, for 0) to the last one stored when it starts,
// until f returns false; it reads at most limit of them and says whether it read
// them all. It gets them one at a time: a work queue takes no second consumer over
// subjects its consumers filter, and a message deleted meanwhile is skipped. Only
// rare paths use it (a cancel, a job no worker can take, a session's end).
func scan(ctx context.Context, stream jetstream.Stream, filter string, from uint64, limit int, f func(*jetstream.RawStreamMsg) bool) (complete bool, err error) {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil || len(info.State.Subjects) == 0 {
		return err == nil, err
	}
	seq, last := max(info.State.FirstSeq, from), info.State.LastSeq
	for range limit {
		msg, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if !f(msg) || msg.Sequence >= last {
			return true, nil
		}
		seq = msg.Sequence + 1
	}
	return false, nil
}
