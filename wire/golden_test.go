package wire_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/jazzmine/worker/wire"
)

// The golden files under testdata/golden hold jobs and events as this package
// encoded them before it was rewritten on the msgpack library: the Python
// harness and Go clients already in flight send and expect exactly these
// bytes. Regenerate them only for a deliberate change of the wire format,
// with go test ./wire -run Golden -update.
var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

var goldenJobs = map[string]wire.Job{
	"job_minimal": {ExecutionID: "e1", Script: "emit_result(1)"},
	"job_every_field": {
		ExecutionID: "exec_2", Sandbox: "default", Script: "import json\nprint(\"<tag> & 'quotes' é ✓ 日本語 🐍\")\n",
		Mode: wire.ModeInteractive, TimeoutSec: 2.5, MaxOutputBytes: 1 << 40,
		RequiredSecrets: []string{"API_KEY", "TOKEN"}, Metadata: map[string]string{"agent": "planner", "z": "", "ü": "ö"},
	},
	"job_extremes": {
		ExecutionID: "x", Script: "\x00\x01\b\f\t\n\r\x1f\x7f\"\\/\u2028\u2029<>&", TimeoutSec: 1e-7, MaxOutputBytes: math.MaxInt64,
		RequiredSecrets: []string{""}, Metadata: map[string]string{"k": "\u2028"},
	},
	"job_negative_and_whole": {ExecutionID: "x", Script: "s", TimeoutSec: 30, MaxOutputBytes: -1},
}

// goldenEvent is an event to encode and what each encoding decodes it to,
// when that differs from the event (Go values the decoders do not give).
type goldenEvent struct {
	event   wire.Event
	decoded map[string]any // content type -> Data after decoding
}

func goldenEvents() map[string]goldenEvent {
	at := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	ev := func(typ string, edit func(e *wire.Event)) wire.Event {
		e := wire.Event{ExecutionID: "exec-1", Type: typ, Seq: 3, Attempt: 2, WorkerID: "worker-a", Time: at, Metadata: map[string]string{"agent": "planner"}}
		edit(&e)
		return e
	}
	both := func(v any) map[string]any { return map[string]any{wire.ContentTypeMsgpack: v, wire.ContentTypeJSON: v} }
	return map[string]goldenEvent{
		"event_zero":    {event: wire.Event{}},
		"event_started": {event: ev(wire.EventStarted, func(e *wire.Event) { e.Sandbox, e.ContainerID = "default", "0123456789ab" })},
		"event_log_other_zone": {event: ev(wire.EventLog, func(e *wire.Event) {
			e.Level, e.Message, e.Metadata = "info", "héllo\x00", nil
			e.Time = time.Date(2025, 1, 2, 3, 4, 5, 6, time.FixedZone("", -(5*3600+30*60)))
		})},
		"event_stdout": {event: ev(wire.EventStdout, func(e *wire.Event) { e.Text = "line 1\nline 2 <ok> & \b\f\x1b[0m 🐍\n" })},
		"event_error": {event: ev(wire.EventError, func(e *wire.Event) {
			e.Error, e.Traceback, e.Kind = "ZeroDivisionError: division by zero", "Traceback (most recent call last):\n  ...", wire.KindScript
		})},
		"event_intermediate_nested": {event: ev(wire.EventIntermediate, func(e *wire.Event) { e.Label = "step 1"; e.Data = nestedData() })},
		"event_final_extremes": {event: ev(wire.EventFinalResult, func(e *wire.Event) {
			e.Data = []any{int64(math.MinInt64), int64(math.MaxInt64), uint64(math.MaxInt64 + 1), uint64(math.MaxUint64), math.Copysign(0, -1), 0.0, 1e21, 1e20,
				1e-6, 1e-7, math.MaxFloat64, math.SmallestNonzeroFloat64, -1.5, int64(-33), int64(-32), int64(127), int64(128), int64(255), int64(256),
				int64(65535), int64(65536), int64(1 << 32), "", "\u2028\u2029\b\f\x00\x1f\x7f<>&", map[string]any{"": nil, "é": []any{}}}
		})},
		"event_final_falsy": {event: ev(wire.EventFinalResult, func(e *wire.Event) { e.Data = false })},
		"event_final_raw": {event: ev(wire.EventFinalResult, func(e *wire.Event) {
			e.Data = json.RawMessage(` {"z": 1.50, "a": [1e2, "<&>", "\u00e9", 18446744073709551615, -0, 1E+2, 12345678901234567890123], "n": null} `)
		}), decoded: both(map[string]any{"z": 1.5, "a": []any{100.0, "<&>", "é", uint64(math.MaxUint64), int64(0), 100.0, 1.2345678901234568e22}, "n": nil})},
		"event_final_go_values": {event: ev(wire.EventFinalResult, func(e *wire.Event) {
			e.Data = []any{int8(-1), uint16(2), 7, float32(0.5), float32(2), json.Number("3"), json.Number("3.0"), []byte("bin")}
		}), decoded: map[string]any{
			wire.ContentTypeMsgpack: []any{int64(-1), int64(2), int64(7), 0.5, 2.0, int64(3), 3.0, "bin"},
			wire.ContentTypeJSON:    []any{int64(-1), int64(2), int64(7), 0.5, 2.0, int64(3), 3.0, "Ymlu"},
		}},
		"event_script_done_ok": {event: ev(wire.EventScriptDone, func(e *wire.Event) {
			e.Success, e.DurationMS, e.OutputBytes, e.FinalData = true, 1234, 99, map[string]any{"n": int64(1), "f": 1.0}
		})},
		"event_script_done_failed": {event: ev(wire.EventScriptDone, func(e *wire.Event) { e.Error = "timed out after 30s" })},
		"event_unknown_type":       {event: ev("progress", func(e *wire.Event) { e.Text = "50%"; e.Success = true; e.OutputBytes = -5 })},
	}
}

