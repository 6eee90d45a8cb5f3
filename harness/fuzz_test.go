package harness

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
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

// FuzzChildPipe has a script write arbitrary bytes on its own event pipe, the one
// channel from a script's process to the harness that is not text: whatever it writes
// (random bytes, nesting past any parser's limit, NaN tokens, numbers past any float,
// invalid UTF-8, a display announcing bytes that never come), the execution ends with
// one script_done, never as a protocol violation or crashed, the container stays
// usable, and the harness answers a ping after it. One harness serves every input.
func FuzzChildPipe(f *testing.F) {
	f.Add([]byte(strings.Repeat("[", 50000) + "\n"))
	f.Add([]byte(`{"type":"final_result","data":[NaN,Infinity,-Infinity]}` + "\n"))
	f.Add([]byte(`{"type":"intermediate","label":"\ud800","data":{"\udfff":1e999999}}` + "\n"))
	f.Add([]byte("{\"type\":\"log\",\"message\":\"\xff\xfe\"}\n\xc3\n"))
	f.Add([]byte(`{"type":"final_result","data":` + strings.Repeat("9", 5000) + "}\n"))
	f.Add([]byte(`{"type":"display","data":{"text/plain":"x"},"image":{"content_type":"image/png","size":99999999}}` + "\n"))
	f.Add([]byte(`{"type":"execute_result","data":{"text/plain":"x"},"execution_count":-1,"image":{"content_type":"image/png","size":3}}` + "\nab"))
	f.Add([]byte(`{"type":"_done","cpu_ms":NaN,"peak_memory_kib":-1}` + "\n"))
	f.Add([]byte(`{"type":"final_result","data":1,"nonfinite":[[["a",{}],"nan"],"x"]}` + "\n"))
	h := startHarness(f, nil)
	n := 0
	f.Fuzz(func(t *testing.T, data []byte) {
		n++
		script := fmt.Sprintf("%sos.write(fd, bytes.fromhex(%q))\n", childEventFD, hex.EncodeToString(data))
		res, _ := h.exec(t, fmt.Sprintf("pipe-%d", n), script, interactive)
		if res.Violation != "" || res.ErrorKind == wire.KindCrashed || !res.Reusable {
			t.Fatalf("the harness broke on %q: violation %q, kind %q, reusable %v: %s", data, res.Violation, res.ErrorKind, res.Reusable, res.Error)
		}
		h.mustPing(t)
	})
}

// childEventFD finds, in a script, the child's event pipe: its one FIFO above 2.
const childEventFD = `import os, stat
def fifo(f):
    try:
        return stat.S_ISFIFO(os.fstat(f).st_mode)
    except OSError:
        return False  # the directory listdir read /proc/self/fd with
fd = next(f for f in map(int, os.listdir('/proc/self/fd')) if f > 2 and fifo(f))
`
