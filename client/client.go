package client

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"

	"github.com/jazzmine/worker/wire"
)

// Defaults of the package.
const (
	// DefaultCancelTimeout bounds [Client.Cancel] and [Execution.Cancel] when
	// their context has no deadline: 5 s.
	DefaultCancelTimeout = 5 * time.Second

	// eventsBuffer is the capacity of an execution's Events channel.
	eventsBuffer = 64

	// consumerInactiveThreshold is the InactiveThreshold of the events
	// consumer: the server deletes a consumer that nobody pulls from for that
	// long (a process that died without closing its executions). A live
	// execution always has a pull request pending, and if its consumer is
	// deleted anyway the ordered consumer recreates it where it left off.
	consumerInactiveThreshold = time.Minute

	// consumerDeleteTimeout bounds the deletion of the events consumer when
	// an execution ends.
	consumerDeleteTimeout = 5 * time.Second

	// consumerResetAttempts bounds how many times an events consumer tries
	// to recreate itself (after a missed heartbeat, a reconnect or a gap)
	// before it gives up, and the execution opens a new one instead (see
	// Execution.resume). nats.go would try forever, under one consumer name;
	// after the NATS server that held the consumer is lost, that name can
	// stay assigned to the dead server, and every try times out: with
	// nats-server 2.15 and nats.go 1.55, a third of the executions of the
	// agents whose connection failed over never read another event. (In
	// nats.go's jetstream/ordered.go, reset names the new consumer once and
	// retries under that name. Upstream: nats-io/nats.go#1033, "Ordered
	// consumer subscription can become invalid", is the nearest open issue;
	// none names the reused name.) Two tries take at most about 21 s (10 s
	// each, 1 s apart). Drop the workaround once upstream renames per try.
	consumerResetAttempts = 2

	// resumeTimeout bounds the creation of an events consumer: when an
	// execution leaves the fast path, and each try of Execution.resume;
	// resumeMinDelay and resumeMaxDelay space those tries.
	resumeTimeout  = 10 * time.Second
	resumeMinDelay = 250 * time.Millisecond
	resumeMaxDelay = 5 * time.Second

	// DefaultLiveWindow is how long an execution follows its events through
	// a plain subscription before it moves to a JetStream consumer: 1 s.
	DefaultLiveWindow = time.Second

	// DefaultSandbox is the sandbox of a job that names none, as `worker
	// submit` and `worker mcp` have it: "default".
	DefaultSandbox = "default"
)

// Config configures a [Client]. The zero value of every field but Conn
// means its default.
type Config struct {
	// Conn is the NATS connection to use; required. The client does not
	// close it: the caller does, after closing its executions.
	Conn *nats.Conn

	// ContentType is the encoding of the jobs the client publishes, which
	// the worker also uses for the job's events: [wire.ContentTypeMsgpack]
	// or [wire.ContentTypeJSON]. Empty means msgpack.
	ContentType string

	// MaxScriptBytes is the script size limit checked before a job is
	// published; it should match the workers' limit. Zero means
	// [wire.DefaultMaxScriptBytes] (256 KiB).
	MaxScriptBytes int

	// Logger receives a warning for each event that cannot be decoded (it is
	// skipped) and debug records; nil means slog.Default().
	Logger *slog.Logger

	// LiveWindow is how long an execution may follow its events through a
	// plain NATS subscription, the fast path, before it reads them from the
	// events stream through a JetStream consumer; see [Execution]. Zero
	// means [DefaultLiveWindow]; a negative value means the stream from the
	// start.
	LiveWindow time.Duration
}

// Client submits jobs to jazzmine workers and follows their executions,
// over NATS JetStream. It is safe for concurrent use. It has no background
// work of its own: [Client.Close] closes the connection of a client made by
// [Connect], and does nothing to one made by [New] with a connection of the
// caller's.
type Client struct {
	nc             *nats.Conn
	ownsConn       bool
	js             jetstream.JetStream
	contentType    string
	maxScriptBytes int
	liveWindow     time.Duration
	log            *slog.Logger

	eventsMu    sync.Mutex
	eventsReady bool // the account has the events stream (see ensureEvents)

	filesMu    sync.Mutex
	filesStore jetstream.ObjectStore // wire.FilesBucket, once looked up (files.go)
}

