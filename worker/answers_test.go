package worker_test

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// nan and inf stand for the floats in the wanted data of valueCase: in JSON events
// they are null (absent at the top), in msgpack events the floats themselves.
var (
	nan = math.NaN()
	inf = math.Inf(1)
)

// valueCase is a script whose values no encoder expects, and what must come of it:
// success with the final data want (as msgpack carries it; JSON has null for NaN and
// infinities), or a script error whose message contains errorHas.
type valueCase struct {
	name, script string
	want         any
	errorHas     string
	check        func(t *testing.T, evs []*wire.Event, ct string)
}

// evFD finds, in a script, the child's event pipe: its one FIFO above 2 (a script
// that writes there is the attacker of docs/SECURITY.md's pipe rows).
const evFD = `import os, stat
def fifo(f):
    try:
        return stat.S_ISFIFO(os.fstat(f).st_mode)
    except OSError:
        return False  # the directory listdir read /proc/self/fd with
fd = next(f for f in map(int, os.listdir('/proc/self/fd')) if f > 2 and fifo(f))
`

const deep3000 = "v = []\nfor _ in range(3000):\n    v = [v]\n"

var valueCases = []valueCase{
	{name: "NaN as the result", script: "emit_result(float('nan'))", want: nan},
	{name: "an infinity in a dict", script: "emit_result({'x': float('inf'), 'y': [1.5, float('-inf')]})", want: map[string]any{"x": inf, "y": []any{1.5, -inf}}},
	{name: "NaN in an intermediate", script: "emit_intermediate('p', float('nan'))\nemit_result(1)", want: int64(1),
		check: func(t *testing.T, evs []*wire.Event, ct string) {
			got := find(evs, wire.EventIntermediate)
			if got == nil || !sameData(got.Data, nan, ct) {
				t.Errorf("intermediate data %v, want NaN", got)
			}
		}},
	{name: "a lone surrogate", script: "emit_result('\\ud800')", want: `\ud800`},
	{name: "a lone surrogate in a key", script: "emit_result({'\\udc80k': 1})", want: map[string]any{`\udc80k`: int64(1)}},
	{name: "a lone surrogate printed and logged", script: "print('\\ud800')\nemit_log('\\udfff')\nemit_intermediate('\\ud801', 1)\nemit_result(True)", want: true,
		check: func(t *testing.T, evs []*wire.Event, ct string) {
			out, log, im := find(evs, wire.EventStdout), find(evs, wire.EventLog), find(evs, wire.EventIntermediate)
			if out == nil || out.Text != `\ud800`+"\n" || log == nil || log.Message != `\udfff` || im == nil || im.Label != `\ud801` {
				t.Errorf("stdout, log and label %q, want the surrogates escaped as text", describe(evs))
			}
		}},
	{name: "an int beyond 64 bits", script: "emit_result([2**100, -2**64, 10**400 > 0])", want: []any{"1267650600228229401496703205376", "-18446744073709551616", true}},
	{name: "bytes, a set, a tuple, a date", script: "import datetime\nemit_result({'b': b'hi\\x00', 's': {3, 1, 2}, 't': (1, 'a'), 'd': datetime.date(2024, 5, 1), 'td': datetime.timedelta(hours=1)})",
		want: map[string]any{"b": "aGkA", "s": []any{int64(1), int64(2), int64(3)}, "t": []any{int64(1), "a"}, "d": "2024-05-01", "td": 3600.0}},
	{name: "a value nested 3,000 deep", script: deep3000 + "emit_result(v)", errorHas: "emit_result data[0][0][0][0]...(249 levels)...[0][0][0]: arrays and objects nest deeper than 256 levels"},
	{name: "a value with no JSON form", script: "class Point:\n    pass\nemit_result({'p': [Point()]})", errorHas: "emit_result data['p'][0]: a value of type Point has no JSON form"},
	{name: "the last expression's NaN", script: "float('nan')", want: nan,
		check: func(t *testing.T, evs []*wire.Event, ct string) {
			if out := find(evs, wire.EventExecuteResult); out == nil || formOf(out, "text/plain") != "nan" || out.ExecutionCount != 1 {
				t.Errorf("execute_result %v, want text/plain nan, execution count 1", out)
			}
		}},
	{name: "the last expression nested 3,000 deep", script: deep3000 + "v", want: nil,
		check: func(t *testing.T, evs []*wire.Event, ct string) {
			if err := find(evs, wire.EventStderr); err == nil || !strings.Contains(err.Text, "could not be shown: RecursionError") || find(evs, wire.EventExecuteResult) != nil {
				t.Errorf("events %s, want no Out and the formatter's RecursionError on stderr, as IPython shows it", describe(evs))
			}
		}},
	// What the script itself writes on its event pipe: the harness drops what is not a
	// line it can relay, and makes what it relays what the protocol carries.
	{name: "50,000 [ on the event pipe", script: evFD + "os.write(fd, b'[' * 50000 + b'\\n')\nemit_result(1)", want: int64(1)},
	{name: "a NaN token on the event pipe", script: evFD + "os.write(fd, b'{\"type\":\"final_result\",\"data\":[NaN, -Infinity]}\\n')", want: []any{nil, nil}},
	{name: "a surrogate escape on the event pipe", script: evFD + "os.write(fd, b'{\"type\":\"final_result\",\"data\":{\"\\\\ud800\":\"\\\\udfff\"}}\\n')", want: map[string]any{`\ud800`: `\udfff`}},
	{name: "invalid UTF-8 on the event pipe", script: evFD + "os.write(fd, b'\\xff\\xfe{\"type\":\"log\"}\\n\\xc3\\n')\nemit_result(2)", want: int64(2)},
	{name: "a huge number on the event pipe", script: evFD + "os.write(fd, b'{\"type\":\"intermediate\",\"data\":1e999999}\\n{\"type\":\"final_result\",\"data\":' + b'9' * 5000 + b'}\\n')\nemit_result(3)", want: int64(3)},
}

