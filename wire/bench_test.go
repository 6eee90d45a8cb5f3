package wire_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/jazzmine/worker/wire"
)

// The benchmarks encode and decode the messages a worker handles most: a
// job, a stdout chunk, a final result as the worker publishes it (the raw
// JSON of the harness) and as a client decodes it (generic values).

func benchJob() *wire.Job {
	return &wire.Job{
		ExecutionID: "exec-0123456789", Sandbox: "default",
		Script: strings.Repeat("for i in range(10):\n    print('é <tag>', i)\n", 40) + "emit_result({'ok': True})\n",
		Mode:   wire.ModePlan, TimeoutSec: 30, MaxOutputBytes: 1 << 20,
		RequiredSecrets: []string{"API_KEY", "DB_PASSWORD"},
		Metadata:        map[string]string{"agent": "planner", "step": "3", "trace": "abc"},
	}
}

const benchRaw = `{"rows": [{"id": 1, "name": "alpha", "score": 0.5, "tags": ["a", "b"]}, {"id": 2, "name": "béta", "score": 1.0, "tags": []},
	{"id": 3, "name": "gamma <3>", "score": 12.25, "tags": ["c"]}], "total": 3, "ok": true, "note": null, "big": 18446744073709551615}`

func benchEvents(b *testing.B) map[string]*wire.Event {
	var values any
	if err := json.Unmarshal([]byte(benchRaw), &values); err != nil {
		b.Fatal(err)
	}
	decoded, err := wire.DecodeEvent(wire.ContentTypeJSON, []byte(`{"data":`+benchRaw+`}`))
	if err != nil {
		b.Fatal(err)
	}
	stdout := event(wire.EventStdout, func(e *wire.Event) { e.Text = strings.Repeat("line of output é <ok>\n", 20) })
	raw := event(wire.EventFinalResult, func(e *wire.Event) { e.Data = json.RawMessage(benchRaw) })
	generic := event(wire.EventFinalResult, func(e *wire.Event) { e.Data = decoded.Data })
	return map[string]*wire.Event{"stdout": &stdout, "raw_result": &raw, "value_result": &generic}
}

var benchCases = []string{"stdout", "raw_result", "value_result"}

func BenchmarkJobEncode(b *testing.B) {
	j := benchJob()
	for _, ct := range contentTypes {
		b.Run(wireName(ct), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := wire.EncodeJob(ct, j); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkJobDecode(b *testing.B) {
	for _, ct := range contentTypes {
		in, err := wire.EncodeJob(ct, benchJob())
		if err != nil {
			b.Fatal(err)
		}
		b.Run(wireName(ct), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				if _, err := wire.DecodeJob(ct, in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEventEncode(b *testing.B) {
	events := benchEvents(b)
	for _, ct := range contentTypes {
		for _, name := range benchCases {
			e := events[name]
			b.Run(wireName(ct)+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := wire.EncodeEvent(ct, e); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkEventDecode(b *testing.B) {
	events := benchEvents(b)
	for _, ct := range contentTypes {
		for _, name := range benchCases[:2] { // raw_result decodes to value_result
			in, err := wire.EncodeEvent(ct, events[name])
			if err != nil {
				b.Fatal(err)
			}
			b.Run(wireName(ct)+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(in)))
				for b.Loop() {
					if _, err := wire.DecodeEvent(ct, in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func wireName(ct string) string {
	if ct == wire.ContentTypeJSON {
		return "json"
	}
	return "msgpack"
}
