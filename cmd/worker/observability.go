package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Telemetry is the OpenTelemetry setup of a worker process: a tracer provider
// exporting the standard way, a meter provider read by Prometheus (and exporting by
// OTLP when asked), and the W3C propagators, all installed as otel's globals.
type Telemetry struct {
	// TracerProvider and MeterProvider are the SDK providers.
	TracerProvider *sdktrace.TracerProvider
	MeterProvider  *sdkmetric.MeterProvider
	// Metrics serves the metrics in the Prometheus text format.
	Metrics http.Handler
}

// setupTelemetry configures OpenTelemetry from the standard environment variables:
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the process (default service name
// "jazzmine-worker"); OTEL_TRACES_SAMPLER picks the sampler (default: parent-based,
// always on). Spans are exported only when OTEL_TRACES_EXPORTER or an
// OTEL_EXPORTER_OTLP_*ENDPOINT is set (by autoexport: otlp over http/protobuf unless
// OTEL_EXPORTER_OTLP_PROTOCOL says grpc); metrics go to OTLP too when
// OTEL_METRICS_EXPORTER is set, and are always served on Telemetry.Metrics. Shutdown
// flushes and stops the exporters.
func setupTelemetry(ctx context.Context, getenv func(string) string) (*Telemetry, error) {
	ropts := []resource.Option{resource.WithTelemetrySDK(), resource.WithHost()}
	if getenv("OTEL_SERVICE_NAME") == "" {
		ropts = append(ropts, resource.WithAttributes(attribute.String("service.name", "jazzmine-worker")))
	}
	res, err := resource.New(ctx, append(ropts, resource.WithFromEnv())...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if wantsExport(getenv, "TRACES") {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("trace exporter: %w", err)
		}
		if !autoexport.IsNoneSpanExporter(exp) {
			topts = append(topts, sdktrace.WithBatcher(exp))
		}
	}
	tp := sdktrace.NewTracerProvider(topts...)

	reg := prometheus.NewRegistry()
	prom, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	if getenv("OTEL_METRICS_EXPORTER") != "" {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, fmt.Errorf("metric exporter: %w", err)
		}
		if !autoexport.IsNoneMetricReader(r) {
			mopts = append(mopts, sdkmetric.WithReader(r))
		}
	}
	mp := sdkmetric.NewMeterProvider(mopts...)
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Telemetry{TracerProvider: tp, MeterProvider: mp, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}, nil
}

func wantsExport(getenv func(string) string, signal string) bool {
	return getenv("OTEL_"+signal+"_EXPORTER") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// Shutdown flushes pending spans and metrics and stops the exporters.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	return errors.Join(t.TracerProvider.Shutdown(ctx), t.MeterProvider.Shutdown(ctx))
}

// Health answers an orchestrator's probes: /healthz while the process serves HTTP,
// /readyz once every registered check passes.
type Health struct {
	mu     sync.Mutex // guards checks
	checks []healthCheck
}

type healthCheck struct {
	name  string
	check func() error
}

// Check adds a readiness check; /readyz fails, naming it, while it returns an error.
func (h *Health) Check(name string, check func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks = append(h.checks, healthCheck{name, check})
}

// Ready returns the failing checks' errors joined, or nil.
func (h *Health) Ready() error {
	h.mu.Lock()
	checks := append([]healthCheck(nil), h.checks...)
	h.mu.Unlock()
	var errs []error
	for _, c := range checks {
		if err := c.check(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		}
	}
	return errors.Join(errs...)
}

// Handler serves /healthz, /readyz and, when metrics is not nil, /metrics.
func (h *Health) Handler(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := h.Ready(); err != nil {
			http.Error(w, "not ready: "+strings.ReplaceAll(err.Error(), "\n", "; "), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	return mux
}

// traceHandler is a slog.Handler that adds trace_id and span_id to records logged
// with a context that carries a span (slog.InfoContext and the like).
type traceHandler struct{ slog.Handler }

// Handle adds the span's ids, then passes the record on.
func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs keeps the wrapper around the derived handler.
func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

// WithGroup keeps the wrapper around the derived handler.
func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
