package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jazzmine/worker/wire"
)

// Result is the outcome of an execution: what the events of one attempt
// say, the attempt whose script_done ended the execution. Events of other
// attempts (a worker that died mid-job left its attempt unfinished, and the
// job was delivered again) are not in it.
//
// A script that failed is a Result with Success false: Error says why,
// ErrorKind classifies it (one of the wire.Kind constants) and Traceback is
// set when the script raised.
type Result struct {
	// ExecutionID is the execution's id.
	ExecutionID string
	// Attempt is the delivery of the job that produced the result, from 1.
	Attempt int
	// WorkerID is the worker that ran the attempt.
	WorkerID string

	// Success is script_done's success.
	Success bool
	// FinalData is the data the script emitted as its result: script_done's
	// final_data, or else that of the last final_result event; nil when
	// there is none. It holds the values of [wire.Event.Data].
	FinalData any

	// Value is the value of the script's last statement, when that is an
	// expression (not None, not silenced by a trailing semicolon), as
	// IPython shows it as Out and Jupyter sends it as an execute_result:
	// its text forms ("text/plain" always) and image. nil otherwise.
	Value *Display
	// ExecutionCount numbers Value among its session's calls (1 outside a
	// session); 0 without a Value.
	ExecutionCount int
	// FinalDataIsValue reports that FinalData is Value's JSON form (or its
	// text): the script emitted no result of its own.
	FinalDataIsValue bool

	// Error is script_done's error, or else the message of the first error
	// event; empty on success.
	Error string
	// ErrorKind and Traceback come from the first error event: the kind
	// ([wire.KindScript], [wire.KindTimeout], [wire.KindCancelled], ...)
	// and, when the script raised, its traceback.
	ErrorKind string
	Traceback string
	// Hint comes from the first error event too: what the error means in
	// the sandbox and what to do instead, when the harness knows.
	Hint string

	// Intermediates are the script's intermediate results, in order.
	Intermediates []Intermediate
	// Logs are the messages the script logged, in order.
	Logs []Log
	// Stdout and Stderr are what the script printed, its chunks joined.
	Stdout string
	Stderr string

	// Artifacts are the files the execution left in its workspace, stored
	// in [wire.FilesBucket]; [Client.Download] and [Client.Save] read them.
	Artifacts []Artifact
	// Displays are what the script displayed, in order.
	Displays []Display

	// DurationMS is how long the script ran, in milliseconds.
	DurationMS int64
	// OutputBytes counts the bytes of the execution's output, as the worker
	// measured it against the job's max_output_bytes.
	OutputBytes int64
	// CPUMS is the CPU time of the execution in milliseconds and
	// PeakMemoryBytes the peak resident memory of the script's process:
	// script_done's cpu_ms and peak_memory_bytes (zero when it had none).
	CPUMS           float64
	PeakMemoryBytes int64
}

// Intermediate is an intermediate result of a script (an intermediate
// event).
type Intermediate struct {
	// Label is the name the script gave the result.
	Label string
	// Data holds the values of [wire.Event.Data].
	Data any
}

// Log is a message a script logged (a log event).
type Log struct {
	// Time is when the worker published the event.
	Time time.Time
	// Level is the level the script logged at, such as "info".
	Level   string
	Message string
}

// collector folds the events of an execution into one Result per attempt.
// An attempt's events go to that attempt's Result only, so that the start
// of attempt N+1 starts a fresh Result, and a late event of attempt N (a
// worker thought dead that was only slow) does not spoil it.
type collector struct {
	id       string
	attempts map[int]*attempt
}

// attempt is the Result of one attempt in the making.
type attempt struct {
	res            Result
	stdout, stderr strings.Builder
	finalResult    any    // data of the last final_result event
	sawError       bool   // an error event has set ErrorKind and Traceback
	lastType       string // the type of the attempt's last event before this one
}

// add folds ev into its attempt's Result, and returns that Result, complete,
// when ev is a script_done.
func (c *collector) add(ev *wire.Event) *Result {
	if c.attempts == nil {
		c.attempts = map[int]*attempt{}
	}
	a := c.attempts[ev.Attempt]
	if a == nil {
		a = &attempt{res: Result{ExecutionID: c.id, Attempt: ev.Attempt}}
		c.attempts[ev.Attempt] = a
	}
	if ev.WorkerID != "" {
		a.res.WorkerID = ev.WorkerID
	}
	defer func() { a.lastType = ev.Type }()
	switch ev.Type {
	case wire.EventIntermediate:
		a.res.Intermediates = append(a.res.Intermediates, Intermediate{Label: ev.Label, Data: ev.Data})
	case wire.EventLog:
		a.res.Logs = append(a.res.Logs, Log{Time: ev.Time, Level: ev.Level, Message: ev.Message})
	case wire.EventStdout:
		a.stdout.WriteString(ev.Text)
	case wire.EventStderr:
		a.stderr.WriteString(ev.Text)
	case wire.EventFinalResult:
		a.finalResult = ev.Data
		// The harness sends the value of the last expression as the result right
		// after its execute_result, when the script emitted none.
		a.res.FinalDataIsValue = a.lastType == wire.EventExecuteResult
	case wire.EventError:
		if !a.sawError {
			a.sawError = true
			a.res.Error, a.res.ErrorKind, a.res.Traceback, a.res.Hint = ev.Error, ev.Kind, ev.Traceback, ev.Hint
		}
	case wire.EventArtifact:
		a.res.Artifacts = append(a.res.Artifacts, *artifactOf(ev))
	case wire.EventDisplay:
		a.res.Displays = append(a.res.Displays, displayOf(ev))
	case wire.EventExecuteResult:
		d := displayOf(ev)
		a.res.Value, a.res.ExecutionCount = &d, ev.ExecutionCount
	case wire.EventScriptDone:
		return a.finish(ev)
	}
	return nil
}

// finish completes the Result with the attempt's script_done.
func (a *attempt) finish(done *wire.Event) *Result {
	res := a.res
	res.Success = done.Success
	res.DurationMS = done.DurationMS
	res.OutputBytes = done.OutputBytes
	res.CPUMS, res.PeakMemoryBytes = done.CPUMS, done.PeakMemoryBytes
	if done.Error != "" {
		res.Error = done.Error
	}
	res.FinalData = done.FinalData
	if res.FinalData == nil {
		res.FinalData = a.finalResult
	}
	res.Stdout = a.stdout.String()
	res.Stderr = a.stderr.String()
	return &res
}

// ErrNoResult is returned by [Result.Decode] for an execution that gave no
// result: no emit_result, no value on its last line.
var ErrNoResult = errors.New("jazzmine: the execution gave no result")

// Decode stores the execution's result, FinalData, in the value v points
// to, as encoding/json would decode its JSON form (NaN and infinities are
// null there). It returns an error wrapping [ErrNoResult] when there is no
// result.
func (r *Result) Decode(v any) error {
	if r.FinalData == nil {
		return fmt.Errorf("decode the result of execution %s: %w", r.ExecutionID, ErrNoResult)
	}
	b, err := wire.ValueJSON(r.FinalData)
	if err != nil {
		return fmt.Errorf("decode the result of execution %s: %w", r.ExecutionID, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode the result of execution %s: %w", r.ExecutionID, err)
	}
	return nil
}
