package client_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

func TestNew(t *testing.T) {
	srv := startServer(t, "", -1)
	nc := connect(t, srv)
	tests := []struct {
		name    string
		cfg     client.Config
		wantErr error // nil: New succeeds
	}{
		{"a connection alone is enough", client.Config{Conn: nc}, nil},
		{"JSON is accepted, with parameters", client.Config{Conn: nc, ContentType: "application/json; charset=utf-8"}, nil},
		{"a missing connection is refused", client.Config{}, errAny},
		{"an unknown content type is refused", client.Config{Conn: nc, ContentType: "text/plain"}, wire.ErrUnsupportedContentType},
		{"a negative script limit is refused", client.Config{Conn: nc, MaxScriptBytes: -1}, errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := client.New(tt.cfg)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("New: %v", err)
			case tt.wantErr == nil && c == nil:
				t.Fatal("New returned a nil client")
			case tt.wantErr != nil && err == nil:
				t.Fatal("New succeeded, want an error")
			case tt.wantErr != nil && tt.wantErr != errAny && !errors.Is(err, tt.wantErr):
				t.Fatalf("New: %v, want an error wrapping %v", err, tt.wantErr)
			}
		})
	}
}

// errAny stands for an error that matches no particular sentinel.
var errAny = errors.New("any error")

func TestSubmitPublishesTheJob(t *testing.T) {
	tests := []struct {
		name            string
		contentType     string // the client's
		wantContentType string // on the message
	}{
		{"a job is published in msgpack by default", "", wire.ContentTypeMsgpack},
		{"a job is published in JSON when the client is configured for JSON", wire.ContentTypeJSON, wire.ContentTypeJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, client.Config{ContentType: tt.contentType})
			job := wire.Job{
				ExecutionID:     "exec-1",
				Sandbox:         sandbox,
				Script:          "emit_result(1 + 1)",
				Mode:            wire.ModeInteractive,
				TimeoutSec:      2.5,
				MaxOutputBytes:  4096,
				RequiredSecrets: []string{"API_KEY"},
				Metadata:        map[string]string{"agent": "a1"},
			}
			e := submit(t, env.client, job)
			if e.ID != job.ExecutionID || e.Sandbox != sandbox || e.Duplicate {
				t.Errorf("execution = {ID %q, Sandbox %q, Duplicate %v}, want {%q, %q, false}", e.ID, e.Sandbox, e.Duplicate, job.ExecutionID, sandbox)
			}

			d := env.worker.take()
			if got := d.msg.Subject(); got != "jazzmine.exec.default" {
				t.Errorf("subject = %q, want jazzmine.exec.default", got)
			}
			h := d.msg.Headers()
			if got := h.Get("Nats-Msg-Id"); got != job.ExecutionID {
				t.Errorf("Nats-Msg-Id = %q, want %q", got, job.ExecutionID)
			}
			if got := h.Get("Content-Type"); got != tt.wantContentType {
				t.Errorf("Content-Type = %q, want %q", got, tt.wantContentType)
			}
			if got := h.Get("traceparent"); got != "" {
				t.Errorf("traceparent = %q without a propagator, want none", got)
			}
			if _, err := wire.DecodeJob(tt.wantContentType, d.msg.Data()); err != nil {
				t.Errorf("the body is not a %s job: %v", tt.wantContentType, err)
			}
			if !reflect.DeepEqual(*d.job, job) {
				t.Errorf("the worker got\n%+v\nwant\n%+v", *d.job, job)
			}
			d.ack()
		})
	}
}

