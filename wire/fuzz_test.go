package wire_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// The seed corpora of the fuzz tests are the f.Add calls below and the files
// under testdata/fuzz/<FuzzName>/: a valid job or event in each encoding, a
// truncated message, a length prefix of 4 GiB, and what Python's msgpack
// packs.

func contentType(useJSON bool) string {
	if useJSON {
		return wire.ContentTypeJSON
	}
	return wire.ContentTypeMsgpack
}

// FuzzDecodeJob checks that DecodeJob never panics, that its errors wrap
// ErrMalformed, and that a job that decodes and validates survives encoding
// and decoding in both encodings unchanged, with the same bytes every time.
func FuzzDecodeJob(f *testing.F) {
	jobs := []wire.Job{
		{ExecutionID: "e1", Script: "emit_result(1)"},
		{
			ExecutionID: "exec-2", Sandbox: "fuzz", Script: "print('é')", Mode: wire.ModeInteractive,
			TimeoutSec: 1.5, MaxOutputBytes: 4096, RequiredSecrets: []string{"API_KEY"}, Metadata: map[string]string{"k": "v"},
		},
	}
	for _, j := range jobs {
		for _, useJSON := range []bool{false, true} {
			b, err := wire.EncodeJob(contentType(useJSON), &j)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(useJSON, b)
		}
	}
	python, _ := hex.DecodeString(pythonJob)
	f.Add(false, python)
	f.Add(true, []byte(`{"execution_id":"e","script":"x","timeout_sec":1e-7,"metadata":{},"unknown":[1,{"a":null}]}`))
	f.Add(false, []byte{0x81, 0xa6, 's', 'c', 'r', 'i', 'p', 't', 0xdb, 0xff, 0xff, 0xff, 0xff})

	f.Fuzz(func(t *testing.T, useJSON bool, b []byte) {
		j, err := wire.DecodeJob(contentType(useJSON), b)
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("DecodeJob error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if err := j.Validate("fuzz", 0); err != nil {
			if !errors.Is(err, wire.ErrInvalidJob) {
				t.Fatalf("Validate error %v does not wrap ErrInvalidJob", err)
			}
			return
		}
		for _, ct := range contentTypes {
			enc, err := wire.EncodeJob(ct, j)
			if err != nil {
				t.Fatalf("EncodeJob(%s) of a valid job %+v: %v", ct, j, err)
			}
			got, err := wire.DecodeJob(ct, enc)
			if err != nil {
				t.Fatalf("DecodeJob(%s, %q) of an encoded valid job: %v", ct, enc, err)
			}
			if err := got.Validate("fuzz", 0); err != nil {
				t.Fatalf("re-decoded job %+v is invalid: %v", got, err)
			}
			if !reflect.DeepEqual(got, j) {
				t.Fatalf("%s round trip changed the job:\n got %#v\nwant %#v", ct, got, j)
			}
			again, err := wire.EncodeJob(ct, got)
			if err != nil || !bytes.Equal(again, enc) {
				t.Fatalf("%s encoding is not stable: %q then %q (%v)", ct, enc, again, err)
			}
		}
	})
}

// FuzzDecodeEvent checks that DecodeEvent never panics, that its errors wrap
// ErrMalformed, and that an event that decodes encodes in both encodings and
// decodes back to the same event, with the same bytes every time.
func FuzzDecodeEvent(f *testing.F) {
	events := []wire.Event{
		event(wire.EventScriptDone, func(e *wire.Event) { e.Error = "boom" }),
		event(wire.EventIntermediate, func(e *wire.Event) { e.Label = "l"; e.Data = nestedData() }),
		event(wire.EventFinalResult, func(e *wire.Event) { e.Data = json.RawMessage(`[1, 1.0, -0.0, 1e21, 1e-7, "\u2028"]`) }),
	}
	for _, e := range events {
		for _, useJSON := range []bool{false, true} {
			b, err := wire.EncodeEvent(contentType(useJSON), &e)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(useJSON, b)
		}
	}
	python, _ := hex.DecodeString(pythonEvent)
	f.Add(false, python)
	f.Add(true, []byte(`{"type":"log","time":"2025-01-01T00:00:00+01:00","data":{"a":[18446744073709551616,-9223372036854775809]}}`))
	f.Add(false, []byte{0x81, 0xa4, 'd', 'a', 't', 'a', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add(false, []byte{0x81, 0xa4, 'd', 'a', 't', 'a', 0x92, 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1, 0xca, 0xff, 0x80, 0, 0}) // [NaN, -Inf]

	f.Fuzz(func(t *testing.T, useJSON bool, b []byte) {
		e, err := wire.DecodeEvent(contentType(useJSON), b)
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("DecodeEvent error %v does not wrap ErrMalformed", err)
			}
			return
		}
		for _, ct := range contentTypes {
			enc, err := wire.EncodeEvent(ct, e)
			if err != nil {
				t.Fatalf("EncodeEvent(%s) of a decoded event %#v: %v", ct, e, err)
			}
			got, err := wire.DecodeEvent(ct, enc)
			if err != nil {
				t.Fatalf("DecodeEvent(%s, %q) of an encoded event: %v", ct, enc, err)
			}
			assertEventEqual(t, comparableFloats(got, ct), comparableFloats(e, ct))
			again, err := wire.EncodeEvent(ct, got)
			if err != nil || !bytes.Equal(again, enc) {
				t.Fatalf("%s encoding is not stable: %q then %q (%v)", ct, enc, again, err)
			}
		}
	})
}

// comparableFloats returns a copy of e whose data holds, for its non-finite
// floats, what the encoding ct keeps of them and reflect.DeepEqual can
// compare: nil in JSON (which writes them null), their names in msgpack.
func comparableFloats(e *wire.Event, ct string) *wire.Event {
	c := *e
	c.Data, c.FinalData = testenv.Comparable(e.Data, ct), testenv.Comparable(e.FinalData, ct)
	return &c
}
