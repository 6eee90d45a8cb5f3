package client

import (
	"reflect"
	"testing"

	"github.com/jazzmine/worker/wire"
)

func TestCollector(t *testing.T) {
	ev := func(attempt int, typ string, e wire.Event) *wire.Event {
		e.Attempt, e.Type, e.ExecutionID = attempt, typ, "x"
		if e.WorkerID == "" {
			e.WorkerID = "w"
		}
		return &e
	}
	tests := []struct {
		name   string
		events []*wire.Event
		want   *Result // nil: no script_done among the events
	}{
		{
			name:   "events without a script_done make no result",
			events: []*wire.Event{ev(1, wire.EventStarted, wire.Event{}), ev(1, wire.EventStdout, wire.Event{Text: "a"})},
		},
		{
			name: "output chunks are joined and intermediates and logs kept in order",
			events: []*wire.Event{
				ev(1, wire.EventStdout, wire.Event{Text: "a"}),
				ev(1, wire.EventIntermediate, wire.Event{Label: "1", Data: int64(1)}),
				ev(1, wire.EventStderr, wire.Event{Text: "e"}),
				ev(1, wire.EventLog, wire.Event{Level: "info", Message: "m1"}),
				ev(1, wire.EventStdout, wire.Event{Text: "b"}),
				ev(1, wire.EventIntermediate, wire.Event{Label: "2", Data: nil}),
				ev(1, wire.EventLog, wire.Event{Level: "error", Message: "m2"}),
				ev(1, wire.EventScriptDone, wire.Event{Success: true, DurationMS: 5, OutputBytes: 7}),
			},
			want: &Result{
				ExecutionID: "x", Attempt: 1, WorkerID: "w", Success: true,
				Intermediates: []Intermediate{{"1", int64(1)}, {"2", nil}},
				Logs:          []Log{{Level: "info", Message: "m1"}, {Level: "error", Message: "m2"}},
				Stdout:        "ab", Stderr: "e", DurationMS: 5, OutputBytes: 7,
			},
		},
		{
			name: "the final data comes from script_done first",
			events: []*wire.Event{
				ev(1, wire.EventFinalResult, wire.Event{Data: "from final_result"}),
				ev(1, wire.EventScriptDone, wire.Event{Success: true, FinalData: "from script_done"}),
			},
			want: &Result{ExecutionID: "x", Attempt: 1, WorkerID: "w", Success: true, FinalData: "from script_done"},
		},
		{
			name: "the final data comes from the last final_result when script_done has none",
			events: []*wire.Event{
				ev(1, wire.EventFinalResult, wire.Event{Data: "first"}),
				ev(1, wire.EventFinalResult, wire.Event{Data: false}),
				ev(1, wire.EventScriptDone, wire.Event{Success: true}),
			},
			want: &Result{ExecutionID: "x", Attempt: 1, WorkerID: "w", Success: true, FinalData: false},
		},
		{
			name: "the first error event gives the kind and traceback, script_done the message",
			events: []*wire.Event{
				ev(1, wire.EventError, wire.Event{Kind: wire.KindTimeout, Error: "timed out after 1s"}),
				ev(1, wire.EventError, wire.Event{Kind: wire.KindCrashed, Error: "killed", Traceback: "tb"}),
				ev(1, wire.EventScriptDone, wire.Event{Error: "timeout"}),
			},
			want: &Result{ExecutionID: "x", Attempt: 1, WorkerID: "w", ErrorKind: wire.KindTimeout, Error: "timeout"},
		},
		{
			name: "the error event's message stands when script_done has none",
			events: []*wire.Event{
				ev(1, wire.EventError, wire.Event{Kind: wire.KindScript, Error: "ValueError: x", Traceback: "tb"}),
				ev(1, wire.EventScriptDone, wire.Event{}),
			},
			want: &Result{ExecutionID: "x", Attempt: 1, WorkerID: "w", ErrorKind: wire.KindScript, Error: "ValueError: x", Traceback: "tb"},
		},
		{
			name: "a later attempt starts afresh",
			events: []*wire.Event{
				ev(1, wire.EventStdout, wire.Event{Text: "one", WorkerID: "w1"}),
				ev(1, wire.EventError, wire.Event{Kind: wire.KindScript, Error: "no"}),
				ev(2, wire.EventStdout, wire.Event{Text: "two", WorkerID: "w2"}),
				ev(2, wire.EventScriptDone, wire.Event{Success: true, WorkerID: "w2"}),
			},
			want: &Result{ExecutionID: "x", Attempt: 2, WorkerID: "w2", Success: true, Stdout: "two"},
		},
		{
			name: "a late event of an earlier attempt does not spoil the later one",
			events: []*wire.Event{
				ev(1, wire.EventStdout, wire.Event{Text: "one"}),
				ev(2, wire.EventStdout, wire.Event{Text: "two"}),
				ev(1, wire.EventStdout, wire.Event{Text: "late"}),
				ev(2, wire.EventScriptDone, wire.Event{Success: true}),
			},
			want: &Result{ExecutionID: "x", Attempt: 2, WorkerID: "w", Success: true, Stdout: "two"},
		},
		{
			name: "the script_done of an earlier attempt gives that attempt's result",
			events: []*wire.Event{
				ev(1, wire.EventStdout, wire.Event{Text: "one"}),
				ev(2, wire.EventStdout, wire.Event{Text: "two"}),
				ev(1, wire.EventScriptDone, wire.Event{Success: true}),
			},
			want: &Result{ExecutionID: "x", Attempt: 1, WorkerID: "w", Success: true, Stdout: "one"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := collector{id: "x"}
			var got *Result
			for i, e := range tt.events {
				res := c.add(e)
				if res != nil && i != len(tt.events)-1 {
					t.Fatalf("event %d (%s) made a result; only script_done does", i, e.Type)
				}
				got = res
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("result =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}