// New returns a client for cfg. It fails when cfg.Conn is nil or
// cfg.ContentType is neither msgpack nor JSON (the error wraps
// [wire.ErrUnsupportedContentType]). It does not talk to the server: a
// missing stream shows at the first [Client.Submit], as [ErrNoStream].
func New(cfg Config) (*Client, error) {
	if cfg.Conn == nil {
		return nil, errors.New("new jazzmine client: Config.Conn is nil")
	}
	ct, err := wire.ParseContentType(cfg.ContentType)
	if err != nil {
		return nil, fmt.Errorf("new jazzmine client: %w", err)
	}
	if cfg.MaxScriptBytes < 0 {
		return nil, fmt.Errorf("new jazzmine client: MaxScriptBytes %d is negative", cfg.MaxScriptBytes)
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, fmt.Errorf("new jazzmine client: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	window := cfg.LiveWindow
	if window == 0 {
		window = DefaultLiveWindow
	}
	return &Client{nc: cfg.Conn, js: js, contentType: ct, maxScriptBytes: cfg.MaxScriptBytes, liveWindow: window, log: log}, nil
}

// Connect connects to the NATS server or cluster at url (a comma-separated
// list is a cluster; empty means nats://127.0.0.1:4222, where `worker serve`
// embeds one) with opts (credentials, TLS: nats.UserCredentials, nats.Nkey,
// ...) and returns a client on that connection, with the default
// [Config]. The connection reconnects for as long as the client lives;
// [Client.Close] closes it.
func Connect(url string, opts ...nats.Option) (*Client, error) {
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name("jazzmine-client"), nats.MaxReconnects(-1)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	c, err := New(Config{Conn: nc})
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.ownsConn = true
	return c, nil
}

// Close closes the connection of a client made by [Connect] (its executions
// then end with an error); for one made by [New], whose connection is the
// caller's, it does nothing. It is idempotent.
func (c *Client) Close() {
	if c.ownsConn {
		c.nc.Close()
	}
}

// NewExecutionID returns a new random execution id: crypto/rand.Text, 26
// letters and digits (128 bits), unique with overwhelming probability and
// unguessable, even from ids seen before. (A NUID, which it once was, is a
// random prefix and a sequence: one id gives away the next, and the jobs
// stream deduplicates ids across tenants.) It is what [Client.Submit] uses
// for a job without one.
func NewExecutionID() string { return rand.Text() }

// Submit publishes job on jazzmine.exec.<job.Sandbox> and returns the
// [Execution] that follows its events. ctx bounds the submission only, not
// the execution.
//
// A job without an ExecutionID gets one from [NewExecutionID], a job
// without a Sandbox runs in [DefaultSandbox], and a job without a Mode runs
// in [wire.ModeInteractive], as a notebook cell does: a script that only
// prints succeeds, and its last expression's value is its result
// ([wire.ModePlan] requires a result). The job must pass
// [wire.Job.Validate] with the client's script limit; an invalid job is refused before anything is sent (the
// error wraps [wire.ErrInvalidJob]).
//
// Submit subscribes to the execution's events before it publishes the job,
// so none is missed. The job is published with its execution id as
// Nats-Msg-Id, the client's Content-Type and, when ctx carries a span, the
// trace context of otel's global propagator. Within the jobs stream's
// duplicate window (2 minutes by default) a job with the id of one already
// published is dropped by the server: Submit then returns an Execution with
// Duplicate set that follows the earlier job's events. An execution id must
// not be reused after that: the events of the earlier execution, kept for an
// hour, would be read as this one's.
//
// The error wraps [ErrUnknownSandbox] (and [ErrNoStream]) when no worker of
// the fleet serves the sandbox (the server refuses the job at once, nothing is
// queued), [ErrNoStream] when no worker has created the streams,
// [ErrBacklogFull] when the jobs stream is full, and otherwise the error of
// nats.go. On error nothing is left subscribed. An error after the job was
// sent (ctx ended while Submit waited for the server's ack) leaves the job's
// fate unknown: submitting it again with the same ExecutionID (the error
// names it) within the duplicate window is safe, as above.
func (c *Client) Submit(ctx context.Context, job wire.Job) (*Execution, error) {
	if job.ExecutionID == "" {
		job.ExecutionID = NewExecutionID()
	}
	if job.Mode == "" {
		job.Mode = wire.ModeInteractive
	}
	if job.Sandbox == "" {
		job.Sandbox = DefaultSandbox
	}
	if err := job.Validate(job.Sandbox, c.maxScriptBytes); err != nil {
		return nil, fmt.Errorf("submit job: %w", err)
	}
	id, subject := job.ExecutionID, wire.ExecSubject(job.Sandbox)
	if job.SessionID != "" {
		subject = wire.SessionSubject(job.Sandbox, job.SessionID)
	}
	data, err := wire.EncodeJob(c.contentType, &job)
	if err != nil {
		return nil, fmt.Errorf("submit execution %q: %w", id, err)
	}

	if err := c.ensureEvents(ctx); err != nil {
		return nil, fmt.Errorf("submit execution %q: %w", id, err)
	}
	e, err := c.follow(ctx, id, job.Sandbox)
	if err != nil {
		return nil, fmt.Errorf("submit execution %q: %w", id, err)
	}

	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(wire.HeaderMsgID, id)
	msg.Header.Set(wire.HeaderContentType, c.contentType)
	otel.GetTextMapPropagator().Inject(ctx, wire.HeaderCarrier(msg.Header))
	ack, err := c.js.PublishMsg(ctx, msg)
	if err != nil {
		e.Close()
		switch {
		case isNoStream(err):
			return nil, unknownSandbox(id, job.Sandbox, subject, err)
		case isBacklogFull(err):
			return nil, errorf(ErrBacklogFull, "submit execution %q: the job backlog of sandbox %q is full, try again later (%w)", id, job.Sandbox, err)
		}
		return nil, fmt.Errorf("submit execution %q: publish on %s: %w", id, subject, err)
	}
	e.Duplicate = ack.Duplicate
	if ack.Duplicate {
		e.leaveLive() // the earlier job's events may be gone by: read the stream
		c.log.Debug("jazzmine job dropped as a duplicate, following the earlier one", "execution_id", id, "sandbox", job.Sandbox)
	}
	return e, nil
}

// Tenant events: the events stream a tenant's account holds.
const (
	// tenantEventsMaxAge is how long the events stream a client creates keeps
	// events: the workers' default.
	tenantEventsMaxAge = time.Hour
	// tenantEventsDuplicates is that stream's duplicate window.
	tenantEventsDuplicates = 2 * time.Minute
	// ensureEventsTimeout bounds the look-up of the stream, and its creation.
	ensureEventsTimeout = 5 * time.Second
	// sourceAskBudget bounds the request that the workers carry the account's events
	// (asked again while they say busy): past it the stream is made of the events as
	// they arrive, and made to source them later.
	sourceAskBudget = 2 * time.Second
)

// ensureEvents makes sure that the account the client is in has the events stream
// before its first job is published. The workers' own account has it from them. A
// tenant's account (deploy/nats/auth.conf) keeps its executions' events in a stream
// of its own, which the first client creates: it asks the workers to carry the
// tenant's events (wire.SubjectSource), then makes the stream source them from the
// fleet's account, at least once (a one-hour MaxAge, three replicas on a cluster of
// three or more, else one; create it beforehand for other limits). Where no worker
// answers, it makes a stream of the events as they arrive instead, and asks again at
// the next job; such a stream, or one an earlier version made, is made to source the
// events once a worker answers. An account without JetStream, or a server that does
// not answer within ensureEventsTimeout, is left as it is: a missing stream shows
// when it is read.
func (c *Client) ensureEvents(ctx context.Context) error {
	c.eventsMu.Lock()
	defer c.eventsMu.Unlock()
	if c.eventsReady {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, ensureEventsTimeout)
	stream, err := c.js.Stream(lctx, wire.StreamEvents)
	cancel()
	code, _ := apiErrorCode(err)
	switch {
	case code == codeStreamNotFound:
		cfg := tenantEvents(c.askSource(ctx))
		cctx, cancel := context.WithTimeout(ctx, ensureEventsTimeout)
		defer cancel()
		err = createReplicated(func(replicas int) error {
			cfg.Replicas = replicas
			_, err := c.js.CreateStream(cctx, cfg)
			return err
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // another client, or a worker, was first
		}
		if err != nil {
			return fmt.Errorf("create the events stream %s of this account: %w", wire.StreamEvents, err)
		}
		c.eventsReady = len(cfg.Sources) > 0
		return nil
	case err != nil:
		// No JetStream to ask (the publish says so), or no answer (a role that may
		// not ask): not asked again, and a missing stream shows when it is read.
		c.log.Debug("jazzmine client: look up the events stream", "error", err)
	case stream.CachedInfo().Config.Description == tenantEventsDescription && len(stream.CachedInfo().Config.Sources) == 0:
		// A stream of the events as they arrive, which misses what comes while it
		// elects a leader: it sources them once a worker answers.
		if !c.askSource(ctx) {
			return nil // asked again at the next job
		}
		cfg := stream.CachedInfo().Config
		sourced := tenantEvents(true)
		cfg.Subjects, cfg.Sources = sourced.Subjects, sourced.Sources
		uctx, cancel := context.WithTimeout(ctx, ensureEventsTimeout)
		defer cancel()
		if _, err := c.js.UpdateStream(uctx, cfg); err != nil {
			c.log.Warn("jazzmine client: make the account's events stream source the fleet's", "error", err)
		}
	}
	c.eventsReady = true
	return nil
}

// tenantEventsDescription is the description of the events stream a client creates.
const tenantEventsDescription = "jazzmine execution events of this account's executions"

// tenantEvents is the events stream a client creates in its account: sourced from
// the fleet's (sourced), or of the events as they arrive.
func tenantEvents(sourced bool) jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{
		Name:        wire.StreamEvents,
		Description: tenantEventsDescription,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      tenantEventsMaxAge,
		Duplicates:  tenantEventsDuplicates,
		Storage:     jetstream.FileStorage,
	}
	if !sourced {
		// Deduplicated over its whole age: once it sources the fleet's stream, which
		// delivers from the tenant's first event, none it holds is stored twice.
		cfg.Subjects, cfg.Duplicates = []string{wire.AllEventsWildcard}, tenantEventsMaxAge
		return cfg
	}
	// The fleet's consumer of this tenant's events (wire.TenantEventsConsumer), as
	// the account's imports name it; its subjects lose the tenant's token.
	cfg.Sources = []*jetstream.StreamSource{{
		Name:              wire.StreamEvents,
		Consumer:          &jetstream.StreamConsumerSource{Name: wire.SourceConsumer, DeliverSubject: wire.SubjectPrefixSourced},
		External:          &jetstream.ExternalStream{APIPrefix: wire.SourceAPIPrefix},
		SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: wire.SubjectPrefixEvents + ".*.>", Destination: wire.AllEventsWildcard}},
	}}
	return cfg
}

