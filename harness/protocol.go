package harness

import (
	"encoding/json"
	"io"
	"time"

	"github.com/jazzmine/worker/wire"
)

// Version is the protocol version the embedded harness announces in its ready event.
const Version = "3"

// Defaults of an execution, used where a Request leaves a field zero.
const (
	// DefaultTimeout is the script's own time limit (SIGALRM in the harness).
	DefaultTimeout = 30 * time.Second
	// DefaultBuffer is added to the timeout to give the host-side deadline.
	DefaultBuffer = 5 * time.Second
	// DefaultMaxOutputBytes caps the bytes of the event stream of one execution.
	DefaultMaxOutputBytes = 1 << 20
	// DefaultCancelGrace is how long a cancelled execution may take to end before the
	// harness is considered unusable.
	DefaultCancelGrace = 2 * time.Second
	// DefaultMaxLineBytes caps one protocol line; a longer line is dropped and ends the
	// execution as an output-limit failure.
	DefaultMaxLineBytes = 16 << 20
)

// Mode decides what counts as success.
type Mode string

const (
	// ModePlan needs emit_result(): a script that ends without it fails.
	ModePlan Mode = wire.ModePlan
	// ModeInteractive succeeds without a result unless the script fails.
	ModeInteractive Mode = wire.ModeInteractive
)

// Event types of the harness protocol (harness to host) that are the protocol's
// alone: the others are wire's (wire.EventIntermediate, wire.EventLog,
// wire.EventStdout, wire.EventStderr, wire.EventFinalResult, wire.EventError,
// wire.EventScriptDone), whose events the worker passes on to NATS by the same names.
// TestThePythonHarnessNamesWhatGoNames holds the harness's Python to these and to
// wire's.
const (
	// EventReady is the harness's first event: what it loaded (see [Ready]).
	EventReady = "ready"
	// EventResetDone answers a reset, and ends every execute unasked.
	EventResetDone = "reset_done"
	// EventPong answers a ping.
	EventPong = "pong"
)

// Request types of the harness protocol (host to harness).
const (
	requestExecute = "execute"
	requestCancel  = "cancel"
	requestReset   = "reset"
	requestPing    = "ping"
	requestFile    = "file"
	requestChunk   = "chunk"
)

// Event types and error kinds the harness shares with wire: wire's constants, one
// definition, named here too for sandboxpool, which reaches wire only through this
// package (DESIGN.md section 2).
const (
	EventIntermediate  = wire.EventIntermediate
	EventLog           = wire.EventLog
	EventStdout        = wire.EventStdout
	EventStderr        = wire.EventStderr
	EventFinalResult   = wire.EventFinalResult
	EventError         = wire.EventError
	EventScriptDone    = wire.EventScriptDone
	EventArtifact      = wire.EventArtifact
	EventDisplay       = wire.EventDisplay
	EventExecuteResult = wire.EventExecuteResult
	KindScript         = wire.KindScript
	KindTimeout        = wire.KindTimeout
	KindOutputLimit    = wire.KindOutputLimit
	KindCrashed        = wire.KindCrashed
	KindOOM            = wire.KindOOM
	KindCancelled      = wire.KindCancelled
	KindMissingSecrets = wire.KindMissingSecrets
	KindInfrastructure = wire.KindInfrastructure
	KindInputFile      = wire.KindInputFile
	KindArtifactLimit  = wire.KindArtifactLimit
	KindSessionLost    = wire.KindSessionLost
	KindSessionLimit   = wire.KindSessionLimit
)

// EventChunk is a line of the bytes of the artifact or display image whose line came
// just before it (see [Event.Blob]); the harness sends input files to the harness the
// same way.
const EventChunk = "chunk"

// ChunkBytes is the most bytes one chunk line carries, before base64.
const ChunkBytes = 192 << 10

// ErrNoResult and NoResultHint are the error and the hint of a plan-mode execution
// that gave no result; the harness's Python says the same (a test holds them
// together).
const (
	ErrNoResult  = "Script finished without a result (plan mode requires one)"
	NoResultHint = "End the script with an expression: its value is the result, as the last line of a notebook cell is shown. Or call emit_result(value)."
)

// ErrStdoutClosed is the error text of an execution whose harness stream ended.
const ErrStdoutClosed = "Container stdout closed unexpectedly"

