package wire_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/jazzmine/worker/wire"
)

var eventTime = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

// event returns an event of type typ with the fields every event has.
func event(typ string, edit func(e *wire.Event)) wire.Event {
	e := wire.Event{
		ExecutionID: "exec-1",
		Type:        typ,
		Seq:         3,
		Attempt:     1,
		WorkerID:    "worker-a",
		Time:        eventTime,
		Metadata:    map[string]string{"agent": "planner"},
	}
	if edit != nil {
		edit(&e)
	}
	return e
}

// nestedData holds every kind of value Data may hold after decoding.
func nestedData() any {
	return map[string]any{
		"null":   nil,
		"true":   true,
		"false":  false,
		"int":    int64(-42),
		"big":    uint64(math.MaxUint64),
		"float":  1.5,
		"whole":  2.0,
		"tiny":   1e-300,
		"string": "é <b> & \"q\" \n\u2028",
		"empty":  "",
		"list":   []any{int64(1), "two", nil, []any{}, map[string]any{}},
		"map":    map[string]any{"nested": map[string]any{"deeper": []any{int64(0), 0.25}}},
	}
}

func TestEventRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		event wire.Event
	}{
		{name: "started", event: event(wire.EventStarted, func(e *wire.Event) { e.Sandbox = "default"; e.ContainerID = "0123456789ab" })},
		{name: "intermediate with nested data", event: event(wire.EventIntermediate, func(e *wire.Event) { e.Label = "step 1"; e.Data = nestedData() })},
		{name: "log", event: event(wire.EventLog, func(e *wire.Event) { e.Level = "info"; e.Message = "hello" })},
		{name: "stdout", event: event(wire.EventStdout, func(e *wire.Event) { e.Text = "line 1\nline 2 <ok>\n" })},
		{name: "stderr", event: event(wire.EventStderr, func(e *wire.Event) { e.Text = "warning\n" })},
		{name: "final_result with a list", event: event(wire.EventFinalResult, func(e *wire.Event) { e.Data = []any{int64(1), 2.5, "x", nil} })},
		{name: "final_result with null data", event: event(wire.EventFinalResult, nil)},
		{name: "error from the script", event: event(wire.EventError, func(e *wire.Event) {
			e.Error = "ZeroDivisionError: division by zero"
			e.Traceback = "Traceback (most recent call last):\n  ..."
			e.Kind = wire.KindScript
		})},
		{name: "script_done that succeeded", event: event(wire.EventScriptDone, func(e *wire.Event) {
			e.Success = true
			e.DurationMS = 1234
			e.OutputBytes = 99
			e.FinalData = nestedData()
		})},
		{name: "script_done that failed with zero counts", event: event(wire.EventScriptDone, func(e *wire.Event) {
			e.Error = "timed out after 30s"
		})},
		{name: "an event of a type this version does not know", event: event("progress", func(e *wire.Event) { e.Text = "50%" })},
		{name: "an event without metadata and a time in another zone", event: event(wire.EventLog, func(e *wire.Event) {
			e.Metadata = nil
			e.Time = time.Date(2025, 1, 2, 3, 4, 5, 6, time.FixedZone("", 2*3600))
		})},
	}
	for _, ct := range contentTypes {
		for _, tt := range tests {
			t.Run(ct+"/"+tt.name, func(t *testing.T) {
				b, err := wire.EncodeEvent(ct, &tt.event)
				if err != nil {
					t.Fatalf("EncodeEvent: %v", err)
				}
				got, err := wire.DecodeEvent(ct, b)
				if err != nil {
					t.Fatalf("DecodeEvent(%q): %v", b, err)
				}
				assertEventEqual(t, got, &tt.event)
			})
		}
	}
}

// assertEventEqual compares events, their times with time.Equal.
func assertEventEqual(t *testing.T, got, want *wire.Event) {
	t.Helper()
	if !got.Time.Equal(want.Time) {
		t.Errorf("time %v, want %v", got.Time, want.Time)
	}
	g, w := *got, *want
	g.Time, w.Time = time.Time{}, time.Time{}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("events differ:\n got %#v\nwant %#v", g, w)
	}
}