// askSource asks the workers to carry this tenant's events to its account, and
// reports whether one did. In the fleet's own account nothing answers.
func (c *Client) askSource(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, sourceAskBudget)
	defer cancel()
	m, err := c.ask(ctx, wire.SubjectSource, nil)
	if err == nil && m.Header.Get(wire.HeaderError) != "" {
		err = errors.New(m.Header.Get(wire.HeaderError))
	}
	if err != nil {
		c.log.Debug("jazzmine client: ask the workers to carry this account's events", "error", err)
		return false
	}
	return true
}

// createReplicated creates a stream or a bucket for the client's account with
// create, of three replicas, or of one where that fails (a single server, or a
// cluster too small), unless it failed for being there already.
func createReplicated(create func(replicas int) error) error {
	err := create(3)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && !errors.Is(err, jetstream.ErrBucketExists) {
		err = create(1)
	}
	return err
}

// follow subscribes to the events of execution id and starts the goroutine
// that reads them. The subscription is a plain one (the fast path, see
// [Execution]), or the events stream's consumer when LiveWindow is negative;
// either is in place on the server before the job is published, because the
// server handles a connection's messages in order.
func (c *Client) follow(ctx context.Context, id, sandbox string) (*Execution, error) {
	e := newExecution(c, id, sandbox)
	if c.liveWindow <= 0 {
		// The stream from the start: its consumer exists before the job does, and
		// a missing stream is Submit's error.
		cons, iter, err := c.consume(ctx, id)
		if err != nil {
			return nil, err
		}
		e.cons, e.iter = cons, iter
	} else {
		// A channel of our own, small: SubscribeSync would allocate one of
		// SubChanLen (64 Ki) entries per execution. When it is full the
		// connection drops a message, a gap the fast path sees.
		e.liveCh = make(chan *nats.Msg, eventsBuffer)
		sub, err := c.nc.ChanSubscribe(wire.EventsWildcard(id), e.liveCh)
		if err != nil {
			return nil, fmt.Errorf("subscribe to %s: %w", wire.EventsWildcard(id), err)
		}
		e.live = sub
		e.liveCtx, e.endLive = context.WithTimeout(context.Background(), c.liveWindow)
	}
	go e.run()
	return e, nil
}