// TestEveryValueEndsInOneScriptDoneAndTheContainerServesOn runs values that no
// encoder expects (NaN and infinities, lone surrogates, nesting 3,000 deep, numbers
// beyond 64 bits, objects with no JSON form) and what a script writes on its own
// event pipe, in both encodings, through one container: each ends with exactly one
// script_done, never crashed, with the documented form of its value, and the same
// container serves every one.
func TestEveryValueEndsInOneScriptDoneAndTheContainerServesOn(t *testing.T) {
	_, nc := testenv.NATS(t)
	_, pool := startWorkerPool(t, nc, sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 0}, nil, nil)
	a := newAgent(t, nc)
	containers := map[string]bool{}
	for _, ct := range []string{wire.ContentTypeMsgpack, wire.ContentTypeJSON} {
		for _, tc := range valueCases {
			t.Run(ct+"/"+tc.name, func(t *testing.T) {
				id := newID("value")
				a.submit(ct, wire.Job{ExecutionID: id, Sandbox: "default", Script: tc.script, Mode: wire.ModeInteractive, TimeoutSec: 20})
				evs := a.events(id, time.Minute)
				a.oneAttemptOneEnd(id)
				done := last(evs)
				if started := find(evs, wire.EventStarted); started != nil {
					containers[started.ContainerID] = true
				}
				if e := find(evs, wire.EventError); e != nil && e.Kind != wire.KindScript {
					t.Fatalf("error of kind %s: %s (%s)", e.Kind, e.Error, describe(evs))
				}
				if tc.errorHas != "" {
					e := find(evs, wire.EventError)
					if done.Success || e == nil || !strings.Contains(e.Error, tc.errorHas) {
						t.Errorf("events %s, want a script error containing %q", describe(evs), tc.errorHas)
					}
					return
				}
				if !done.Success {
					t.Fatalf("failed: %s", describe(evs))
				}
				if !sameData(done.FinalData, tc.want, ct) {
					t.Errorf("final_data %#v, want %#v in %s", done.FinalData, tc.want, ct)
				}
				if tc.check != nil {
					tc.check(t, evs, ct)
				}
			})
		}
	}
	if s := pool.Stats().Sandboxes["default"]; len(containers) != 1 || s.Spawned != 1 || len(s.Retired) != 0 {
		t.Errorf("the executions ran in %d containers, %d spawned, retired %v: a value retired a container", len(containers), s.Spawned, s.Retired)
	}
}

// sameData compares decoded event data with want, whose NaN and infinities are what
// msgpack carries and JSON writes null (left out at the top).
func sameData(got, want any, ct string) bool {
	return reflect.DeepEqual(testenv.Comparable(got, ct), testenv.Comparable(want, ct))
}

// formOf is the text form mime of a display or execute_result event.
func formOf(ev *wire.Event, mime string) string {
	forms, _ := ev.Data.(map[string]any)
	s, _ := forms[mime].(string)
	return s
}

