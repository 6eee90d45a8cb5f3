package wire_test

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/jazzmine/worker/wire"
)

var contentTypes = []string{wire.ContentTypeMsgpack, wire.ContentTypeJSON}

func TestParseContentType(t *testing.T) {
	tests := []struct {
		name   string
		header string
		want   string // empty when the header is rejected
	}{
		{name: "no header means msgpack", header: "", want: wire.ContentTypeMsgpack},
		{name: "msgpack is accepted", header: "application/msgpack", want: wire.ContentTypeMsgpack},
		{name: "JSON is accepted", header: "application/json", want: wire.ContentTypeJSON},
		{name: "a utf-8 charset parameter is ignored", header: "application/json; charset=utf-8", want: wire.ContentTypeJSON},
		{name: "case and spaces are ignored", header: " Application/JSON ;Charset=UTF-8", want: wire.ContentTypeJSON},
		{name: "an unknown parameter is ignored", header: "application/msgpack; v=1", want: wire.ContentTypeMsgpack},
		{name: "another charset is rejected", header: "application/json; charset=latin1"},
		{name: "plain text is rejected", header: "text/plain"},
		{name: "the x-msgpack alias is rejected", header: "application/x-msgpack"},
		{name: "an unparsable header is rejected", header: "application/json; charset"},
		{name: "a bare word is rejected", header: "json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := wire.ParseContentType(tt.header)
			if tt.want == "" {
				if !errors.Is(err, wire.ErrUnsupportedContentType) {
					t.Fatalf("ParseContentType(%q) = %q, %v; want an error wrapping ErrUnsupportedContentType", tt.header, got, err)
				}
				if !strings.Contains(err.Error(), "content type") {
					t.Errorf("error %q does not say it is about the content type", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseContentType(%q) = %q, %v; want %q", tt.header, got, err, tt.want)
			}
		})
	}
}

func TestEncodingsRejectAnUnsupportedContentType(t *testing.T) {
	if _, err := wire.EncodeJob("text/plain", validJob()); !errors.Is(err, wire.ErrUnsupportedContentType) {
		t.Errorf("EncodeJob: %v, want ErrUnsupportedContentType", err)
	}
	if _, err := wire.DecodeJob("text/plain", []byte("{}")); !errors.Is(err, wire.ErrUnsupportedContentType) {
		t.Errorf("DecodeJob: %v, want ErrUnsupportedContentType", err)
	}
	if _, err := wire.EncodeEvent("text/plain", &wire.Event{}); !errors.Is(err, wire.ErrUnsupportedContentType) {
		t.Errorf("EncodeEvent: %v, want ErrUnsupportedContentType", err)
	}
	if _, err := wire.DecodeEvent("text/plain", []byte("{}")); !errors.Is(err, wire.ErrUnsupportedContentType) {
		t.Errorf("DecodeEvent: %v, want ErrUnsupportedContentType", err)
	}
}

func TestJobRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		job  wire.Job
	}{
		{name: "a minimal job", job: wire.Job{ExecutionID: "e1", Script: "emit_result(1)"}},
		{name: "a job with every field", job: wire.Job{
			ExecutionID:     "exec_2",
			Sandbox:         "default",
			Script:          "import json\nprint(\"<tag> & 'quotes' é ✓\")\n",
			Mode:            wire.ModeInteractive,
			TimeoutSec:      2.5,
			MaxOutputBytes:  1 << 40,
			RequiredSecrets: []string{"API_KEY", "TOKEN"},
			Metadata:        map[string]string{"agent": "planner", "z": "", "ü": "ö"},
		}},
	}
	for _, ct := range contentTypes {
		for _, tt := range tests {
			t.Run(ct+"/"+tt.name, func(t *testing.T) {
				b, err := wire.EncodeJob(ct, &tt.job)
				if err != nil {
					t.Fatalf("EncodeJob: %v", err)
				}
				got, err := wire.DecodeJob(ct, b)
				if err != nil {
					t.Fatalf("DecodeJob: %v", err)
				}
				if !reflect.DeepEqual(*got, tt.job) {
					t.Errorf("round trip changed the job:\n got %+v\nwant %+v", *got, tt.job)
				}
			})
		}
	}
}