// consume creates the JetStream consumer of execution id's events, from its
// first event.
func (c *Client) consume(ctx context.Context, id string) (jetstream.Consumer, jetstream.MessagesContext, error) {
	filter := wire.EventsWildcard(id)
	cons, iter, err := c.openEvents(ctx, id, 0)
	if err != nil {
		if isNoStream(err) {
			return nil, nil, errorf(ErrNoStream, "no JetStream stream %s for the execution's events: is a jazzmine worker running against this NATS server? (%w)", wire.StreamEvents, err)
		}
		return nil, nil, fmt.Errorf("subscribe to %s: %w", filter, err)
	}
	return cons, iter, nil
}

// openEvents opens an ordered consumer of the events of execution id that
// starts after stream sequence after (0: at the execution's first event),
// and its iterator.
func (c *Client) openEvents(ctx context.Context, id string, after uint64) (jetstream.Consumer, jetstream.MessagesContext, error) {
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{wire.EventsWildcard(id)},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: consumerInactiveThreshold,
		MaxResetAttempts:  consumerResetAttempts,
	}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := c.js.OrderedConsumer(ctx, wire.StreamEvents, cfg)
	if err != nil {
		return nil, nil, err
	}
	iter, err := cons.Messages()
	if err != nil {
		c.deleteConsumer(cons)
		return nil, nil, err
	}
	return cons, iter, nil
}