func goldenFile(t *testing.T, name, ct string, got []byte) []byte {
	t.Helper()
	path := filepath.Join("testdata", "golden", name+"."+wireName(ct))
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// sameJSON reports whether got and want are JSON texts of the same values,
// numbers written the same (1.0 is not 1): the old encoder wrote the control
// characters \b and \f of event data as \u0008 and \u000c, encoding/json
// writes \b and \f, as it always did in the other fields.
func sameJSON(ct string, got, want []byte) bool {
	if ct != wire.ContentTypeJSON {
		return false
	}
	decode := func(b []byte) (any, error) {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var v any
		return v, dec.Decode(&v)
	}
	g, gerr := decode(got)
	w, werr := decode(want)
	return gerr == nil && werr == nil && reflect.DeepEqual(g, w)
}

func TestGoldenJobs(t *testing.T) {
	for name, j := range goldenJobs {
		for _, ct := range contentTypes {
			t.Run(name+"/"+wireName(ct), func(t *testing.T) {
				got, err := wire.EncodeJob(ct, &j)
				if err != nil {
					t.Fatalf("EncodeJob: %v", err)
				}
				want := goldenFile(t, name, ct, got)
				if !bytes.Equal(got, want) {
					t.Errorf("EncodeJob gave\n%q\nthe golden file holds\n%q", got, want)
				}
				dec, err := wire.DecodeJob(ct, want)
				if err != nil {
					t.Fatalf("DecodeJob of the golden file: %v", err)
				}
				if !reflect.DeepEqual(*dec, j) {
					t.Errorf("the golden file decodes to\n%#v\nwant\n%#v", *dec, j)
				}
			})
		}
	}
}

func TestGoldenEvents(t *testing.T) {
	for name, g := range goldenEvents() {
		for _, ct := range contentTypes {
			t.Run(name+"/"+wireName(ct), func(t *testing.T) {
				got, err := wire.EncodeEvent(ct, &g.event)
				if err != nil {
					t.Fatalf("EncodeEvent: %v", err)
				}
				want := goldenFile(t, name, ct, got)
				if !bytes.Equal(got, want) && !sameJSON(ct, got, want) {
					t.Errorf("EncodeEvent gave\n%q\nthe golden file holds\n%q", got, want)
				}
				dec, err := wire.DecodeEvent(ct, want)
				if err != nil {
					t.Fatalf("DecodeEvent of the golden file: %v", err)
				}
				expect := g.event
				if d, ok := g.decoded[ct]; ok {
					expect.Data = d
				}
				assertEventEqual(t, dec, &expect)
			})
		}
	}
}