func TestJobFieldNamesAreSnakeCaseInBothEncodings(t *testing.T) {
	j := wire.Job{
		ExecutionID: "e", Sandbox: "s", Script: "x", Mode: "plan", TimeoutSec: 1, MaxOutputBytes: 2,
		RequiredSecrets: []string{"A"}, Metadata: map[string]string{"k": "v"},
	}
	want := []string{"execution_id", "max_output_bytes", "metadata", "mode", "required_secrets", "sandbox", "script", "timeout_sec"}
	for _, ct := range contentTypes {
		t.Run(ct, func(t *testing.T) {
			m := encodeToMap(t, ct, func(ct string) ([]byte, error) { return wire.EncodeJob(ct, &j) })
			if got := sortedKeys(m); !reflect.DeepEqual(got, want) {
				t.Errorf("keys %v, want %v", got, want)
			}
		})
	}
}

func TestJobLeavesEmptyOptionalFieldsOut(t *testing.T) {
	j := wire.Job{ExecutionID: "e", Script: "x"}
	for _, ct := range contentTypes {
		t.Run(ct, func(t *testing.T) {
			m := encodeToMap(t, ct, func(ct string) ([]byte, error) { return wire.EncodeJob(ct, &j) })
			if got, want := sortedKeys(m), []string{"execution_id", "script"}; !reflect.DeepEqual(got, want) {
				t.Errorf("keys %v, want %v", got, want)
			}
		})
	}
}

// A job as Python's msgpack (1.0.5) packs it: timeout_sec as an integer, and
// an unknown field holding a float, nil and binary data.
const pythonJob = "87ac657865637574696f6e5f6964a7657865632d3432a6736372697074d9217072696e742827686927290a656d69745f726573756c74287b276e273a20317d29ab74696d656f75745f7365631eb06d61785f6f75747075745f6279746573ce00100000b072657175697265645f7365637265747391a74150495f4b4559a86d6574616461746181a56167656e74a7706c616e6e6572ac6675747572655f6669656c6481a1789401cb4004000000000000c0c40100"