func TestSubmitPropagatesTheTraceContext(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	state, err := trace.ParseTraceState("vendor=value")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    traceID,
		SpanID:     spanID,
		TraceFlags: trace.FlagsSampled,
		TraceState: state,
		Remote:     true,
	})

	tests := []struct {
		name            string
		ctx             context.Context
		wantTraceparent string
		wantTracestate  string
	}{
		{
			"a job submitted under a span carries its trace context",
			trace.ContextWithSpanContext(context.Background(), sc),
			"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=value",
		},
		{"a job submitted without a span carries no trace context", context.Background(), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, client.Config{})
			e, err := env.client.Submit(tt.ctx, wire.Job{Sandbox: sandbox, Script: "pass"})
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			defer e.Close()
			h := env.worker.take().msg.Headers()
			if got := h.Get("traceparent"); got != tt.wantTraceparent {
				t.Errorf("traceparent = %q, want %q", got, tt.wantTraceparent)
			}
			if got := h.Get("tracestate"); got != tt.wantTracestate {
				t.Errorf("tracestate = %q, want %q", got, tt.wantTracestate)
			}
			for k := range h {
				if strings.EqualFold(k, "traceparent") && k != "traceparent" {
					t.Errorf("header %q: the trace context must be in lowercase headers", k)
				}
			}
		})
	}
}

func TestAJobWithoutASandboxOrAModeRunsInTheDefaultSandboxInteractively(t *testing.T) {
	env := newEnv(t, client.Config{})
	e, err := env.client.Submit(ctx(t), wire.Job{Script: "print('hi')"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	stream, err := env.js.Stream(ctx(t), wire.StreamExec)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx(t), wire.ExecSubject(client.DefaultSandbox))
	if err != nil {
		t.Fatalf("no job on %s: %v", wire.ExecSubject(client.DefaultSandbox), err)
	}
	job, err := wire.DecodeJob(msg.Header.Get(wire.HeaderContentType), msg.Data)
	if err != nil || job.Sandbox != "default" || job.Mode != wire.ModeInteractive {
		t.Errorf("the job published: %+v, %v; want sandbox default, mode interactive", job, err)
	}
}

func TestSubmitRefusesInvalidJobsBeforePublishing(t *testing.T) {
	env := newEnv(t, client.Config{MaxScriptBytes: 100})
	tests := []struct {
		name    string
		job     wire.Job
		wantErr error
	}{
		{"a job with an id that is not a subject token is refused", wire.Job{ExecutionID: "a.b", Sandbox: sandbox, Script: "pass"}, wire.ErrInvalidID},
		{"a job with an id of 65 characters is refused", wire.Job{ExecutionID: strings.Repeat("a", 65), Sandbox: sandbox, Script: "pass"}, wire.ErrInvalidID},
		{"a job with a wildcard for a sandbox is refused", wire.Job{Sandbox: "*", Script: "pass"}, wire.ErrInvalidID},
		{"a job without a script is refused", wire.Job{Sandbox: sandbox}, wire.ErrInvalidJob},
		{"a job with a script over the client's limit is refused", wire.Job{Sandbox: sandbox, Script: strings.Repeat("x", 101)}, wire.ErrScriptTooLarge},
		{"a job with an unknown mode is refused", wire.Job{Sandbox: sandbox, Script: "pass", Mode: "batch"}, wire.ErrInvalidJob},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := env.client.Submit(ctx(t), tt.job)
			if err == nil {
				e.Close()
				t.Fatal("Submit succeeded, want an error")
			}
			if !errors.Is(err, tt.wantErr) || !errors.Is(err, wire.ErrInvalidJob) {
				t.Errorf("Submit: %v, want an error wrapping %v and %v", err, tt.wantErr, wire.ErrInvalidJob)
			}
			t.Logf("Submit: %v", err)
			if msgs, _ := streamState(t, env.js, wire.StreamExec); msgs != 0 {
				t.Errorf("the jobs stream holds %d messages, want none", msgs)
			}
			if _, consumers := streamState(t, env.js, wire.StreamEvents); consumers != 0 {
				t.Errorf("the events stream has %d consumers, want none", consumers)
			}
		})
	}
}

