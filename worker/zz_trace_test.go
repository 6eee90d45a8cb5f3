package worker_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

func TestZZBreakdown(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	_, nc := testenv.NATS(t)
	startWorkerWith(t, nc, 2, 0, 1<<30, func(c *worker.Config) { c.TracerProvider = tp; c.Propagator = propagation.TraceContext{} })
	c := newClient(t, nc)
	ctx := context.Background()
	run(t, ctx, c, 5)
	type times struct{ submit, done time.Time }
	jobs := map[string]*times{}
	for i := range 500 {
		time.Sleep(5 * time.Millisecond)
		id := fmt.Sprintf("bd%d", i)
		t0 := time.Now()
		res, err := c.Run(ctx, wire.Job{ExecutionID: id, Sandbox: "default", Script: trivial})
		if err != nil || !res.Success {
			t.Fatal(err)
		}
		jobs[id] = &times{t0, time.Now()}
	}
	spans := rec.Ended()
	// group by trace: process span has attribute messaging.message.id
	byTrace := map[string]map[string]sdktrace.ReadOnlySpan{}
	ids := map[string]string{}
	for _, s := range spans {
		tid := s.SpanContext().TraceID().String()
		if byTrace[tid] == nil {
			byTrace[tid] = map[string]sdktrace.ReadOnlySpan{}
		}
		name := s.Name()
		if len(name) > 8 && name[len(name)-8:] == " process" {
			name = "process"
			for _, a := range s.Attributes() {
				if a.Key == "messaging.message.id" {
					ids[tid] = a.Value.AsString()
				}
			}
		}
		byTrace[tid][name] = s
	}
	var a, b, cc, d, e []float64
	for tid, m := range byTrace {
		j := jobs[ids[tid]]
		if j == nil || m["process"] == nil || m["execute"] == nil || m["publish events"] == nil {
			continue
		}
		us := func(x, y time.Time) float64 { return float64(y.Sub(x).Microseconds()) }
		a = append(a, us(j.submit, m["process"].StartTime()))
		b = append(b, us(m["process"].StartTime(), m["execute"].StartTime()))
		cc = append(cc, us(m["execute"].StartTime(), m["execute"].EndTime()))
		d = append(d, us(m["execute"].EndTime(), j.done))
		e = append(e, us(j.submit, j.done))
	}
	med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	fmt.Printf("n=%d submit->worker %.0f, worker->execute %.0f, execute %.0f, execute end->client done %.0f, total %.0f us\n", len(a), med(a), med(b), med(cc), med(d), med(e))
}