func TestDecodeJobPackedByPython(t *testing.T) {
	b, err := hex.DecodeString(pythonJob)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeJob("", b)
	if err != nil {
		t.Fatalf("DecodeJob: %v", err)
	}
	want := &wire.Job{
		ExecutionID:     "exec-42",
		Script:          "print('hi')\nemit_result({'n': 1})",
		TimeoutSec:      30,
		MaxOutputBytes:  1 << 20,
		RequiredSecrets: []string{"API_KEY"},
		Metadata:        map[string]string{"agent": "planner"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if err := got.Validate("default", 0); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestDecodeJobIgnoresUnknownFields(t *testing.T) {
	tests := []struct {
		name string
		ct   string
		in   []byte
	}{
		{name: "JSON with unknown fields of every type", ct: wire.ContentTypeJSON,
			in: []byte(`{"priority": 3, "execution_id": "e", "tags": ["a", {"b": null}], "script": "x", "nested": {"deep": [[[]]]}}`)},
		{name: "msgpack with unknown fields of every type", ct: wire.ContentTypeMsgpack,
			in: mustMsgpack(t, map[string]any{"priority": 3, "execution_id": "e", "tags": []any{"a", map[string]any{"b": nil}}, "script": "x", "ext": msgpackTime(), "bin": []byte{0xff}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := wire.DecodeJob(tt.ct, tt.in)
			if err != nil {
				t.Fatalf("DecodeJob: %v", err)
			}
			if want := (&wire.Job{ExecutionID: "e", Script: "x"}); !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestDecodeJobTreatsNullAsEmpty(t *testing.T) {
	for _, tt := range []struct {
		ct string
		in []byte
	}{
		{wire.ContentTypeJSON, []byte(`{"execution_id":"e","script":"x","mode":null,"timeout_sec":null,"required_secrets":null,"metadata":{}}`)},
		{wire.ContentTypeMsgpack, mustMsgpack(t, map[string]any{"execution_id": "e", "script": "x", "mode": nil, "timeout_sec": nil, "required_secrets": []string{}, "metadata": nil})},
	} {
		t.Run(tt.ct, func(t *testing.T) {
			got, err := wire.DecodeJob(tt.ct, tt.in)
			if err != nil {
				t.Fatalf("DecodeJob: %v", err)
			}
			if want := (&wire.Job{ExecutionID: "e", Script: "x"}); !reflect.DeepEqual(got, want) {
				t.Errorf("got %#v, want %#v", got, want)
			}
		})
	}
}

func TestDecodeJobRejectsMalformedInput(t *testing.T) {
	tests := []struct {
		name    string
		ct      string
		in      []byte
		wantMsg string
	}{
		{name: "empty msgpack", ct: wire.ContentTypeMsgpack, in: nil, wantMsg: "decode msgpack job: empty input"},
		{name: "a msgpack array instead of a map", ct: wire.ContentTypeMsgpack, in: []byte{0x91, 0x01}, wantMsg: "want a map at the top, got an array"},
		{name: "a msgpack string instead of a map", ct: wire.ContentTypeMsgpack, in: []byte{0xa1, 'x'}, wantMsg: "got a string"},
		{name: "JSON bytes sent as msgpack", ct: wire.ContentTypeMsgpack, in: []byte(`{"execution_id":"e"}`), wantMsg: "decode msgpack job: want a map at the top, got the byte '{', which starts a JSON object (is the Content-Type header wrong?)"},
		{name: "a truncated msgpack map", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"script": "abc"})[:8], wantMsg: "truncated"},
		{name: "a msgpack map missing its last value", ct: wire.ContentTypeMsgpack, in: []byte{0x81, 0xa1, 'a'}, wantMsg: "unexpected end of input"},
		{name: "trailing bytes after the msgpack map", ct: wire.ContentTypeMsgpack, in: []byte{0x80, 0x00}, wantMsg: "1 bytes of trailing data"},
		{name: "the reserved msgpack code", ct: wire.ContentTypeMsgpack, in: []byte{0x81, 0xa1, 'a', 0xc1}, wantMsg: "0xc1 is not a msgpack type code"},
		{name: "a msgpack integer key", ct: wire.ContentTypeMsgpack, in: []byte{0x81, 0x01, 0x01}, wantMsg: "map keys must be strings, got an integer"},
		{name: "a msgpack integer execution id", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"execution_id": 7}),
			wantMsg: `decode msgpack job: field "execution_id": want a string, got an integer`},
		{name: "a msgpack string timeout", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"timeout_sec": "30"}),
			wantMsg: `field "timeout_sec": want a number, got a string`},
		{name: "a msgpack float max_output_bytes", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"max_output_bytes": 1.5}),
			wantMsg: `field "max_output_bytes": want an integer, got a float`},
		{name: "a msgpack max_output_bytes above int64", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"max_output_bytes": uint64(1 << 63)}),
			wantMsg: `field "max_output_bytes": 9223372036854775808 is too large`},
		{name: "a msgpack NaN timeout", ct: wire.ContentTypeMsgpack, in: []byte{0x81, 0xab, 't', 'i', 'm', 'e', 'o', 'u', 't', '_', 's', 'e', 'c', 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1},
			wantMsg: `field "timeout_sec": NaN is not a number JSON can carry`},
		{name: "a msgpack string of secrets", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"required_secrets": "API_KEY"}),
			wantMsg: `field "required_secrets": want an array of strings, got a string`},
		{name: "a msgpack number among the secrets", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"required_secrets": []any{"A", 1}}),
			wantMsg: `field "required_secrets": element 1: want a string, got an integer`},
		{name: "a msgpack number in the metadata", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"metadata": map[string]any{"k": 1}}),
			wantMsg: `field "metadata": key "k": want a string, got an integer`},
		{name: "a msgpack script that is not UTF-8", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"script": "\xff"}),
			wantMsg: `field "script": string "\xff" is not valid UTF-8`},
		{name: "a msgpack timestamp as the script", ct: wire.ContentTypeMsgpack, in: mustMsgpack(t, map[string]any{"script": msgpackTime()}),
			wantMsg: `field "script": want a string, got an extension type`},

		{name: "empty JSON", ct: wire.ContentTypeJSON, in: nil, wantMsg: "decode JSON job: empty input"},
		{name: "a JSON array", ct: wire.ContentTypeJSON, in: []byte(`[{"execution_id":"e"}]`), wantMsg: "want a JSON object at the top, got an array"},
		{name: "JSON null", ct: wire.ContentTypeJSON, in: []byte(`null`), wantMsg: "got null"},
		{name: "msgpack bytes sent as JSON", ct: wire.ContentTypeJSON, in: mustMsgpack(t, map[string]any{"a": "b"}), wantMsg: "decode JSON job: want a JSON object at the top, got the byte 0x81, which starts a msgpack map (is the Content-Type header wrong?)"},
		{name: "truncated JSON", ct: wire.ContentTypeJSON, in: []byte(`{"execution_id": "e`), wantMsg: "unexpected end of JSON input"},
		{name: "trailing JSON", ct: wire.ContentTypeJSON, in: []byte(`{} {}`), wantMsg: "after top-level value"},
		{name: "JSON that is not UTF-8", ct: wire.ContentTypeJSON, in: []byte("{\"script\": \"\xff\"}"), wantMsg: "not valid UTF-8"},
		{name: "a JSON number execution id", ct: wire.ContentTypeJSON, in: []byte(`{"execution_id": 7}`),
			wantMsg: `decode JSON job: field "execution_id": want a string, got a JSON number`},
		{name: "a JSON string timeout", ct: wire.ContentTypeJSON, in: []byte(`{"timeout_sec": "30"}`), wantMsg: `field "timeout_sec": want a number, got a JSON string`},
		{name: "a JSON fractional max_output_bytes", ct: wire.ContentTypeJSON, in: []byte(`{"max_output_bytes": 1.5}`), wantMsg: `field "max_output_bytes": want an integer, got a JSON number 1.5`},
		{name: "a JSON object of secrets", ct: wire.ContentTypeJSON, in: []byte(`{"required_secrets": {"A": 1}}`), wantMsg: `field "required_secrets": want an array of strings, got a JSON object`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := wire.DecodeJob(tt.ct, tt.in)
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("DecodeJob = %+v, %v; want an error wrapping ErrMalformed", j, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("DecodeJob error %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

func TestDecodeJobReadsLargeUnsignedIntegersAsTheyAre(t *testing.T) {
	b := mustMsgpack(t, map[string]any{"execution_id": "e", "script": "x", "timeout_sec": uint64(1 << 63)})
	j, err := wire.DecodeJob(wire.ContentTypeMsgpack, b)
	if err != nil {
		t.Fatalf("DecodeJob: %v", err)
	}
	if j.TimeoutSec != 1<<63 {
		t.Errorf("timeout_sec %v, want %v", j.TimeoutSec, float64(1<<63))
	}
	if err := j.Validate("s", 0); !errors.Is(err, wire.ErrInvalidJob) || !strings.Contains(err.Error(), "timeout_sec 9.223372036854776e+18 is invalid") {
		t.Errorf("Validate: %v, want the timeout rejected as it was sent", err)
	}
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestDecodeDoesNotAllocateWhatTheInputAnnounces(t *testing.T) {
	const limit = 1 << 20 // far below the gigabytes announced
	tests := []struct {
		name string
		in   []byte
	}{
		{name: "a 4-byte input with the length of a 4 GiB array", in: []byte{0xdd, 0xff, 0xff, 0xff}},
		{name: "a top-level map of 4 billion entries", in: []byte{0xdf, 0xff, 0xff, 0xff, 0xff}},
		{name: "a 4 GiB script", in: []byte{0x81, 0xa6, 's', 'c', 'r', 'i', 'p', 't', 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}},
		{name: "4 billion secrets", in: []byte{0x81, 0xb0, 'r', 'e', 'q', 'u', 'i', 'r', 'e', 'd', '_', 's', 'e', 'c', 'r', 'e', 't', 's', 0xdd, 0xff, 0xff, 0xff, 0xff, 0xa0}},
		{name: "4 billion metadata entries", in: []byte{0x81, 0xa8, 'm', 'e', 't', 'a', 'd', 'a', 't', 'a', 0xdf, 0xff, 0xff, 0xff, 0xff, 0xa0, 0xa0}},
		{name: "a 4 GiB array as event data", in: []byte{0x81, 0xa4, 'd', 'a', 't', 'a', 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}},
		{name: "a 4 GiB binary in an unknown field", in: []byte{0x81, 0xa1, 'z', 0xc6, 0xff, 0xff, 0xff, 0xff, 0x00}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var jobErr, eventErr error
			n := allocated(func() {
				_, jobErr = wire.DecodeJob(wire.ContentTypeMsgpack, tt.in)
				_, eventErr = wire.DecodeEvent(wire.ContentTypeMsgpack, tt.in)
			})
			if !errors.Is(jobErr, wire.ErrMalformed) || !errors.Is(eventErr, wire.ErrMalformed) {
				t.Errorf("DecodeJob: %v; DecodeEvent: %v; want errors wrapping ErrMalformed", jobErr, eventErr)
			}
			if n > limit {
				t.Errorf("decoding %d bytes allocated %d bytes", len(tt.in), n)
			}
		})
	}
}

func TestEventDecodeMsgpackBoundsAllocationsWithoutTheInputCheck(t *testing.T) {
	// msgpack.Unmarshal calls Event.DecodeMsgpack without DecodeEvent's check
	// of the whole input; the announced lengths still must not be allocated.
	in := []byte{0x81, 0xa4, 'd', 'a', 't', 'a', 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}
	var ev wire.Event
	var err error
	n := allocated(func() { err = msgpack.Unmarshal(in, &ev) })
	if err == nil {
		t.Error("msgpack.Unmarshal of a truncated event succeeded")
	}
	if n > 1<<20 {
		t.Errorf("decoding %d bytes allocated %d bytes", len(in), n)
	}
}

func TestADeepTypeErrorNamesItsPathWithoutAllocatingItOverAndOver(t *testing.T) {
	// An extension type 9999 arrays deep: wrapping the error at each level
	// allocated 259 MB for these 10 kB.
	in := []byte{0x81, 0xa4, 'd', 'a', 't', 'a'}
	in = append(in, []byte(strings.Repeat("\x91", 9999))...)
	in = append(in, 0xd4, 1, 0) // fixext 1
	var err error
	n := allocated(func() { _, err = wire.DecodeEvent(wire.ContentTypeMsgpack, in) })
	want := `decode msgpack event: field "data": ` + strings.Repeat("[0]: ", 9999) + "got an extension type, which JSON cannot carry"
	if !errors.Is(err, wire.ErrMalformed) || err.Error() != want {
		t.Errorf("DecodeEvent error %.200q..., want %.200q...", err, want)
	}
	if n > 4<<20 {
		t.Errorf("decoding %d bytes allocated %d bytes", len(in), n)
	}
}

func TestDecodeRejectsDeepNesting(t *testing.T) {
	deep := func(open, close string, n int) []byte {
		return []byte(`{"data":` + strings.Repeat(open, n) + strings.Repeat(close, n) + `}`)
	}
	msgpackDeep := func(n int) []byte {
		b := []byte{0x81, 0xa4, 'd', 'a', 't', 'a'}
		b = append(b, []byte(strings.Repeat("\x91", n))...)
		return append(b, 0xc0)
	}
	tests := []struct {
		name string
		ct   string
		in   []byte
	}{
		{name: "JSON arrays a million deep", ct: wire.ContentTypeJSON, in: deep("[", "]", 1e6)},
		{name: "msgpack arrays a million deep", ct: wire.ContentTypeMsgpack, in: msgpackDeep(1e6)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := wire.DecodeEvent(tt.ct, tt.in); !errors.Is(err, wire.ErrMalformed) {
				t.Errorf("DecodeEvent: %v, want an error wrapping ErrMalformed", err)
			}
		})
	}
	t.Run("msgpack arrays 1000 deep decode", func(t *testing.T) {
		ev, err := wire.DecodeEvent(wire.ContentTypeMsgpack, msgpackDeep(1000))
		if err != nil {
			t.Fatalf("DecodeEvent: %v", err)
		}
		if _, err := wire.EncodeEvent(wire.ContentTypeJSON, ev); err != nil {
			t.Errorf("EncodeEvent as JSON: %v", err)
		}
	})
}

func mustMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// msgpackTime returns a value the msgpack library encodes as a timestamp
// extension.
func msgpackTime() any {
	return msgpack.RawMessage{0xd6, 0xff, 0, 0, 0, 1}
}

// encodeToMap encodes with encode and decodes the bytes generically, to look
// at the field names on the wire.
func encodeToMap(t *testing.T, ct string, encode func(ct string) ([]byte, error)) map[string]any {
	t.Helper()
	b, err := encode(ct)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	var m map[string]any
	if ct == wire.ContentTypeJSON {
		err = json.Unmarshal(b, &m)
	} else {
		err = msgpack.Unmarshal(b, &m)
	}
	if err != nil {
		t.Fatalf("decode %q generically: %v", b, err)
	}
	return m
}

func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}