func TestSubmitWithoutStreams(t *testing.T) {
	tests := []struct {
		name    string
		streams []jetstream.StreamConfig
	}{
		{"a server without the streams gives ErrNoStream", nil},
		{"a server without the jobs stream gives ErrNoStream", []jetstream.StreamConfig{eventsStreamConfig()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startServer(t, "", -1)
			nc := connect(t, srv)
			js := newJetStream(t, nc)
			for _, cfg := range tt.streams {
				createStream(t, js, cfg)
			}
			c, err := client.New(client.Config{Conn: nc})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.AccountInfo(ctx(t)); err != nil { // starts the connection's request subscription
				t.Fatal(err)
			}
			subs := nc.NumSubscriptions()
			e, err := c.Submit(ctx(t), wire.Job{Sandbox: sandbox, Script: "pass"})
			if err == nil {
				e.Close()
				t.Fatal("Submit succeeded, want ErrNoStream")
			}
			if !errors.Is(err, client.ErrNoStream) {
				t.Fatalf("Submit: %v, want an error wrapping ErrNoStream", err)
			}
			t.Logf("Submit: %v", err)
			msg := err.Error()
			if !strings.Contains(msg, "jazzmine.exec.default") || !strings.Contains(msg, "is a jazzmine worker serving it") {
				t.Errorf("error %q should name jazzmine.exec.default and ask whether a worker serves it", msg)
			}
			if !errors.Is(err, client.ErrUnknownSandbox) {
				t.Errorf("Submit: %v, want an error wrapping ErrUnknownSandbox too: the server cannot tell a missing stream from a sandbox nobody serves", err)
			}
			if n := nc.NumSubscriptions(); n != subs {
				t.Errorf("%d subscriptions after a failed submit, want the %d before it", n, subs)
			}
		})
	}

	// An account without the events stream is a tenant's (deploy/nats/auth.conf):
	// its events come from the fleet's account, and the first Submit creates the
	// stream that keeps them, before the job is published.
	t.Run("a server without the events stream gets one at the first Submit", func(t *testing.T) {
		srv := startServer(t, "", -1)
		nc := connect(t, srv)
		js := newJetStream(t, nc)
		createStream(t, js, execStreamConfig())
		c, err := client.New(client.Config{Conn: nc, LiveWindow: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		e := submit(t, c, wire.Job{Sandbox: sandbox, Script: "pass"})
		defer e.Close()
		stream, err := js.Stream(ctx(t), wire.StreamEvents)
		if err != nil {
			t.Fatalf("the events stream after Submit: %v", err)
		}
		if cfg := stream.CachedInfo().Config; !slices.Equal(cfg.Subjects, []string{wire.AllEventsWildcard}) || cfg.MaxAge != time.Hour {
			t.Errorf("the events stream Submit made: subjects %v, max age %v; want %s and 1h", cfg.Subjects, cfg.MaxAge, wire.AllEventsWildcard)
		}
		// Once a worker answers the source request, the next Submit makes that
		// stream source the fleet's events (a tenant's account reaches the fleet's
		// consumer through its imports, which this server lacks: the source waits).
		sub, err := nc.Subscribe(wire.SubjectSource, func(m *nats.Msg) { _ = m.Respond(nil) })
		if err := errors.Join(err, nc.Flush()); err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		e2 := submit(t, c, wire.Job{Sandbox: sandbox, Script: "pass"})
		defer e2.Close()
		info, err := stream.Info(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg := info.Config
		if len(cfg.Subjects) != 0 || len(cfg.Sources) != 1 || cfg.Sources[0].Name != wire.StreamEvents ||
			cfg.Sources[0].Consumer == nil || cfg.Sources[0].Consumer.Name != wire.SourceConsumer || cfg.Sources[0].External == nil || cfg.Sources[0].External.APIPrefix != wire.SourceAPIPrefix {
			t.Errorf("the events stream once a worker answers: subjects %v, sources %+v; want the fleet's events through its consumer %q", cfg.Subjects, cfg.Sources, wire.SourceConsumer)
		}
	})
}

func TestSubmitWithoutJetStream(t *testing.T) {
	plain := startPlainServer(t)
	c, err := client.New(client.Config{Conn: connect(t, plain)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(ctx(t), wire.Job{Sandbox: sandbox, Script: "pass"})
	if !errors.Is(err, client.ErrNoStream) {
		t.Fatalf("Submit to a server without JetStream: %v, want an error wrapping ErrNoStream", err)
	}
	t.Logf("Submit: %v", err)
}

func TestSubmitToAFullBacklog(t *testing.T) {
	script := strings.Repeat("x", 200) // one job is about 300 bytes stored
	tests := []struct {
		name  string
		limit func(*jetstream.StreamConfig)
	}{
		{"a jobs stream at its MaxMsgs gives ErrBacklogFull", func(c *jetstream.StreamConfig) { c.MaxMsgs = 1 }},
		{"a jobs stream at its MaxBytes gives ErrBacklogFull", func(c *jetstream.StreamConfig) { c.MaxBytes = 500 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startServer(t, "", -1)
			nc := connect(t, srv)
			js := newJetStream(t, nc)
			exec := execStreamConfig()
			exec.Discard = jetstream.DiscardNew
			tt.limit(&exec)
			createStream(t, js, exec)
			createStream(t, js, eventsStreamConfig())
			c, err := client.New(client.Config{Conn: nc})
			if err != nil {
				t.Fatal(err)
			}

			submit(t, c, wire.Job{Sandbox: sandbox, Script: script}) // fills the backlog
			subs := nc.NumSubscriptions()
			e, err := c.Submit(ctx(t), wire.Job{ExecutionID: "second", Sandbox: sandbox, Script: script})
			if err == nil {
				e.Close()
				t.Fatal("Submit to a full backlog succeeded, want ErrBacklogFull")
			}
			if !errors.Is(err, client.ErrBacklogFull) {
				t.Fatalf("Submit to a full backlog: %v, want an error wrapping ErrBacklogFull", err)
			}
			t.Logf("Submit: %v", err)
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) {
				t.Errorf("the error %v does not wrap the server's API error", err)
			}
			if !strings.Contains(err.Error(), `"second"`) {
				t.Errorf("error %q should name the execution", err)
			}
			if msgs, _ := streamState(t, js, wire.StreamExec); msgs != 1 {
				t.Errorf("the jobs stream holds %d messages, want 1", msgs)
			}
			if n := nc.NumSubscriptions(); n != subs {
				t.Errorf("%d subscriptions after the refused submit, want the %d before it", n, subs)
			}
		})
	}
}

func TestSubmitGeneratesValidUniqueIDs(t *testing.T) {
	env := newEnv(t, client.Config{})
	const n = 20
	seen := map[string]bool{}
	for range n {
		e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
		if err := wire.ValidateID("execution_id", e.ID); err != nil {
			t.Errorf("generated id: %v", err)
		}
		if seen[e.ID] {
			t.Errorf("id %q generated twice", e.ID)
		}
		seen[e.ID] = true
		if got := env.worker.take().msg.Headers().Get(wire.HeaderMsgID); got != e.ID {
			t.Errorf("Nats-Msg-Id = %q, want the generated id %q", got, e.ID)
		}
	}
	for range 1000 {
		id := client.NewExecutionID()
		if err := wire.ValidateID("execution_id", id); err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("id %q generated twice", id)
		}
		seen[id] = true
	}
}

func TestSubmitTwiceFollowsTheFirstJob(t *testing.T) {
	env := newEnv(t, client.Config{})
	job := wire.Job{ExecutionID: "retried", Sandbox: sandbox, Script: "pass"}
	first := submit(t, env.client, job)
	env.worker.take().run("forty-two")
	second := submit(t, env.client, job)
	if first.Duplicate || !second.Duplicate {
		t.Errorf("Duplicate = %v then %v, want false then true", first.Duplicate, second.Duplicate)
	}
	for i, e := range []*client.Execution{first, second} {
		res, err := e.Wait(ctx(t))
		if err != nil {
			t.Fatalf("Wait %d: %v", i+1, err)
		}
		if !res.Success || res.FinalData != "forty-two" {
			t.Errorf("Wait %d = %+v, want the first job's result", i+1, res)
		}
	}
	if msgs, _ := streamState(t, env.js, wire.StreamExec); msgs != 0 {
		t.Errorf("the jobs stream holds %d messages, want none: the second was a duplicate", msgs)
	}
}

func TestCancel(t *testing.T) {
	env := newEnv(t, client.Config{})
	sub, err := env.nc.SubscribeSync(wire.CancelWildcard)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	e := submit(t, env.client, wire.Job{ExecutionID: "to-cancel", Sandbox: sandbox, Script: "pass"})

	tests := []struct {
		name   string
		cancel func(context.Context) error
	}{
		{"Execution.Cancel publishes on jazzmine.cancel.<id>", e.Cancel},
		{"Client.Cancel publishes on jazzmine.cancel.<id>", func(ctx context.Context) error { return env.client.Cancel(ctx, "to-cancel") }},
		{"Client.Cancel without a deadline still publishes", func(context.Context) error { return env.client.Cancel(context.Background(), "to-cancel") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cancel(ctx(t)); err != nil {
				t.Fatalf("cancel: %v", err)
			}
			msg, err := sub.NextMsg(testTimeout)
			if err != nil {
				t.Fatalf("no cancel request: %v", err)
			}
			if msg.Subject != "jazzmine.cancel.to-cancel" {
				t.Errorf("subject = %q, want jazzmine.cancel.to-cancel", msg.Subject)
			}
		})
	}

	t.Run("Client.Cancel refuses an invalid id and publishes nothing", func(t *testing.T) {
		err := env.client.Cancel(ctx(t), "x.>")
		if !errors.Is(err, wire.ErrInvalidID) {
			t.Fatalf("Cancel: %v, want an error wrapping wire.ErrInvalidID", err)
		}
		// A marker published after it is the next message if Cancel
		// published nothing.
		if err := env.client.Cancel(ctx(t), "marker"); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.NextMsg(testTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Subject != "jazzmine.cancel.marker" {
			t.Errorf("a cancel request was published on %s", msg.Subject)
		}
	})

	t.Run("the worker's cancelled outcome ends the execution", func(t *testing.T) {
		d := env.worker.take()
		d.emit(
			wire.Event{Type: wire.EventError, Kind: wire.KindCancelled, Error: "cancelled"},
			wire.Event{Type: wire.EventScriptDone, Error: "cancelled"},
		)
		d.ack()
		res, err := e.Wait(ctx(t))
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if res.Success || res.ErrorKind != wire.KindCancelled || res.Error != "cancelled" {
			t.Errorf("result = %+v, want a failure of kind cancelled", res)
		}
	})
}

func TestRun(t *testing.T) {
	env := newEnv(t, client.Config{})
	var (
		wg  sync.WaitGroup
		res *client.Result
		err error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, err = env.client.Run(ctx(t), wire.Job{Sandbox: sandbox, Script: "emit_result(42)"})
	}()
	env.worker.take().run(int64(42))
	wg.Wait()
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !res.Success || res.FinalData != int64(42) || res.Stdout != "hello\n" {
		t.Errorf("Run = %+v, want success with 42", res)
	}
	if _, consumers := streamState(t, env.js, wire.StreamEvents); consumers != 0 {
		t.Errorf("the events stream has %d consumers after Run, want none", consumers)
	}
}

func TestRunEndsWithItsContext(t *testing.T) {
	env := newEnv(t, client.Config{})
	c, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := env.client.Run(c, wire.Job{Sandbox: sandbox, Script: "pass"})
		errc <- err
	}()
	env.worker.take() // the job is published; no result will come
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want the context's error", err)
	}
	if _, consumers := streamState(t, env.js, wire.StreamEvents); consumers != 0 {
		t.Errorf("the events stream has %d consumers after Run, want none", consumers)
	}
}
