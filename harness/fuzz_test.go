package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/jazzmine/worker/wire"
)

// FuzzExecutorStream feeds arbitrary bytes, as a harness's stdout, to an execution:
// whatever a subverted harness prints, Run returns a result that ends with exactly one
// script_done, never reports more output than it read, and stays within its limits.
// "NONCE" in the input stands for the execute's nonce, so that the fuzzer can reach the
// harness's real end too.
func FuzzExecutorStream(f *testing.F) {
	f.Add([]byte(`{"type":"final_result","execution_id":"x","data":1}` + "\n" + `{"type":"script_done","execution_id":"x","nonce":"NONCE"}` + "\n"))
	f.Add([]byte(`{"type":"final_result","execution_id":"x","data":1}` + "\n" + `{"type":"script_done","execution_id":"x"}` + "\n"))
	f.Add([]byte(`{"type":"error","execution_id":"x","kind":"timeout","error":"e"}` + "\n" + `{"type":"script_done","execution_id":"x","exit_code":0,"nonce":"NONCE"}` + "\n"))
	f.Add([]byte("not json\n{\"type\":\"script_done\",\"execution_id\":\"other\"}\n{\"type\":\"stdout\",\"execution_id\":\"x\",\"text\":\"\\u0000\"}"))
	f.Add([]byte(`{"type":"intermediate","execution_id":"x","label":"l","data":{"a":[1,2,{"b":null}]}}` + "\n"))
	f.Add(bytes.Repeat([]byte("x"), 5000))
	f.Add([]byte{0xff, 0xfe, '\n', '{', '\n'})
	f.Fuzz(func(t *testing.T, stream []byte) {
		pr, pw := io.Pipe()
		defer pr.Close()
		c := NewConn(pr, &answer{w: pw, stream: stream}, 4096)
		defer c.Close()
		e := Executor{Buffer: 10 * time.Millisecond, CancelGrace: 10 * time.Millisecond}
		dones := 0
		res, err := e.Run(context.Background(), c, Request{ExecutionID: "x", Script: "s", Timeout: 10 * time.Millisecond, MaxOutputBytes: 2048},
			func(_ context.Context, ev Event) error {
				if ev.ExecutionID != "x" {
					t.Fatalf("an event of another execution reached the callback: %+v", ev)
				}
				if ev.Type == wire.EventScriptDone {
					dones++
				}
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		if dones != 1 {
			t.Fatalf("%d script_done events, want exactly 1", dones)
		}
		if sent := len(stream) + bytes.Count(stream, []byte("NONCE"))*27; res.OutputBytes > int64(sent) {
			t.Fatalf("output bytes %d > %d read", res.OutputBytes, sent)
		}
		if res.Success && res.Error != "" {
			t.Fatalf("a success with an error: %+v", res)
		}
	})
}

// answer is the fuzzed harness's stdin: at the first request it writes the stream, with
// the request's nonce for "NONCE", to w and closes it.
type answer struct {
	w      *io.PipeWriter
	stream []byte
	once   sync.Once
}

func (a *answer) Write(b []byte) (int, error) {
	a.once.Do(func() {
		var req request
		_ = json.Unmarshal(b, &req)
		stream := bytes.ReplaceAll(a.stream, []byte("NONCE"), []byte(req.Nonce))
		go func() {
			_, _ = a.w.Write(stream)
			a.w.Close()
		}()
	})
	return len(b), nil
}