func TestScriptDoneCarriesSuccessFalse(t *testing.T) {
	failed := event(wire.EventScriptDone, func(e *wire.Event) { e.Error = "boom" })
	logged := event(wire.EventLog, func(e *wire.Event) { e.Message = "hi" })
	for _, ct := range contentTypes {
		t.Run(ct, func(t *testing.T) {
			m := encodeToMap(t, ct, func(ct string) ([]byte, error) { return wire.EncodeEvent(ct, &failed) })
			if v, ok := m["success"]; !ok || v != false {
				t.Errorf("script_done success = %v (present: %v), want false on the wire", v, ok)
			}
			for _, k := range []string{"duration_ms", "output_bytes"} {
				if _, ok := m[k]; !ok {
					t.Errorf("script_done has no %s, want it even when zero", k)
				}
			}

			m = encodeToMap(t, ct, func(ct string) ([]byte, error) { return wire.EncodeEvent(ct, &logged) })
			for _, k := range []string{"success", "duration_ms", "output_bytes", "data", "final_data", "text"} {
				if _, ok := m[k]; ok {
					t.Errorf("a log event carries %s, want only its own fields", k)
				}
			}
		})
	}
}

func TestEventFieldNamesAreSnakeCaseInBothEncodings(t *testing.T) {
	e := event(wire.EventScriptDone, func(e *wire.Event) {
		e.Sandbox, e.ContainerID, e.Label, e.Data = "s", "c", "l", 1
		e.Level, e.Message, e.Text = "info", "m", "t"
		e.Error, e.Traceback, e.Kind = "e", "tb", wire.KindScript
		e.Success, e.DurationMS, e.OutputBytes, e.FinalData = true, 1, 2, 3
	})
	want := []string{"attempt", "container_id", "data", "duration_ms", "error", "execution_id", "final_data", "kind", "label",
		"level", "message", "metadata", "output_bytes", "sandbox", "seq", "success", "text", "time", "traceback", "type", "worker_id"}
	for _, ct := range contentTypes {
		t.Run(ct, func(t *testing.T) {
			m := encodeToMap(t, ct, func(ct string) ([]byte, error) { return wire.EncodeEvent(ct, &e) })
			if got := sortedKeys(m); !reflect.DeepEqual(got, want) {
				t.Errorf("keys %v\nwant %v", got, want)
			}
			if ts, ok := m["time"].(string); !ok || ts != "2025-03-01T12:00:00.123456789Z" {
				t.Errorf("time on the wire is %#v, want the RFC 3339 string", m["time"])
			}
		})
	}
}

func TestEventDataKeepsFalsyValues(t *testing.T) {
	for _, data := range []any{false, int64(0), 0.0, "", []any{}, map[string]any{}} {
		for _, ct := range contentTypes {
			e := event(wire.EventFinalResult, func(e *wire.Event) { e.Data = data })
			b, err := wire.EncodeEvent(ct, &e)
			if err != nil {
				t.Fatalf("EncodeEvent(%#v): %v", data, err)
			}
			got, err := wire.DecodeEvent(ct, b)
			if err != nil {
				t.Fatalf("DecodeEvent: %v", err)
			}
			if !reflect.DeepEqual(got.Data, data) {
				t.Errorf("%s: data %#v came back as %#v", ct, data, got.Data)
			}
		}
	}
}

