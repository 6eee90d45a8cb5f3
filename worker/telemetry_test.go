package worker_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestTracesFollowAJobFromTheAgentIntoTheContainerAndBack: the agent's span is the
// parent of the worker's process span, whose children are checkout and execute; the
// script sees the execute span as TRACEPARENT; the events carry the trace back.
func TestTracesFollowAJobFromTheAgentIntoTheContainerAndBack(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{}) // the client injects with the global one
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	workerSpans := tracetest.NewSpanRecorder()
	workerTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(workerSpans))
	agentTP := sdktrace.NewTracerProvider()

	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, func(c *worker.Config) {
		c.TracerProvider = workerTP
		c.Propagator = propagation.TraceContext{}
	})
	ctx, agentSpan := agentTP.Tracer("agent").Start(context.Background(), "agent tool call")
	res, err := newClient(t, nc).Run(ctx, wire.Job{ExecutionID: newID("traced"), Sandbox: "default", Script: "import os\nemit_result(os.environ.get('TRACEPARENT'))"})
	agentSpan.End()
	if err != nil || !res.Success {
		t.Fatalf("run: %v %+v", err, res)
	}
	agent := agentSpan.SpanContext()

	byName := map[string]sdktrace.ReadOnlySpan{}
	testenv.WaitFor(t, 10*time.Second, "the worker's spans to end", func() bool {
		for _, s := range workerSpans.Ended() {
			name := s.Name()
			if strings.HasSuffix(name, " process") {
				name = "process"
			}
			byName[name] = s
		}
		return byName["process"] != nil && byName["checkout"] != nil && byName["execute"] != nil && byName["publish events"] != nil
	})
	process := byName["process"]
	if process.SpanContext().TraceID() != agent.TraceID() || process.Parent().SpanID() != agent.SpanID() {
		t.Errorf("process span %v has parent %v, want a child of the agent's span %v", process.SpanContext(), process.Parent(), agent)
	}
	if process.SpanKind() != trace.SpanKindConsumer || process.Name() != "jazzmine.exec.default process" {
		t.Errorf("process span: kind %v, name %q", process.SpanKind(), process.Name())
	}
	for _, name := range []string{"checkout", "execute", "publish events"} {
		if s := byName[name]; s.Parent().SpanID() != process.SpanContext().SpanID() || s.SpanContext().TraceID() != agent.TraceID() {
			t.Errorf("%s span's parent = %v, want the process span", name, s.Parent())
		}
	}
	// Inside the container: the execute span, as the W3C traceparent.
	want := "00-" + agent.TraceID().String() + "-" + byName["execute"].SpanContext().SpanID().String() + "-01"
	if res.FinalData != want {
		t.Errorf("TRACEPARENT in the script = %v, want %s", res.FinalData, want)
	}
	// And back: every event carries the trace.
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	msg := testenv.StoredMsg(t, stream, wire.EventSubject(res.ExecutionID, wire.EventScriptDone))
	if tp := msg.Header.Get("traceparent"); !strings.Contains(tp, agent.TraceID().String()) {
		t.Errorf("script_done's traceparent = %q, want the agent's trace %s", tp, agent.TraceID())
	}
}

// TestTheMetricsEndpointMovesAndReadinessWaitsForWarmPools scrapes a `worker serve`
// process: /readyz fails until its pool is warm, and the metrics follow the jobs.
func TestTheMetricsEndpointMovesAndReadinessWaitsForWarmPools(t *testing.T) {
	testenv.SandboxImage(t)
	srv, nc := testenv.NATS(t)
	id := "metrics-" + strconv.FormatInt(time.Now().UnixNano()%1_000_000, 10)
	p := startProcess(t, writeConfig(t, ""), srv.ClientURL(), id)
	get := p.httpGetter(t)
	if code, body := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d %s", code, body)
	}
	sawNotReady := false
	testenv.WaitFor(t, 2*time.Minute, "/readyz to turn ready", func() bool {
		code, body := get("/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "sandboxes: ") {
			sawNotReady = true
		}
		return code == 200
	})
	// The listener is up before the container spawns, which takes hundreds of ms.
	if !sawNotReady {
		t.Error("/readyz was never seen failing while the pool warmed up")
	}
	_, metrics := get("/metrics")
	for _, want := range []string{
		`jazzmine_pool_containers{`, `sandbox="default"`, `state="idle"`, `jazzmine_pool_capacity{`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	a := newAgent(t, nc)
	gauge := func(state string) float64 {
		_, m := get("/metrics")
		return metricValue(m, `jazzmine_pool_containers{`, `state="`+state+`"`)
	}
	if n := gauge("in_use"); n != 0 {
		t.Errorf("in_use before any job = %v", n)
	}
	slow := newID("slow")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: slow, Sandbox: "default", Script: "print('in', flush=True)\nimport time\ntime.sleep(2)\nemit_result(1)"})
	testenv.WaitFor(t, time.Minute, "the slow job to start", func() bool { return find(a.allEvents(slow), wire.EventStdout) != nil })
	if n := gauge("in_use"); n != 1 {
		t.Errorf("in_use while a job runs = %v, want 1", n)
	}
	a.events(slow, time.Minute)
	testenv.WaitFor(t, 10*time.Second, "the container to come back", func() bool { return gauge("in_use") == 0 && gauge("idle") >= 1 })
	for i := range 3 {
		jid := newID("m")
		a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: jid, Sandbox: "default", Script: "emit_result(" + strconv.Itoa(i) + ")"})
		a.events(jid, time.Minute)
	}
	testenv.WaitFor(t, 10*time.Second, "the job counters to show the four jobs", func() bool {
		_, m := get("/metrics")
		return metricValue(m, `jazzmine_jobs_total{`, `outcome="ran"`) == 4 &&
			metricValue(m, `jazzmine_execution_duration_seconds_count{`, `outcome="success"`) == 4 &&
			metricValue(m, `jazzmine_pool_spawned_total{`, `sandbox="default"`) >= 1
	})
}

// metricValue finds the sample of the Prometheus text whose line starts with prefix
// and contains label, or -1.
func metricValue(text, prefix, label string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) && strings.Contains(line, label) {
			f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