// deleteConsumer deletes the server side of an events consumer. Failing
// that, the server deletes it after consumerInactiveThreshold.
func (c *Client) deleteConsumer(cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), consumerDeleteTimeout)
	defer cancel()
	err := c.js.DeleteConsumer(ctx, wire.StreamEvents, info.Name)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		c.log.Debug("jazzmine client: delete events consumer", "consumer", info.Name, "error", err)
	}
}

// Run submits job, waits for its result and closes the execution:
// [Client.Submit], [Execution.Wait] and [Execution.Close]; nothing is left
// to close. ctx bounds the whole run; when it ends first, Run cancels the
// job on the fleet (waiting at most [DefaultCancelTimeout] for the server to
// take the cancel) and returns ctx's error. A script that fails is a Result
// with Success false, not an error.
func (c *Client) Run(ctx context.Context, job wire.Job) (*Result, error) {
	e, err := c.Submit(ctx, job)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	res, err := e.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		// The caller gave up: so does the fleet, rather than run it to its timeout.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultCancelTimeout)
		defer cancel()
		if cerr := e.Cancel(cctx); cerr != nil {
			c.log.Warn("cancel an execution whose Run's context ended", "execution_id", e.ID, "err", cerr)
		}
	}
	return res, err
}

// Cancel asks the workers to cancel execution executionID, by a plain NATS
// publish on jazzmine.cancel.<executionID>. It works whether the job is
// queued or running; the outcome arrives on the execution's events as an
// error event of kind [wire.KindCancelled] followed by script_done (a job
// that already ended is not affected). Cancel returns once the server has
// the request; ctx bounds that wait, [DefaultCancelTimeout] when it has no
// deadline. An invalid id is refused (the error wraps [wire.ErrInvalidID]).
func (c *Client) Cancel(ctx context.Context, executionID string) error {
	if err := wire.ValidateID("execution_id", executionID); err != nil {
		return fmt.Errorf("cancel execution: %w", err)
	}
	msg := nats.NewMsg(wire.CancelSubject(executionID))
	otel.GetTextMapPropagator().Inject(ctx, wire.HeaderCarrier(msg.Header))
	if err := c.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("cancel execution %q: %w", executionID, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCancelTimeout)
		defer cancel()
	}
	if err := c.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("cancel execution %q: flush: %w", executionID, err)
	}
	return nil
}
