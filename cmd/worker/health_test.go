package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestReadinessFailsNamingEachCheckUntilAllPass(t *testing.T) {
	var h Health
	warm, connected := errors.New("warming up"), errors.New("disconnected")
	h.Check("pools", func() error { return warm })
	h.Check("nats", func() error { return connected })
	srv := httptest.NewServer(h.Handler(http.NotFoundHandler()))
	defer srv.Close()
	probe := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	if code, body := probe("/readyz"); code != 503 || !strings.Contains(body, "pools: warming up") || !strings.Contains(body, "nats: disconnected") {
		t.Errorf("/readyz with two failing checks = %d %q", code, body)
	}
	warm = nil
	if code, body := probe("/readyz"); code != 503 || strings.Contains(body, "pools") {
		t.Errorf("/readyz with one failing check = %d %q", code, body)
	}
	connected = nil
	if code, _ := probe("/readyz"); code != 200 {
		t.Errorf("/readyz with all checks passing = %d", code)
	}
	if code, _ := probe("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
}

func TestLogsWithASpanInTheirContextCarryItsIDs(t *testing.T) {
	var buf strings.Builder
	log := slog.New(traceHandler{slog.NewJSONHandler(&buf, nil)}).With("sandbox", "default")
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	log.InfoContext(ctx, "with span")
	log.Info("without")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !strings.Contains(lines[0], `"trace_id":"0af7651916cd43dd8448eb211c80319c"`) || !strings.Contains(lines[0], `"span_id":"b7ad6b7169203331"`) || !strings.Contains(lines[0], `"sandbox":"default"`) {
		t.Errorf("log with a span: %s", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("log without a span: %s", lines[1])
	}
}
