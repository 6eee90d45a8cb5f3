package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jazzmine/worker/wire"
)

// ErrInvalidRequest wraps the reasons a Request is refused before it is sent.
var ErrInvalidRequest = errors.New("harness: invalid request")

// Request is one execution.
type Request struct {
	// ExecutionID identifies the execution; events of any other id are ignored. Required.
	ExecutionID string
	// Script is the Python source to run.
	Script string
	// Mode decides what counts as success; empty means ModePlan.
	Mode Mode
	// Timeout is the script's own limit; zero means DefaultTimeout. The host-side
	// deadline is Timeout plus the Executor's Buffer.
	Timeout time.Duration
	// MaxOutputBytes caps the bytes of the event stream; zero means
	// DefaultMaxOutputBytes. The harness cuts the script a little below it; reaching it
	// on the host means the harness misbehaved.
	MaxOutputBytes int64
	// RequiredSecrets are environment variables that must be set; the script does not
	// run if any is missing.
	RequiredSecrets []string
	// TraceParent and TraceState are W3C trace context, passed to the script's process
	// as TRACEPARENT and TRACESTATE.
	TraceParent, TraceState string
	// Files are written into the workspace before the script runs.
	Files []InputFile
	// Artifacts are workspace paths collected after the run besides out/.
	Artifacts []string
	// MaxArtifacts and MaxArtifactBytes bound the artifacts and display images, by
	// count and by their size added up; zero means wire.DefaultMaxArtifacts and
	// wire.DefaultMaxArtifactBytes.
	MaxArtifacts     int
	MaxArtifactBytes int64
	// Session runs the script in the container's session process, which keeps its
	// globals from one such execution to the next; nothing is reset between them.
	Session bool
}

// Intermediate is a partial result sent by emit_intermediate.
type Intermediate struct {
	Label string          `json:"label"`
	Data  json.RawMessage `json:"data"`
}

// Log is a message sent by emit_log.
type Log struct {
	Level   string `json:"level"`
	Message string `json:"message"`
}

// Result is the outcome of one execution. A script's own failure is a Result with
// Success false, never a Go error.
type Result struct {
	Success     bool            `json:"success"`
	ExecutionID string          `json:"execution_id"`
	FinalData   json.RawMessage `json:"final_data,omitempty"`
	// FinalNonfinite are the places of FinalData's NaNs and infinities, which its JSON
	// has as null (see [wire.WithNonfinite]).
	FinalNonfinite wire.Nonfinites `json:"-"`
	Intermediates  []Intermediate  `json:"intermediates,omitempty"`
	Logs           []Log           `json:"logs,omitempty"`
	Error          string          `json:"error,omitempty"`
	ErrorKind      string          `json:"error_kind,omitempty"`
	Traceback      string          `json:"traceback,omitempty"`
	Hint           string          `json:"hint,omitempty"`
	DurationMS     int64           `json:"duration_ms"`
	OutputBytes    int64           `json:"output_bytes"`
	// CPUMS is the CPU time of the execution in milliseconds, as the harness counted
	// it (its container's cgroup, or what the script's process said where there is no
	// cgroup to read); PeakMemoryBytes the peak resident memory of the script's
	// process. Zero when the harness did not say.
	CPUMS           float64 `json:"cpu_ms,omitempty"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes,omitempty"`
	// ExitCode and Signal describe how the script's process ended, as the harness saw it.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	// Reusable reports that the harness ended the execution cleanly (script_done
	// arrived within the limits), so its container may be reset and reused. False after
	// a host-side limit, a closed stream, a protocol violation, or a cancel the harness
	// did not confirm.
	Reusable bool `json:"-"`
	// Violation, when set, says how the stream broke the protocol (see ErrProtocol):
	// the run ended there as crashed, and the container must be retired.
	Violation string `json:"-"`
}

// EventFunc receives each event of an execution in order, ending with exactly one
// script_done; events the Executor makes up (a host-side timeout, a closed stream) come
// the same way. Run waits for it to return before reading on. An error from it cancels
// the execution and is returned by Run.
type EventFunc func(ctx context.Context, ev Event) error