func TestEventDataIsTheSameInBothEncodings(t *testing.T) {
	// The harness's JSON, as the worker passes it on.
	raw := json.RawMessage(`{"n": 1, "f": 1.0, "e": 1e3, "big": 18446744073709551615, "huge": 123456789012345678901234567890,
		"s": "<é>", "l": [true, null, -3, []], "m": {}}`)
	want := map[string]any{
		"n": int64(1), "f": 1.0, "e": 1000.0, "big": uint64(math.MaxUint64), "huge": 1.2345678901234568e29,
		"s": "<é>", "l": []any{true, nil, int64(-3), []any{}}, "m": map[string]any{},
	}
	const wantJSON = `{"big":18446744073709551615,"e":1000.0,"f":1.0,"huge":1.2345678901234568e+29,"l":[true,null,-3,[]],"m":{},"n":1,"s":"<é>"}`

	for _, ct := range contentTypes {
		t.Run(ct, func(t *testing.T) {
			e := event(wire.EventIntermediate, func(e *wire.Event) { e.Data = raw })
			b, err := wire.EncodeEvent(ct, &e)
			if err != nil {
				t.Fatalf("EncodeEvent: %v", err)
			}
			got, err := wire.DecodeEvent(ct, b)
			if err != nil {
				t.Fatalf("DecodeEvent: %v", err)
			}
			if !reflect.DeepEqual(got.Data, want) {
				t.Errorf("data\n got %#v\nwant %#v", got.Data, want)
			}

			// Whatever the encoding it came in, the decoded event encodes
			// as JSON, with integers and floats told apart.
			j, err := wire.EncodeEvent(wire.ContentTypeJSON, got)
			if err != nil {
				t.Fatalf("EncodeEvent as JSON: %v", err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(j, &m); err != nil {
				t.Fatal(err)
			}
			if string(m["data"]) != wantJSON {
				t.Errorf("data as JSON\n got %s\nwant %s", m["data"], wantJSON)
			}
		})
	}
}

func TestEventRawJSONPassesThroughUntouched(t *testing.T) {
	raw := json.RawMessage(`{ "z": 1.50, "a": [1e2, "<&>", "\u00e9"] }`)
	e := event(wire.EventFinalResult, func(e *wire.Event) { e.Data = raw })
	b, err := wire.EncodeEvent(wire.ContentTypeJSON, &e)
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, append([]byte(`"data":`), compact.Bytes()...)) {
		t.Errorf("encoded event %s does not hold the data as given, %s", b, compact.Bytes())
	}
}

func TestEventFromMsgpackEncodesAsJSON(t *testing.T) {
	// An event packed by another msgpack library: keys, maps and binary
	// data the way the Go library decodes into map[interface{}]interface{}
	// when left alone.
	b := mustMsgpack(t, map[string]any{
		"execution_id": "e", "type": wire.EventFinalResult, "seq": 1, "attempt": 1, "time": "2025-01-01T00:00:00Z",
		"data": map[string]any{"m": map[string]any{"k": []any{int8(1), uint16(2), float32(0.5), []byte("bin")}}},
	})
	ev, err := wire.DecodeEvent(wire.ContentTypeMsgpack, b)
	if err != nil {
		t.Fatalf("DecodeEvent: %v", err)
	}
	want := map[string]any{"m": map[string]any{"k": []any{int64(1), int64(2), 0.5, "bin"}}}
	if !reflect.DeepEqual(ev.Data, want) {
		t.Errorf("data %#v, want %#v", ev.Data, want)
	}
	j, err := json.Marshal(ev)
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	if !strings.Contains(string(j), `"data":{"m":{"k":[1,2,0.5,"bin"]}}`) {
		t.Errorf("JSON %s", j)
	}
}

// An event as Python's msgpack (1.0.5) packs it.
const pythonEvent = "87ac657865637574696f6e5f6964a7657865632d3432a474797065ac66696e616c5f726573756c74a373657107a7617474656d707401a9776f726b65725f6964a27731a474696d65b6323032352d30332d30315431323a30303a30302e355aa46461746185a16e01a166cb3ff0000000000000a173a2c3a9a16c94c3c0fdcfffffffffffffffffa3626967cf8000000000000000"

func TestDecodeEventPackedByPython(t *testing.T) {
	b, err := hex.DecodeString(pythonEvent)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeEvent(wire.ContentTypeMsgpack, b)
	if err != nil {
		t.Fatalf("DecodeEvent: %v", err)
	}
	want := &wire.Event{
		ExecutionID: "exec-42", Type: wire.EventFinalResult, Seq: 7, Attempt: 1, WorkerID: "w1",
		Time: time.Date(2025, 3, 1, 12, 0, 0, 5e8, time.UTC),
		Data: map[string]any{"n": int64(1), "f": 1.0, "s": "é", "l": []any{true, nil, int64(-3), uint64(math.MaxUint64)}, "big": uint64(1 << 63)},
	}
	assertEventEqual(t, got, want)
}

func TestEncodeEventRejectsWhatCannotBeDecoded(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(e *wire.Event)
		wantMsg string
	}{
		{name: "invalid raw JSON", edit: func(e *wire.Event) { e.Data = json.RawMessage(`{"a":`) }, wantMsg: "raw JSON data"},
		{name: "raw JSON with trailing data", edit: func(e *wire.Event) { e.Data = json.RawMessage(`1 2`) }, wantMsg: "raw JSON data"},
		{name: "raw JSON with a number beyond float64", edit: func(e *wire.Event) { e.Data = json.RawMessage(`[1e400]`) }, wantMsg: `number "1e400" is too large for a float64`},
		{name: "a year after 9999", edit: func(e *wire.Event) { e.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, wantMsg: "outside 0000-9999"},
	}
	for _, ct := range contentTypes {
		for _, tt := range tests {
			t.Run(ct+"/"+tt.name, func(t *testing.T) {
				e := event(wire.EventFinalResult, tt.edit)
				b, err := wire.EncodeEvent(ct, &e)
				if err == nil {
					t.Fatalf("EncodeEvent = %q, want an error", b)
				}
				if !strings.Contains(err.Error(), tt.wantMsg) || !strings.Contains(err.Error(), `"final_result" event 3 of execution "exec-1"`) {
					t.Errorf("EncodeEvent error %q, want it to name the event and contain %q", err, tt.wantMsg)
				}
			})
		}
	}
}

func TestNonFiniteDataIsNullInJSONAndTheFloatInMsgpack(t *testing.T) {
	e := event(wire.EventFinalResult, func(e *wire.Event) {
		e.Data = []any{math.NaN(), math.Inf(1)}
		e.FinalData = map[string]any{"x": []any{math.Inf(-1), 1.5}}
	})
	b, err := wire.EncodeEvent(wire.ContentTypeJSON, &e)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"data":[null,null]`) || !strings.Contains(string(b), `"final_data":{"x":[null,1.5]}`) {
		t.Errorf("JSON event %s, want NaN and infinities written null", b)
	}
	b, err = wire.EncodeEvent(wire.ContentTypeMsgpack, &e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeEvent(wire.ContentTypeMsgpack, b)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := got.Data.([]any)
	final, _ := got.FinalData.(map[string]any)
	xs, _ := final["x"].([]any)
	if len(data) != 2 || !isNaN(data[0]) || data[1] != math.Inf(1) || len(xs) != 2 || xs[0] != math.Inf(-1) || xs[1] != 1.5 {
		t.Errorf("msgpack event decoded with data %v and final_data %v, want [NaN +Inf] and map[x:[-Inf 1.5]]", got.Data, got.FinalData)
	}
}

func isNaN(v any) bool {
	f, ok := v.(float64)
	return ok && math.IsNaN(f)
}

func TestWithNonfinitePutsTheFloatsBackWhereTheHarnessSaysNullStandsForThem(t *testing.T) {
	var places wire.Nonfinites
	if err := json.Unmarshal([]byte(`[[[], "nan"]]`), &places); err != nil {
		t.Fatal(err)
	}
	v, err := wire.WithNonfinite(json.RawMessage(`null`), places)
	if err != nil || !isNaN(v) {
		t.Errorf("WithNonfinite(null, the top) = %v, %v; want NaN", v, err)
	}
	if err := json.Unmarshal([]byte(`[[["a", 1], "-inf"], [["a", 0], "inf"], [["b"], "nan"], [["a", 7], "nan"], [["c"], "nan"], [["a", 1], "bogus"]]`), &places); err != nil {
		t.Fatal(err)
	}
	v, err = wire.WithNonfinite(json.RawMessage(`{"a": [null, null], "b": 2, "c": null}`), places)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := v.(map[string]any)
	a, _ := m["a"].([]any)
	// "b" holds 2, not null: a place that names something else is ignored, as is an
	// index past the end; a place of an unknown value leaves the null.
	if len(a) != 2 || a[0] != math.Inf(1) || a[1] != math.Inf(-1) || m["b"] != int64(2) || !isNaN(m["c"]) {
		t.Errorf("WithNonfinite = %v, want map[a:[+Inf -Inf] b:2 c:NaN]", v)
	}
	raw := json.RawMessage(`[1]`)
	if v, _ := wire.WithNonfinite(raw, nil); !reflect.DeepEqual(v, raw) {
		t.Errorf("WithNonfinite without places = %v, want the raw JSON as it is", v)
	}
}

func TestDecodeEventRejectsMalformedInput(t *testing.T) {
	tests := []struct {
		name    string
		ct      string
		in      []byte
		wantMsg string
	}{
		{name: "a msgpack negative seq", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"seq": -1}),
			wantMsg: `decode msgpack event: field "seq": -1 is negative, want a non-negative integer`},
		{name: "a msgpack string attempt", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"attempt": "1"}),
			wantMsg: `field "attempt": want an integer, got a string`},
		{name: "a msgpack timestamp as the time", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"time": eventTime}),
			wantMsg: `field "time": want a string, got an extension type`},
		{name: "a msgpack time that is not RFC 3339", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"time": "yesterday"}),
			wantMsg: `field "time": "yesterday" is not an RFC 3339 time`},
		{name: "a msgpack integer success", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"success": 1}),
			wantMsg: `field "success": want a boolean, got an integer`},
		{name: "a msgpack NaN as the duration", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"cpu_ms": math.NaN()}),
			wantMsg: `field "cpu_ms": NaN is not a number JSON can carry`},
		{name: "a msgpack timestamp in the data", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"data": map[string]any{"t": eventTime}}),
			wantMsg: `field "data": ["t"]: got an extension type, which JSON cannot carry`},
		{name: "a msgpack integer map key in the data", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"data": map[int]string{1: "x"}}),
			wantMsg: `field "data": key 0: map keys must be strings, got an integer`},
		{name: "msgpack data that is not UTF-8", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"data": []byte{0xff}}),
			wantMsg: `is not valid UTF-8`},
		{name: "a JSON negative seq", ct: wire.ContentTypeJSON, in: []byte(`{"seq": -1}`),
			wantMsg: `decode JSON event: field "seq": want a non-negative integer, got a JSON number -1`},
		{name: "a JSON time that is not RFC 3339", ct: wire.ContentTypeJSON, in: []byte(`{"time": "2025-13-01T00:00:00Z"}`),
			wantMsg: `field "time": "2025-13-01T00:00:00Z" is not an RFC 3339 time`},
		{name: "a JSON number beyond float64 in the data", ct: wire.ContentTypeJSON, in: []byte(`{"data": [1e400]}`),
			wantMsg: `number "1e400" is too large for a float64`},
		{name: "a JSON array", ct: wire.ContentTypeJSON, in: []byte(`[]`), wantMsg: "want a JSON object at the top"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := wire.DecodeEvent(tt.ct, tt.in)
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("DecodeEvent = %+v, %v; want an error wrapping ErrMalformed", e, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("DecodeEvent error %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

func TestEventMarshalersMatchEncodeEvent(t *testing.T) {
	e := event(wire.EventScriptDone, func(e *wire.Event) { e.FinalData = nestedData() })

	wantJSON, err := wire.EncodeEvent(wire.ContentTypeJSON, &e)
	if err != nil {
		t.Fatal(err)
	}
	gotJSON, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	// json.Marshal escapes HTML characters that EncodeEvent leaves alone;
	// both decode to the same event.
	var fromJSON wire.Event
	if err := json.Unmarshal(gotJSON, &fromJSON); err != nil {
		t.Fatalf("json.Unmarshal(%s): %v", gotJSON, err)
	}
	assertEventEqual(t, &fromJSON, &e)
	if !json.Valid(wantJSON) {
		t.Errorf("EncodeEvent gave invalid JSON %s", wantJSON)
	}

	wantMsgpack, err := wire.EncodeEvent(wire.ContentTypeMsgpack, &e)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	if err := enc.Encode(e); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), wantMsgpack) {
		t.Errorf("msgpack.Encoder gave\n%q\nEncodeEvent gave\n%q", buf.Bytes(), wantMsgpack)
	}
	var fromMsgpack wire.Event
	if err := msgpack.Unmarshal(wantMsgpack, &fromMsgpack); err != nil {
		t.Fatalf("msgpack.Unmarshal: %v", err)
	}
	assertEventEqual(t, &fromMsgpack, &e)
}

func TestEventsInsideOtherJSONDecode(t *testing.T) {
	var batch struct {
		Events []wire.Event `json:"events"`
		Last   wire.Event   `json:"last"`
	}
	in := `{"events": [{"execution_id": "e", "type": "log", "seq": 1, "attempt": 1, "data": 1.0}], "last": null}`
	if err := json.Unmarshal([]byte(in), &batch); err != nil {
		t.Fatalf("json.Unmarshal: %v", err)
	}
	if len(batch.Events) != 1 || batch.Events[0].Data != 1.0 || batch.Events[0].Seq != 1 {
		t.Errorf("decoded %+v", batch)
	}
}

func TestJSONDoesNotEscapeHTML(t *testing.T) {
	e := event(wire.EventStdout, func(e *wire.Event) { e.Text = "<b>a & b</b>" })
	b, err := wire.EncodeEvent(wire.ContentTypeJSON, &e)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"text":"<b>a & b</b>"`)) {
		t.Errorf("encoded %s, want the text unescaped", b)
	}
	j := wire.Job{ExecutionID: "e", Script: "print(1 < 2 & 3 > 2)"}
	b, err = wire.EncodeJob(wire.ContentTypeJSON, &j)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"script":"print(1 < 2 & 3 > 2)"`)) {
		t.Errorf("encoded %s, want the script unescaped", b)
	}
}

func TestEncodeRejectsNil(t *testing.T) {
	for _, ct := range contentTypes {
		if _, err := wire.EncodeJob(ct, nil); err == nil {
			t.Errorf("EncodeJob(%s, nil) succeeded", ct)
		}
		if _, err := wire.EncodeEvent(ct, nil); err == nil {
			t.Errorf("EncodeEvent(%s, nil) succeeded", ct)
		}
	}
}

func TestRawJSONNullDataIsLeftOutOfMsgpackAndWrittenNullInJSON(t *testing.T) {
	for _, raw := range []json.RawMessage{json.RawMessage("null"), json.RawMessage(" null "), {}, nil} {
		e := event(wire.EventFinalResult, func(e *wire.Event) { e.Data = raw })
		m := encodeToMap(t, wire.ContentTypeMsgpack, func(ct string) ([]byte, error) { return wire.EncodeEvent(ct, &e) })
		if v, ok := m["data"]; ok {
			t.Errorf("raw %q: msgpack carries data %#v, want none", raw, v)
		}
		m = encodeToMap(t, wire.ContentTypeJSON, func(ct string) ([]byte, error) { return wire.EncodeEvent(ct, &e) })
		if v, ok := m["data"]; !ok || v != nil {
			t.Errorf("raw %q: JSON carries data %#v (present: %v), want null", raw, v, ok)
		}
	}
}

func TestNonfinitesRefusePlacesThatAreNotAPathAndAValue(t *testing.T) {
	for _, in := range []string{`[["x"]]`, `[[[], 1]]`, `[["a", "nan"]]`, `[[]]`, `{}`} {
		var places wire.Nonfinites
		if err := json.Unmarshal([]byte(in), &places); err == nil {
			t.Errorf("places %s decoded as %v, want an error", in, places)
		}
	}
}
