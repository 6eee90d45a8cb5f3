package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// topology is what the worker uses of the fleet's NATS: the streams, the buckets and
// each sandbox's consumers. makeTopology creates or updates them before any part is
// built, so that every worker of a fleet converges on the same definitions whichever
// starts first, and the parts get them in their constructors.
type topology struct {
	events, sessions jetstream.Stream
	files            jetstream.ObjectStore
	// tenantFiles is the config of a tenant's bucket but its name: each is made at
	// the first store of its artifacts (files.bucket).
	tenantFiles                                   jetstream.ObjectStoreConfig
	workers, fleet, cancels, sessionKV, sandboxes jetstream.KeyValue
	jobs, openers                                 map[string]jetstream.Consumer // by sandbox
}

// makeTopology creates or updates the jobs, events and session streams, the files
// bucket, the key-value buckets and the consumers of each sandbox. The jobs and
// sessions streams take this worker's sandboxes' subjects besides those they have
// (served.go).
func makeTopology(ctx context.Context, js jetstream.JetStream, c *Config) (*topology, error) {
	t := &topology{}
	if err := t.makeBuckets(ctx, js, c); err != nil {
		return nil, err
	}
	// The served subjects change under the fleet's lock (served.go), and the
	// consumers are made under it too: nats-server v2.15.2 races a stream's config
	// update with the creation of a consumer on it (fileStore.UpdateConfig against
	// fileStore.ConsumerStore, which the race detector reports when workers start at
	// once), so no worker's start overlaps another's.
	err := withSubjectsLock(ctx, t.fleet, c.WorkerID, func() error {
		for _, step := range []func(context.Context, jetstream.JetStream, *Config) error{t.makeStreams, t.makeFiles, t.makeConsumers} {
			if err := step(ctx, js, c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// streamMaxConsumers bounds each stream's consumers. nats-server (2.12 and later)
// caps a stream that sets no bound at 1,000 consumers (JSDefaultMaxConsumersPerStream),
// and -1, "unlimited", counts as not set: every open session is a consumer of the
// sessions stream, and every execution read after the client's live window one of the
// events stream, so the default would end the fleet's 1,000th open session with
// "maximum consumers limit reached" (BenchmarkScale found it). The fleet's own bounds
// are the workers' max_sessions and the servers' memory; this one only stays out of
// their way. A tenant's events stream, in its own account, has that account's bound
// (auth.conf's max_consumers). The files bucket's stream keeps the default: its
// consumers are the reads of input files under way, a few at a time.
const streamMaxConsumers = 1_000_000

// consumersBound is the bound of consumers the worker's streams get: none of its own
// (the account's applies) when the account has a bound, which then replaces the
// server's default and which a stream's may not exceed; streamMaxConsumers otherwise.
func consumersBound(ctx context.Context, js jetstream.JetStream) (int, error) {
	info, err := js.AccountInfo(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the account's JetStream limits: %w", err)
	}
	if info.Limits.MaxConsumers > 0 {
		return 0, nil
	}
	for _, tier := range info.Tiers {
		if tier.Limits.MaxConsumers > 0 {
			return 0, nil
		}
	}
	return streamMaxConsumers, nil
}

// makeStreams creates or updates the streams.
func (t *topology) makeStreams(ctx context.Context, js jetstream.JetStream, c *Config) error {
	streams := []jetstream.StreamConfig{{
		Name:        wire.StreamExec,
		Description: "jazzmine jobs, one subject per sandbox (and tenant): the sandboxes the fleet serves",
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
		Description: "jazzmine session calls, one subject per session, of the sandboxes the fleet serves",
		MaxAge:      c.SessionMaxLife + c.EventsMaxAge,
		Duplicates:  c.DuplicateWindow,
		// A call is deleted once done with (run, or answered): what the stream holds
		// is waiting, and a full stream refuses a call rather than drop a waiting one
		// of another session (one that kept them and dropped the oldest let a flood
		// of one session's calls lose another's). One session is one subject.
	}}
	maxConsumers, err := consumersBound(ctx, js)
	if err != nil {
		return err
	}
	for _, cfg := range streams {
		cfg.Replicas, cfg.Storage, cfg.MaxConsumers = c.Replicas, jetstream.FileStorage, maxConsumers
		if err := t.makeStream(ctx, js, c, cfg); err != nil {
			return err
		}
	}
	return nil
}

// makeStream creates or updates one stream; the jobs and sessions streams take this
// worker's sandboxes' subjects besides those they have.
func (t *topology) makeStream(ctx context.Context, js jetstream.JetStream, c *Config, cfg jetstream.StreamConfig) error {
	old, err := js.Stream(ctx, cfg.Name)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("look up stream %s: %w", cfg.Name, err)
	}
	for _, s := range servedStreams {
		if s.name != cfg.Name {
			continue
		}
		var subjects []string
		if old != nil {
			subjects = old.CachedInfo().Config.Subjects
		}
		earlier, err := earlierVersionLives(ctx, t.workers, s, subjects)
		if err != nil {
			return err
		}
		cfg.Subjects = subjects // an earlier version's wildcard takes this worker's too
		if !earlier {
			cfg.Subjects, _ = s.mergeSubjects(subjects, sandboxNames(c.Sandboxes), nil)
		}
	}
	if cfg.Name != wire.StreamEvents {
		// The backlog's bounds: a publish beyond them fails, and each subject
		// (a tenant's jobs of a sandbox, a session's calls) has its own.
		cfg.Discard, cfg.MaxMsgs, cfg.MaxBytes = jetstream.DiscardNew, c.MaxBacklog, c.MaxBacklogBytes
		cfg.MaxMsgsPerSubject, cfg.DiscardNewPerSubject = max(c.TenantBacklog, -1), c.TenantBacklog > 0
		if old != nil {
			if err := keepStored(ctx, old, &cfg, c.Logger); err != nil {
				return err
			}
		}
	}
	stream, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil && old != nil && strings.Contains(err.Error(), "can not change MaxConsumers") {
		// Servers before 2.12 refuse the change (and have no default bound to lift).
		cfg.MaxConsumers = old.CachedInfo().Config.MaxConsumers
		stream, err = js.CreateOrUpdateStream(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
	}
	switch cfg.Name {
	case wire.StreamEvents:
		t.events = stream
	case wire.StreamSessions:
		t.sessions = stream
	}
	return nil
}

// makeFiles creates or updates the files bucket.
func (t *topology) makeFiles(ctx context.Context, js jetstream.JetStream, c *Config) error {
	var err error
	t.files, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      wire.FilesBucket,
		Description: "jazzmine input files, artifacts and display images; they expire with the events",
		TTL:         c.EventsMaxAge,
		MaxBytes:    c.FilesMaxBytes,
		Replicas:    c.Replicas,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("create or update object store %s: %w", wire.FilesBucket, err)
	}
	t.tenantFiles = jetstream.ObjectStoreConfig{
		Description: "a jazzmine tenant's artifacts and display images; they expire with the events",
		TTL:         c.EventsMaxAge,
		MaxBytes:    c.TenantFilesMaxBytes,
		Replicas:    c.Replicas,
		Storage:     jetstream.FileStorage,
	}
	return nil
}

// sandboxNames are the names of sandboxes.
func sandboxNames(sandboxes []Sandbox) []string {
	names := make([]string, len(sandboxes))
	for i, sb := range sandboxes {
		names[i] = sb.Name
	}
	return names
}

// keepStored keeps what an existing stream holds from the server's making room for
// cfg: while a subject holds more messages than cfg's lower bound per subject, the
// bound stays where it is (the server would delete the oldest, jobs or calls that
// were accepted); a stream that dropped its oldest when full and holds more than half
// cfg's bounds goes on doing so (an earlier version's sessions stream kept every call
// once run: refusing new calls, it would refuse every one until they aged out). Either is logged; a later start applies cfg.
func keepStored(ctx context.Context, stream jetstream.Stream, cfg *jetstream.StreamConfig, log *slog.Logger) error {
	old, st := stream.CachedInfo().Config, stream.CachedInfo().State
	if old.Discard == jetstream.DiscardOld && cfg.Discard == jetstream.DiscardNew &&
		(cfg.MaxMsgs > 0 && int64(st.Msgs) > cfg.MaxMsgs/2 || cfg.MaxBytes > 0 && int64(st.Bytes) > cfg.MaxBytes/2) {
		log.Warn("a stream keeps dropping its oldest messages for now: it holds more than half its bounds, messages an earlier version kept",
			"stream", cfg.Name, "msgs", st.Msgs, "bytes", st.Bytes, "max_backlog", cfg.MaxMsgs, "max_backlog_bytes", cfg.MaxBytes)
		cfg.Discard, cfg.MaxMsgsPerSubject, cfg.DiscardNewPerSubject = jetstream.DiscardOld, old.MaxMsgsPerSubject, false
		return nil
	}
	if cfg.MaxMsgsPerSubject <= 0 || (old.MaxMsgsPerSubject > 0 && old.MaxMsgsPerSubject <= cfg.MaxMsgsPerSubject) {
		return nil
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return fmt.Errorf("count the queued messages of stream %s: %w", cfg.Name, err)
	}
	for subject, n := range info.State.Subjects {
		if int64(n) > cfg.MaxMsgsPerSubject {
			log.Warn("a stream's bound per subject (tenant_backlog) is not lowered yet: a subject holds more messages than it, which the server would delete",
				"stream", cfg.Name, "subject", subject, "queued", n, "tenant_backlog", cfg.MaxMsgsPerSubject, "kept", old.MaxMsgsPerSubject)
			cfg.MaxMsgsPerSubject, cfg.DiscardNewPerSubject = old.MaxMsgsPerSubject, old.DiscardNewPerSubject
			return nil
		}
	}
	return nil
}

// makeBuckets creates or updates the key-value buckets.
func (t *topology) makeBuckets(ctx context.Context, js jetstream.JetStream, c *Config) error {
	for _, b := range []jetstream.KeyValueConfig{
		{Bucket: BucketWorkers, Description: "live jazzmine workers", TTL: c.LivenessTTL},
		{Bucket: BucketCancels, Description: "cancelled jazzmine executions", TTL: c.EventsMaxAge},
		{Bucket: BucketFleet, Description: "jazzmine workers of this fleet, alive or dead", TTL: FleetMemory},
		{Bucket: BucketSessions, Description: "jazzmine sessions: their worker, or why they ended", TTL: c.SessionMaxLife + c.EventsMaxAge},
		{Bucket: wire.SandboxesBucket, Description: "jazzmine sandboxes the fleet serves: their tools and limits", TTL: SandboxesTTL},
	} {
		b.Replicas, b.History = c.Replicas, 1
		kv, err := js.CreateOrUpdateKeyValue(ctx, b)
		if err != nil {
			return fmt.Errorf("create or update bucket %s: %w", b.Bucket, err)
		}
		switch b.Bucket {
		case BucketWorkers:
			t.workers = kv
		case BucketCancels:
			t.cancels = kv
		case BucketFleet:
			t.fleet = kv
		case BucketSessions:
			t.sessionKV = kv
		case wire.SandboxesBucket:
			t.sandboxes = kv
		}
	}
	return nil
}

// makeConsumers creates or updates each sandbox's jobs consumer and session opener.
func (t *topology) makeConsumers(ctx context.Context, js jetstream.JetStream, c *Config) error {
	t.jobs, t.openers = map[string]jetstream.Consumer{}, map[string]jetstream.Consumer{}
	for _, sb := range c.Sandboxes {
		cons, err := js.CreateOrUpdateConsumer(ctx, wire.StreamExec, jetstream.ConsumerConfig{
			Durable:        wire.ConsumerName(sb.Name),
			Description:    "jobs of sandbox " + sb.Name,
			FilterSubjects: tenantExecSubjects(sb.Name),
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        c.AckWait,
			// Unlimited: the worker counts the deliveries, and the one after the
			// last publishes the job's end instead of running it (job.go, ended).
			MaxDeliver:    -1,
			MaxAckPending: sb.MaxAckPending,
			Replicas:      c.Replicas,
		})
		if err != nil {
			return fmt.Errorf("create or update consumer for sandbox %q: %w", sb.Name, err)
		}
		t.jobs[sb.Name] = cons
		opener, err := makeOpener(ctx, js, jetstream.ConsumerConfig{
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
			// Unlimited: a call waits unacked only while its session is being opened
			// or ended elsewhere, but any number of sessions may be; at the server's
			// default 1,000, an opener that held calls kept a sandbox's sessions from
			// opening.
			MaxAckPending: -1,
			Replicas:      c.Replicas,
		})
		if err != nil {
			return fmt.Errorf("create or update the session opener of sandbox %q: %w", sb.Name, err)
		}
		t.openers[sb.Name] = opener
	}
	return nil
}

// makeOpener creates or updates a session opener. An opener a fleet made before
// keeps its deliver policy, which JetStream does not let an update change (openers
// used to deliver only the calls stored after they were made).
func makeOpener(ctx context.Context, js jetstream.JetStream, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	old, err := js.Consumer(ctx, wire.StreamSessions, cfg.Durable)
	switch {
	case err == nil:
		kept := old.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartTime = kept.DeliverPolicy, kept.OptStartTime
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, err
	}
	return js.CreateOrUpdateConsumer(ctx, wire.StreamSessions, cfg)
}

// servedStream is one of the two streams whose subjects are the served sandboxes'.
type servedStream struct {
	name string
	// subjects are a sandbox's subjects in the stream, from every tenant.
	subjects func(sandbox string) []string
	// sandbox returns the sandbox of one of those subjects; false for another shape.
	sandbox func(subject string) (string, bool)
}

var servedStreams = []servedStream{{
	name:     wire.StreamExec,
	subjects: tenantExecSubjects,
	sandbox:  func(s string) (string, bool) { return sandboxToken(s, wire.SubjectPrefixExec, 0) },
}, {
	name:     wire.StreamSessions,
	subjects: tenantSessionSubjects,
	sandbox:  func(s string) (string, bool) { return sandboxToken(s, wire.SubjectPrefixSession, 1) },
}}

// sandboxToken returns the sandbox named by a subject prefix.<sandbox>[.x] or
// prefix.*.<sandbox>[.x] (fromEnd tokens after it), if it has one of those shapes.
func sandboxToken(subject, prefix string, fromEnd int) (string, bool) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", false
	}
	tokens := strings.Split(rest, ".")
	n := len(tokens) - fromEnd
	if n < 1 || n > 2 || (n == 2 && tokens[0] != "*") || (fromEnd == 1 && tokens[len(tokens)-1] != "*") {
		return "", false
	}
	sandbox := tokens[n-1]
	return sandbox, wire.ValidateID("sandbox", sandbox) == nil
}

// mergeSubjects returns old's subjects of stream s that name a sandbox, with those
// of sandboxes added and those of dropped left out, in a stable order; changed says
// whether they differ from old.
func (s servedStream) mergeSubjects(old []string, add, drop []string) (subjects []string, changed bool) {
	for _, subject := range old {
		if sb, ok := s.sandbox(subject); ok && !slices.Contains(drop, sb) {
			subjects = append(subjects, subject)
		}
	}
	for _, sb := range add {
		for _, subject := range s.subjects(sb) {
			if !slices.Contains(subjects, subject) {
				subjects = append(subjects, subject)
			}
		}
	}
	slices.Sort(subjects)
	old = slices.Clone(old)
	slices.Sort(old)
	return subjects, !slices.Equal(subjects, old)
}

// liveEntry is a worker's entry in BucketWorkers.
type liveEntry struct {
	At        time.Time `json:"at"`
	Sandboxes []string  `json:"sandboxes"`
}

// liveSandboxes returns the sandboxes the live workers name in their entries, and
// whether a worker of an earlier version, whose entry names none, is alive.
func liveSandboxes(ctx context.Context, workers jetstream.KeyValue) (live map[string]bool, earlier bool, err error) {
	names, err := workers.ListKeys(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("list live workers: %w", err)
	}
	live = map[string]bool{}
	for id := range names.Keys() {
		e, err := workers.Get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("read the liveness of worker %s: %w", id, err)
		}
		var entry liveEntry
		if json.Unmarshal(e.Value(), &entry) != nil {
			earlier = true
			continue
		}
		for _, sb := range entry.Sandboxes {
			live[sb] = true
		}
	}
	return live, earlier, nil
}

// earlierVersionLives reports whether subjects, those of stream s, hold one of
// another shape than the served subjects' (an earlier version's wildcard) while a
// worker of an earlier version is alive: the subjects are then left as they are.
func earlierVersionLives(ctx context.Context, workers jetstream.KeyValue, s servedStream, subjects []string) (bool, error) {
	if !slices.ContainsFunc(subjects, func(subject string) bool { _, ok := s.sandbox(subject); return !ok }) {
		return false, nil
	}
	_, earlier, err := liveSandboxes(ctx, workers)
	return earlier, err
}

// The fleet's lock on the served subjects: a key of BucketFleet (its '.' keeps it
// apart from the workers' ids) that a worker creates to hold it and deletes to let it
// go. A holder that died leaves a key older than subjectsLockStale, which the next
// one takes over by its revision.
const (
	subjectsLock      = "lock.subjects"
	subjectsLockStale = 30 * time.Second
)

// withSubjectsLock runs f holding the fleet's lock on the served subjects, waiting
// for it until ctx ends.
func withSubjectsLock(ctx context.Context, fleet jetstream.KeyValue, holder string, f func() error) error {
	for {
		rev, err := fleet.Create(ctx, subjectsLock, []byte(holder))
		if errors.Is(err, jetstream.ErrKeyExists) {
			if e, gerr := fleet.Get(ctx, subjectsLock); gerr == nil && time.Since(e.Created()) > subjectsLockStale {
				rev, err = fleet.Update(ctx, subjectsLock, []byte(holder), e.Revision())
			}
		}
		if err == nil {
			defer func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				_ = fleet.Delete(dctx, subjectsLock, jetstream.LastRevision(rev))
			}()
			return f()
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("take the lock on the streams' subjects: %w", err)
		}
		sleep(ctx, time.Duration(20+rand.IntN(80))*time.Millisecond)
		if ctx.Err() != nil {
			return fmt.Errorf("take the lock on the streams' subjects: %w", ctx.Err())
		}
	}
}

// subjectMatches reports whether a message published on subject is taken by a
// stream's subject pattern: '*' takes one token (a literal '*' too), '>' the rest.
// Written here: nats.go exports no matcher, and the server's would bring nats-server
// into the worker's dependencies.
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s), tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}