// zeros is numpy's repr of np.zeros((5000, 5000)).
const zeros = "array([[0., 0., 0., ..., 0., 0., 0.],\n" +
	"       [0., 0., 0., ..., 0., 0., 0.],\n" +
	"       [0., 0., 0., ..., 0., 0., 0.],\n" +
	"       ...,\n" +
	"       [0., 0., 0., ..., 0., 0., 0.],\n" +
	"       [0., 0., 0., ..., 0., 0., 0.],\n" +
	"       [0., 0., 0., ..., 0., 0., 0.]])"

// TestDataScienceValuesEndWellAndEveryExecutionDrawsFreshNumbers runs what numpy and
// pandas make through the datascience sandbox (a NaN from an empty mean, numpy
// scalars and arrays, a DataFrame), each ending in its documented form, and six
// executions in its one container that each draw numbers from numpy's global
// RandomState, pandas' sample and random: all six differ, where a fork of the zygote
// inherited numpy's state and drew the same numbers every time.
func TestDataScienceValuesEndWellAndEveryExecutionDrawsFreshNumbers(t *testing.T) {
	_, nc := testenv.NATS(t)
	_, pool := testworker.Start(t, nc, testworker.Options{Spec: "datascience", Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 0}})
	a := newAgent(t, nc)
	run := func(t *testing.T, script string) []*wire.Event {
		t.Helper()
		id := newID("ds")
		a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "datascience", Script: script, Mode: wire.ModeInteractive, TimeoutSec: 60})
		evs := a.events(id, 2*time.Minute)
		a.oneAttemptOneEnd(id)
		if done := last(evs); !done.Success {
			t.Fatalf("failed: %s", describe(evs))
		}
		return evs
	}
	values := []struct {
		name, script string
		want         any
		out          string // the text/plain of its Out, when it ends in an expression
	}{
		{"the mean of an empty series", "import pandas as pd\npd.Series([], dtype=float).mean()", nan, "nan"},
		{"numpy scalars and an array with a NaN", "import numpy as np\nemit_result([np.float64(1.5), np.int64(7), np.bool_(True), np.array([1.0, np.nan])])",
			[]any{1.5, int64(7), true, []any{1.0, nan}}, ""},
		{"a DataFrame", "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [0.5, None]})",
			map[string]any{"columns": []any{"a", "b"}, "index": []any{int64(0), int64(1)}, "data": []any{[]any{int64(1), 0.5}, []any{int64(2), nan}}},
			"   a    b\n0  1  0.5\n1  2  NaN"},
		{"a timestamp and NaT", "import pandas as pd\nemit_result([pd.Timestamp('2024-05-01 12:00'), pd.NaT])", []any{"2024-05-01T12:00:00", nil}, ""},
		// Its JSON form would be 25 million numbers: its text is the result, and the
		// array is never converted (that ran out of the sandbox's 1 GiB).
		{"a 200 MB array on the last line", "import numpy as np\nnp.zeros((5000, 5000))", zeros, zeros},
	}
	for _, v := range values {
		t.Run(v.name, func(t *testing.T) {
			evs := run(t, v.script)
			if done := last(evs); !sameData(done.FinalData, v.want, wire.ContentTypeMsgpack) {
				t.Errorf("final_data %#v, want %#v", done.FinalData, v.want)
			}
			if v.out != "" {
				if out := find(evs, wire.EventExecuteResult); out == nil || formOf(out, "text/plain") != v.out {
					t.Errorf("Out %v, want %q", out, v.out)
				}
			}
		})
	}
	t.Run("six executions draw six different numbers", func(t *testing.T) {
		seen := map[string]bool{}
		for range 6 {
			evs := run(t, "import numpy as np, pandas as pd, random\n[float(np.random.rand()), pd.Series(range(1000)).sample(3).tolist(), random.random()]")
			draws, _ := last(evs).FinalData.([]any)
			if len(draws) != 3 {
				t.Fatalf("final_data %#v", last(evs).FinalData)
			}
			for i, d := range draws {
				key := fmt.Sprint(i, d)
				if seen[key] {
					t.Errorf("draw %d %v came twice: executions share a generator's state", i, d)
				}
				seen[key] = true
			}
		}
	})
	if s := pool.Stats().Sandboxes["datascience"]; s.Spawned != 1 || len(s.Retired) != 0 {
		t.Errorf("%d containers spawned, retired %v; want 1 and none: a value retired a container", s.Spawned, s.Retired)
	}
}