// Event is one line of the harness protocol, harness to host. Which fields are set
// depends on Type; Data is passed through as raw JSON.
type Event struct {
	Type        string          `json:"type"`
	ExecutionID string          `json:"execution_id,omitempty"`
	Label       string          `json:"label,omitempty"`
	Data        json.RawMessage `json:"data,omitempty"`
	Level       string          `json:"level,omitempty"`
	Message     string          `json:"message,omitempty"`
	Text        string          `json:"text,omitempty"`
	Error       string          `json:"error,omitempty"`
	Traceback   string          `json:"traceback,omitempty"`
	Kind        string          `json:"kind,omitempty"`
	Hint        string          `json:"hint,omitempty"`
	// Nonfinite are the places of the NaNs and infinities of Data, which its JSON
	// has as null (see [wire.WithNonfinite]).
	Nonfinite wire.Nonfinites `json:"nonfinite,omitempty"`
	// ExecutionCount numbers an execute_result among its session's calls.
	ExecutionCount int     `json:"execution_count,omitempty"`
	ExitCode       *int    `json:"exit_code,omitempty"`
	Signal         string  `json:"signal,omitempty"`
	DurationMS     float64 `json:"duration_ms,omitempty"`
	// CPUMS and PeakMemoryBytes are what a script_done's execution cost (see
	// [Result]).
	CPUMS           float64 `json:"cpu_ms,omitempty"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes,omitempty"`
	// Nonce is set on script_done, reset_done and pong: the nonce of the request they
	// answer. The host takes none of them without it.
	Nonce string `json:"nonce,omitempty"`
	// Path (workspace-relative), ContentType and Size describe the file of an artifact
	// event or the image of a display event. Size bytes follow as chunk lines, which
	// the Executor hands over as Blob.
	Path        string `json:"path,omitempty"`
	ContentType string `json:"content_type,omitempty"`
	Size        int64  `json:"size,omitempty"`
	// Blob reads the Size bytes of an artifact, or of a display event's image (nil
	// when it has none), from the stream, while the EventFunc runs: read it there, or
	// the Executor skips what is left. It fails when the harness does not send them.
	Blob io.Reader `json:"-"`
}

// IsFile reports whether ev announces a file (its Blob holds the bytes): an artifact,
// or the image of a display or an execute_result.
func (ev *Event) IsFile() bool {
	return ev.Type == EventArtifact || (ev.Type == EventDisplay || ev.Type == EventExecuteResult) && ev.Path != ""
}

// Ready is the harness's first event: what it loaded.
type Ready struct {
	Version string   `json:"version"`
	Python  string   `json:"python"`
	PID     int      `json:"pid"`
	Tools   []string `json:"tools"`
	// ToolSpecs describe the tools, sorted by name: signature, docstring, async.
	// A harness of before they were announced sends none.
	ToolSpecs  []ToolSpec  `json:"tool_specs"`
	ToolErrors []ToolError `json:"tool_errors"`
}

// ToolSpec is one tool as the ready event describes it: wire's, which the
// sandbox catalog publishes as it is (one definition).
type ToolSpec = wire.ToolSpec

// ToolError is a tool file that failed to load.
type ToolError struct {
	File      string `json:"file"`
	Error     string `json:"error"`
	Traceback string `json:"traceback"`
}

// request is one line host to harness.
type request struct {
	Type string `json:"type"`
	// Nonce is a random value per request (execute, reset, ping) that the harness
	// echoes in its answer and never passes to a script: a line that claims to
	// answer without it is not believed. See newNonce.
	Nonce           string   `json:"nonce,omitempty"`
	ExecutionID     string   `json:"execution_id,omitempty"`
	Script          string   `json:"script,omitempty"`
	Timeout         float64  `json:"timeout,omitempty"`
	Mode            Mode     `json:"mode,omitempty"`
	MaxOutputBytes  int64    `json:"max_output_bytes,omitempty"`
	RequiredSecrets []string `json:"required_secrets,omitempty"`
	TraceParent     string   `json:"traceparent,omitempty"`
	TraceState      string   `json:"tracestate,omitempty"`

	// Of an execute: workspace paths to collect besides out/, and the artifact limits.
	Artifacts        []string `json:"artifacts,omitempty"`
	MaxArtifacts     int      `json:"max_artifacts,omitempty"`
	MaxArtifactBytes int64    `json:"max_artifact_bytes,omitempty"`
	Session          bool     `json:"session,omitempty"`
}

// fileRequest is the line that starts an input file: its chunk lines follow.
type fileRequest struct {
	Type        string `json:"type"`
	ExecutionID string `json:"execution_id"`
	Path        string `json:"path"`
	Mode        int    `json:"mode,omitempty"`
	Size        int64  `json:"size"`
}