// Executor runs requests over a Conn under limits. The zero value is ready to use.
type Executor struct {
	// Buffer is added to a request's timeout to give the host-side deadline; zero means
	// DefaultBuffer.
	Buffer time.Duration
	// CancelGrace bounds the wait for script_done after a cancel; zero means
	// DefaultCancelGrace.
	CancelGrace time.Duration
	// Logger receives skipped lines at debug level; nil means slog.Default().
	Logger *slog.Logger
}

// Run sends req to the harness behind c and collects its events until script_done, the
// host-side deadline, the output limit, the end of the stream or the end of ctx (which
// cancels the execution). It returns an error only for an invalid request or an error
// from onEvent (which may be nil); every other outcome is in the Result.
func (e *Executor) Run(ctx context.Context, c *Conn, req Request, onEvent EventFunc) (*Result, error) {
	started := time.Now()
	if req.ExecutionID == "" {
		return nil, fmt.Errorf("%w: execution id is empty", ErrInvalidRequest)
	}
	switch req.Mode {
	case "":
		req.Mode = ModePlan
	case ModePlan, ModeInteractive:
	default:
		return nil, fmt.Errorf("%w: mode %q is neither %q nor %q", ErrInvalidRequest, req.Mode, ModePlan, ModeInteractive)
	}
	if req.Timeout <= 0 {
		req.Timeout = DefaultTimeout
	}
	if req.MaxOutputBytes <= 0 {
		req.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if req.MaxArtifacts <= 0 {
		req.MaxArtifacts = wire.DefaultMaxArtifacts
	}
	if req.MaxArtifactBytes <= 0 {
		req.MaxArtifactBytes = wire.DefaultMaxArtifactBytes
	}
	r := &run{
		e:     e,
		c:     c,
		req:   req,
		on:    onEvent,
		res:   &Result{ExecutionID: req.ExecutionID},
		nonce: newNonce(),
	}
	err := r.run(ctx)
	r.res.DurationMS = time.Since(started).Milliseconds()
	r.finish()
	return r.res, err
}

type run struct {
	e   *Executor
	c   *Conn
	req Request
	on  EventFunc
	res *Result

	nonce     string // of the execute: its script_done must carry it
	gotResult bool
	gotValue  bool // an execute_result: a result in plan mode too
	gotError  bool
	done      bool

	artifacts     int   // artifacts and display images announced
	artifactBytes int64 // their sizes added up
	blobFailure   error // why a blob's chunk lines stopped coming
}

func (r *run) run(ctx context.Context) error {
	buffer := r.e.Buffer
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	// wait ends at the host-side deadline or when the caller's ctx ends (a cancel).
	wait, stopWait := context.WithTimeout(ctx, r.req.Timeout+buffer)
	defer stopWait()

	if err := r.sendInputs(wait); err != nil {
		if ie := (*inputError)(nil); errors.As(err, &ie) {
			return r.fail(ctx, wire.KindInputFile, ie.msg)
		}
		return r.fail(ctx, wire.KindCrashed, ErrStdoutClosed)
	}
	r.c.executeNonce = r.nonce
	err := r.c.write(request{
		Type:             requestExecute,
		Nonce:            r.nonce,
		ExecutionID:      r.req.ExecutionID,
		Script:           r.req.Script,
		Timeout:          r.req.Timeout.Seconds(),
		Mode:             r.req.Mode,
		MaxOutputBytes:   r.req.MaxOutputBytes,
		RequiredSecrets:  r.req.RequiredSecrets,
		TraceParent:      r.req.TraceParent,
		TraceState:       r.req.TraceState,
		Artifacts:        r.req.Artifacts,
		MaxArtifacts:     r.req.MaxArtifacts,
		MaxArtifactBytes: r.req.MaxArtifactBytes,
		Session:          r.req.Session,
	})
	if err != nil {
		return r.fail(ctx, wire.KindCrashed, ErrStdoutClosed)
	}

	for !r.done {
		l, err := r.c.next(wait)
		if err != nil {
			return r.streamEnded(ctx, wait, err)
		}
		r.res.OutputBytes += l.n
		if l.oversize || r.res.OutputBytes > r.req.MaxOutputBytes {
			return r.fail(ctx, wire.KindOutputLimit, fmt.Sprintf("Output limit exceeded: more than %d bytes", r.req.MaxOutputBytes))
		}
		ev, err := r.decode(l.b)
		if err == nil {
			err = r.openBlob(wait, &ev)
		}
		if err != nil {
			return r.violate(ctx, err)
		}
		cbErr := r.deliver(ctx, ev)
		if err := r.closeBlob(&ev); err != nil {
			return r.streamEnded(ctx, wait, err)
		}
		if cbErr != nil {
			r.cancelAfterCallback(ctx)
			return cbErr
		}
	}
	r.res.Reusable = true
	return nil
}

// streamEnded ends the run when no line came: ctx ended (a cancel), the host-side
// deadline passed, the stream closed, or a blob broke the protocol.
func (r *run) streamEnded(ctx, wait context.Context, err error) error {
	switch {
	case errors.Is(err, ErrProtocol):
		return r.violate(ctx, err)
	case ctx.Err() != nil:
		return r.cancel(ctx)
	case wait.Err() != nil:
		return r.fail(ctx, wire.KindTimeout, "Timed out waiting for container response")
	}
	return r.fail(ctx, wire.KindCrashed, ErrStdoutClosed)
}

// decode returns the event of line b, or an ErrProtocol if b is not an event of this
// execution: not JSON, another execution's, a type an execution does not have, or a
// script_done without this execute's nonce.
func (r *run) decode(b []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(b, &ev); err != nil {
		return ev, fmt.Errorf("%w: a line that is not JSON: %q", ErrProtocol, truncate(b, 120))
	}
	if ev.ExecutionID != r.req.ExecutionID {
		return ev, fmt.Errorf("%w: a %s event of execution %q", ErrProtocol, ev.Type, truncate([]byte(ev.ExecutionID), 80))
	}
	switch ev.Type {
	case wire.EventIntermediate, wire.EventLog, wire.EventStdout, wire.EventStderr, wire.EventFinalResult, wire.EventError,
		wire.EventArtifact, wire.EventDisplay, wire.EventExecuteResult:
	case wire.EventScriptDone:
		if ev.Nonce != r.nonce {
			return ev, fmt.Errorf("%w: a script_done that does not carry the execute's nonce", ErrProtocol)
		}
	default:
		return ev, fmt.Errorf("%w: a %q line during an execution", ErrProtocol, truncate([]byte(ev.Type), 80))
	}
	return ev, nil
}

// violate ends the run on a protocol violation: a crashed error and a script_done of
// the executor's own, the container not reusable. Whatever arrived before stays
// delivered, but the run is never a success.
func (r *run) violate(ctx context.Context, err error) error {
	r.logger().Warn("harness: protocol violation; the container will be retired", "execution_id", r.req.ExecutionID, "err", err)
	r.res.Violation = err.Error()
	return r.fail(ctx, wire.KindCrashed, "Harness protocol violation: the container is retired")
}

// deliver folds ev into the result and passes it on.
func (r *run) deliver(ctx context.Context, ev Event) error {
	switch ev.Type {
	case wire.EventFinalResult:
		if r.gotResult {
			return nil
		}
		r.gotResult = true
		r.res.FinalData, r.res.FinalNonfinite = ev.Data, ev.Nonfinite
		if r.res.FinalData == nil {
			r.res.FinalData = json.RawMessage("null")
		}
	case wire.EventIntermediate:
		r.res.Intermediates = append(r.res.Intermediates, Intermediate{Label: ev.Label, Data: ev.Data})
	case wire.EventLog:
		r.res.Logs = append(r.res.Logs, Log{Level: ev.Level, Message: ev.Message})
	case wire.EventError:
		if r.gotError {
			break // published, but the first error is the run's (artifact_limit may follow a script's)
		}
		r.gotError = true
		r.res.Error, r.res.ErrorKind, r.res.Traceback, r.res.Hint = ev.Error, ev.Kind, ev.Traceback, ev.Hint
		if r.res.ErrorKind == "" {
			r.res.ErrorKind = wire.KindScript
		}
	case wire.EventScriptDone:
		r.done = true
		r.res.ExitCode, r.res.Signal = ev.ExitCode, ev.Signal
		r.res.CPUMS, r.res.PeakMemoryBytes = ev.CPUMS, ev.PeakMemoryBytes
		if r.req.Mode == ModePlan && !r.gotResult && !r.gotValue && !r.gotError {
			// The harness reports this itself; this guards against one that does not.
			if err := r.deliver(ctx, Event{Type: wire.EventError, ExecutionID: r.req.ExecutionID, Kind: wire.KindScript,
				Error: ErrNoResult, Hint: NoResultHint}); err != nil {
				return err
			}
		}
	case wire.EventExecuteResult:
		r.gotValue = true
	case wire.EventStdout, wire.EventStderr, wire.EventArtifact, wire.EventDisplay:
	default:
		return nil // not part of an execution's stream
	}
	if r.on == nil {
		return nil
	}
	return r.on(ctx, ev)
}

// fail ends the run on a host-side condition: it reports an error and a script_done of
// its own, and leaves Reusable false.
func (r *run) fail(ctx context.Context, kind, msg string) error {
	if err := r.deliver(ctx, Event{Type: wire.EventError, ExecutionID: r.req.ExecutionID, Kind: kind, Error: msg}); err != nil {
		return err
	}
	return r.deliver(ctx, Event{Type: wire.EventScriptDone, ExecutionID: r.req.ExecutionID})
}

// cancel asks the harness to stop the execution and waits a grace period for its
// script_done, relaying what arrives. The caller's ctx has ended; the callback still
// gets a live context so that the outcome can be reported.
func (r *run) cancel(ctx context.Context) error {
	live := context.WithoutCancel(ctx)
	if r.c.write(request{Type: requestCancel, ExecutionID: r.req.ExecutionID}) != nil {
		return r.fail(live, wire.KindCancelled, "Execution cancelled")
	}
	grace := r.e.CancelGrace
	if grace <= 0 {
		grace = DefaultCancelGrace
	}
	wait, stop := context.WithTimeout(live, grace)
	defer stop()
	for !r.done {
		l, err := r.c.next(wait)
		if err != nil {
			return r.fail(live, wire.KindCancelled, "Execution cancelled")
		}
		r.res.OutputBytes += l.n
		if l.oversize {
			continue
		}
		ev, err := r.decode(l.b)
		if err == nil {
			err = r.openBlob(wait, &ev)
		}
		if err != nil {
			return r.violate(live, err)
		}
		cbErr := r.deliver(live, ev)
		if err := r.closeBlob(&ev); err != nil {
			if errors.Is(err, ErrProtocol) {
				return r.violate(live, err)
			}
			return r.fail(live, wire.KindCancelled, "Execution cancelled")
		}
		if cbErr != nil {
			return cbErr
		}
	}
	r.res.Reusable = true
	return nil
}

// cancelAfterCallback stops the harness's execution after the callback failed, without
// reporting anything more: the caller has the callback's error.
func (r *run) cancelAfterCallback(ctx context.Context) {
	if r.done {
		r.res.Reusable = true
		return
	}
	if r.c.write(request{Type: requestCancel, ExecutionID: r.req.ExecutionID}) != nil {
		return
	}
	grace := r.e.CancelGrace
	if grace <= 0 {
		grace = DefaultCancelGrace
	}
	wait, stop := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer stop()
	for {
		l, err := r.c.next(wait)
		if err != nil {
			return
		}
		ev, err := r.decode(l.b)
		if err == nil {
			err = r.openBlob(wait, &ev)
		}
		if err != nil || r.closeBlob(&ev) != nil {
			return
		}
		if ev.Type == wire.EventScriptDone {
			r.res.Reusable = true
			return
		}
	}
}

// finish settles Success from what arrived.
func (r *run) finish() {
	switch {
	case r.gotError:
		r.res.Success = false
	case r.req.Mode == ModePlan:
		r.res.Success = r.gotResult || r.gotValue
	default:
		r.res.Success = r.done
	}
}

func (r *run) logger() *slog.Logger {
	if r.e.Logger != nil {
		return r.e.Logger
	}
	return slog.Default()
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
