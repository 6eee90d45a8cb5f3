package wire

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Event types, the last token of an event's subject and the Type of an
// [Event].
const (
	// EventStarted is published when a container takes the execution; its
	// payload is Sandbox and ContainerID.
	EventStarted = "started"
	// EventIntermediate carries an intermediate result of the script: Label
	// and Data.
	EventIntermediate = "intermediate"
	// EventLog carries a message the script logged: Level and Message.
	EventLog = "log"
	// EventStdout carries a chunk of what the script printed to standard
	// output: Text.
	EventStdout = "stdout"
	// EventStderr carries a chunk of what the script printed to standard
	// error: Text.
	EventStderr = "stderr"
	// EventFinalResult carries the result the script emitted: Data.
	EventFinalResult = "final_result"
	// EventError says that the execution failed: Error, Traceback (when the
	// script raised) and Kind.
	EventError = "error"
	// EventScriptDone carries the outcome of the execution: Success,
	// DurationMS, OutputBytes, Error and FinalData. It is always the last
	// event of an attempt.
	EventScriptDone = "script_done"
	// EventArtifact announces a file the script left in the workspace, stored
	// after the run and before script_done: Path (in the workspace), Bucket,
	// Object, Size, SHA256 and ContentType.
	EventArtifact = "artifact"
	// EventDisplay carries what the script displayed (display(obj), a
	// matplotlib figure): Data maps MIME types to text forms ("text/plain",
	// "text/html", "text/markdown"); an image is stored and named by Path
	// ("display/1.png"), Bucket, Object, Size, SHA256 and ContentType.
	EventDisplay = "display"
	// EventExecuteResult carries the value of the script's last statement,
	// when that is an expression (not None, not silenced by a trailing
	// semicolon), as Jupyter's execute_result does: Data maps MIME types to
	// the value's text forms ("text/plain" always, as IPython writes it;
	// "text/html" and others where the value has them), ExecutionCount
	// numbers the call among its session's (1 outside a session), and an
	// image (a matplotlib Figure, an object with _repr_png_) is stored and
	// named as a display's is. Where the script emitted no result, a
	// final_result event with the value's JSON form follows it.
	EventExecuteResult = "execute_result"
)

// Error kinds, the Kind of an [EventError] event.
const (
	// KindScript means that the script itself failed, such as by raising an
	// exception (then Traceback is set).
	KindScript = "script"
	// KindTimeout means that the script ran longer than its timeout.
	KindTimeout = "timeout"
	// KindOutputLimit means that the execution's events went over its
	// max_output_bytes.
	KindOutputLimit = "output_limit"
	// KindCrashed means that the script's process or its container died.
	KindCrashed = "crashed"
	// KindOOM means that the container ran out of memory.
	KindOOM = "oom"
	// KindCancelled means that the execution was cancelled on
	// jazzmine.cancel.<execution_id>.
	KindCancelled = "cancelled"
	// KindMissingSecrets means that a required secret is not set in the
	// sandbox.
	KindMissingSecrets = "missing_secrets"
	// KindInvalidJob means that the job could not be decoded or failed
	// [Job.Validate].
	KindInvalidJob = "invalid_job"
	// KindInfrastructure means that the worker could not run the job (no
	// container could be started, Docker unreachable) and gave up after its
	// retries.
	KindInfrastructure = "infrastructure"
	// KindInputFile means that an input file could not be written into the
	// workspace: its object is missing, it is over a limit, or it does not
	// fit.
	KindInputFile = "input_file"
	// KindArtifactLimit means that the files the script left were more, or
	// larger, than max_artifacts or max_artifact_bytes allow; none of them
	// was stored.
	KindArtifactLimit = "artifact_limit"
	// KindSessionLost means that the session of the call ended before it:
	// its worker or its process died, it was idle past its TTL or past its
	// maximum life, or it was closed. The call did not run.
	KindSessionLost = "session_lost"
	// KindSessionLimit means that no worker could open the session: each was
	// at its limit of sessions.
	KindSessionLimit = "session_limit"
)

// Event is one step of an execution, published on
// jazzmine.events.<execution_id>.<type>. Its fields are snake_case in both
// encodings. The first group of fields is on every event; the others are
// the payload of the types that name them, and are left out of the encoded
// event when empty, with one exception: an [EventScriptDone] event always
// carries success, duration_ms and output_bytes, so success=false is on the
// wire.
//
// Event encodes itself (it implements [json.Marshaler], [json.Unmarshaler],
// [msgpack.CustomEncoder] and [msgpack.CustomDecoder]), so that
// encoding/json and msgpack read and write the same wire form as
// [EncodeEvent] and [DecodeEvent] (though json.Marshal escapes <, > and &).
// The struct tags name the fields.
type Event struct {
	ExecutionID string `json:"execution_id" msgpack:"execution_id"`
	// Type is one of the Event constants ([EventStarted], ...).
	Type string `json:"type" msgpack:"type"`
	// Seq numbers the events of one attempt, from 1.
	Seq uint64 `json:"seq" msgpack:"seq"`
	// Attempt is the delivery of the job that produced the event, from 1.
	Attempt  int    `json:"attempt" msgpack:"attempt"`
	WorkerID string `json:"worker_id" msgpack:"worker_id"`
	// Time is when the worker published the event. It is a string in both
	// encodings: RFC 3339 with nanoseconds (time.RFC3339Nano) and the
	// offset of the time's location (workers stamp UTC), not a msgpack
	// timestamp extension, so that any msgpack library reads it. A year
	// outside 0000-9999 cannot be encoded.
	Time time.Time `json:"time" msgpack:"time"`
	// Metadata is the job's metadata, echoed. An empty map decodes as nil.
	Metadata map[string]string `json:"metadata,omitempty" msgpack:"metadata,omitempty"`

	// Sandbox and ContainerID (short) are the payload of EventStarted.
	Sandbox     string `json:"sandbox,omitempty" msgpack:"sandbox,omitempty"`
	ContainerID string `json:"container_id,omitempty" msgpack:"container_id,omitempty"`

	// Label names an EventIntermediate result.
	Label string `json:"label,omitempty" msgpack:"label,omitempty"`

	// Data is the value of an EventIntermediate or EventFinalResult event;
	// nil is left out of the encoded event.
	//
	// To encode, Data holds either a [json.RawMessage] (the JSON the
	// script's harness produced: copied as it is into JSON, converted into
	// the same values in msgpack) or the generic values decoding gives.
	// Decoding, in either encoding, gives only: nil, bool, string, int64,
	// uint64 (integers above math.MaxInt64 only), float64, []any and
	// map[string]any, the same values for the same event whatever its
	// encoding. Integers stay integers and floats stay floats (1.0 is
	// written 1.0 in JSON). NaN and infinities, which JSON cannot carry, are
	// written null in JSON and as the floats they are in msgpack (see
	// [WithNonfinite]); msgpack extension types and non-string map keys are
	// rejected. Other Go values are encoded by encoding/json and msgpack as they
	// see fit, which may differ between the two.
	Data any `json:"data,omitempty" msgpack:"data,omitempty"`

	// Level and Message are the payload of EventLog.
	Level   string `json:"level,omitempty" msgpack:"level,omitempty"`
	Message string `json:"message,omitempty" msgpack:"message,omitempty"`

	// Text is the payload of EventStdout and EventStderr: a chunk of what
	// the script printed.
	Text string `json:"text,omitempty" msgpack:"text,omitempty"`

	// Error (a message), Traceback (when the script raised) and Kind (one of
	// the Kind constants) are the payload of EventError; Error also says why
	// an EventScriptDone failed. Hint, when set, says what the error means
	// in the sandbox and what to do instead (a module the sandbox lacks,
	// IPython syntax, a missing result).
	Error     string `json:"error,omitempty" msgpack:"error,omitempty"`
	Traceback string `json:"traceback,omitempty" msgpack:"traceback,omitempty"`
	Kind      string `json:"kind,omitempty" msgpack:"kind,omitempty"`
	Hint      string `json:"hint,omitempty" msgpack:"hint,omitempty"`

	// ExecutionCount numbers an EventExecuteResult among the calls of its
	// session, from 1 (1 outside a session).
	ExecutionCount int `json:"execution_count,omitempty" msgpack:"execution_count,omitempty"`

	// Success, DurationMS, OutputBytes and FinalData are the payload of
	// EventScriptDone. The first three are always encoded on that type, even
	// when false or zero. FinalData follows the rules of Data.
	Success     bool  `json:"success" msgpack:"success"`
	DurationMS  int64 `json:"duration_ms" msgpack:"duration_ms"`
	OutputBytes int64 `json:"output_bytes" msgpack:"output_bytes"`
	FinalData   any   `json:"final_data,omitempty" msgpack:"final_data,omitempty"`
	// CPUMS and PeakMemoryBytes say what an EventScriptDone's execution
	// cost: the CPU time, in milliseconds, of its container from the start
	// of the run to its end (the script's processes, and the harness
	// relaying them), and the peak resident memory of the script's process
	// (or of a child it waited for). Zero when the harness did not say.
	CPUMS           float64 `json:"cpu_ms,omitempty" msgpack:"cpu_ms,omitempty"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes,omitempty" msgpack:"peak_memory_bytes,omitempty"`

	// Path, Bucket, Object, Size, SHA256 (hex) and ContentType describe the
	// file of an EventArtifact, or the image of an EventDisplay: where it was
	// in the workspace, and the object store bucket and object that hold it.
	// Bucket is [FilesBucket], or a tenant's [TenantFilesBucket]; empty (from
	// a worker before it was named) means FilesBucket.
	Path        string `json:"path,omitempty" msgpack:"path,omitempty"`
	Bucket      string `json:"bucket,omitempty" msgpack:"bucket,omitempty"`
	Object      string `json:"object,omitempty" msgpack:"object,omitempty"`
	Size        int64  `json:"size,omitempty" msgpack:"size,omitempty"`
	SHA256      string `json:"sha256,omitempty" msgpack:"sha256,omitempty"`
	ContentType string `json:"content_type,omitempty" msgpack:"content_type,omitempty"`
}

// eventWire is the encoded form of an Event: the time as a string, the
// script_done fields as pointers (present on that type, absent elsewhere),
// and the data fields as values with their own encoding. A test checks that
// its fields and names follow Event's.
type eventWire struct {
	ExecutionID     string            `json:"execution_id" msgpack:"execution_id"`
	Type            string            `json:"type" msgpack:"type"`
	Seq             uint64            `json:"seq" msgpack:"seq"`
	Attempt         int               `json:"attempt" msgpack:"attempt"`
	WorkerID        string            `json:"worker_id" msgpack:"worker_id"`
	Time            string            `json:"time" msgpack:"time"`
	Metadata        map[string]string `json:"metadata,omitempty" msgpack:"metadata,omitempty"`
	Sandbox         string            `json:"sandbox,omitempty" msgpack:"sandbox,omitempty"`
	ContainerID     string            `json:"container_id,omitempty" msgpack:"container_id,omitempty"`
	Label           string            `json:"label,omitempty" msgpack:"label,omitempty"`
	Data            value             `json:"data,omitzero" msgpack:"data,omitempty"`
	Level           string            `json:"level,omitempty" msgpack:"level,omitempty"`
	Message         string            `json:"message,omitempty" msgpack:"message,omitempty"`
	Text            string            `json:"text,omitempty" msgpack:"text,omitempty"`
	Error           string            `json:"error,omitempty" msgpack:"error,omitempty"`
	Traceback       string            `json:"traceback,omitempty" msgpack:"traceback,omitempty"`
	Kind            string            `json:"kind,omitempty" msgpack:"kind,omitempty"`
	Hint            string            `json:"hint,omitempty" msgpack:"hint,omitempty"`
	ExecutionCount  int               `json:"execution_count,omitempty" msgpack:"execution_count,omitempty"`
	Success         *bool             `json:"success,omitempty" msgpack:"success,omitempty"`
	DurationMS      *int64            `json:"duration_ms,omitempty" msgpack:"duration_ms,omitempty"`
	OutputBytes     *int64            `json:"output_bytes,omitempty" msgpack:"output_bytes,omitempty"`
	FinalData       value             `json:"final_data,omitzero" msgpack:"final_data,omitempty"`
	CPUMS           float64           `json:"cpu_ms,omitempty" msgpack:"cpu_ms,omitempty"`
	PeakMemoryBytes int64             `json:"peak_memory_bytes,omitempty" msgpack:"peak_memory_bytes,omitempty"`
	Path            string            `json:"path,omitempty" msgpack:"path,omitempty"`
	Bucket          string            `json:"bucket,omitempty" msgpack:"bucket,omitempty"`
	Object          string            `json:"object,omitempty" msgpack:"object,omitempty"`
	Size            int64             `json:"size,omitempty" msgpack:"size,omitempty"`
	SHA256          string            `json:"sha256,omitempty" msgpack:"sha256,omitempty"`
	ContentType     string            `json:"content_type,omitempty" msgpack:"content_type,omitempty"`
}

// toWire makes the encoded form of e in the encoding ct names.
func (e *Event) toWire(ct string) (*eventWire, error) {
	if y := e.Time.Year(); y < 0 || y > 9999 {
		return nil, fmt.Errorf("event time %v: the year is outside 0000-9999, which RFC 3339 cannot write", e.Time)
	}
	data, err := dataField(ct, e.Data, "data")
	if err != nil {
		return nil, err
	}
	finalData, err := dataField(ct, e.FinalData, "final_data")
	if err != nil {
		return nil, err
	}
	w := &eventWire{
		ExecutionID: e.ExecutionID, Type: e.Type, Seq: e.Seq, Attempt: e.Attempt, WorkerID: e.WorkerID,
		Time: e.Time.Format(time.RFC3339Nano), Metadata: e.Metadata,
		Sandbox: e.Sandbox, ContainerID: e.ContainerID, Label: e.Label, Data: data,
		Level: e.Level, Message: e.Message, Text: e.Text, Error: e.Error, Traceback: e.Traceback, Kind: e.Kind,
		Hint: e.Hint, ExecutionCount: e.ExecutionCount, CPUMS: e.CPUMS, PeakMemoryBytes: e.PeakMemoryBytes,
		FinalData: finalData, Path: e.Path, Bucket: e.Bucket, Object: e.Object, Size: e.Size,
		SHA256: e.SHA256, ContentType: e.ContentType,
	}
	done := e.Type == EventScriptDone
	if done || e.Success {
		w.Success = &e.Success
	}
	if done || e.DurationMS != 0 {
		w.DurationMS = &e.DurationMS
	}
	if done || e.OutputBytes != 0 {
		w.OutputBytes = &e.OutputBytes
	}
	return w, nil
}

// dataField makes the value of the data field name. In msgpack, raw JSON is
// decoded here, not as it is written, so that raw null leaves the field out
// as nil does; JSON writes it, null. A NaN or an infinity, which JSON writes
// null, is left out of JSON as nil is.
func dataField(ct string, v any, name string) (value, error) {
	if f, ok := v.(float64); ok && ct == ContentTypeJSON && !finite(f) {
		v = nil // JSON writes it null, which is left out as nil is
	}
	if raw, ok := v.(json.RawMessage); ok && ct == ContentTypeMsgpack {
		var err error
		if v, err = decodeRawJSON(raw); err != nil {
			return value{}, fmt.Errorf("field %q: %w", name, err)
		}
	}
	return value{v, name}, nil
}

// toEvent sets e to the event w encodes; it leaves e as it is on an error.
func (w *eventWire) toEvent(e *Event) error {
	var t time.Time
	if w.Time != "" {
		var err error
		if t, err = time.Parse(time.RFC3339Nano, w.Time); err != nil {
			return fmt.Errorf("field \"time\": %s is not an RFC 3339 time", quote(w.Time))
		}
	}
	*e = Event{
		ExecutionID: w.ExecutionID, Type: w.Type, Seq: w.Seq, Attempt: w.Attempt, WorkerID: w.WorkerID,
		Time: t, Metadata: orNil(w.Metadata),
		Sandbox: w.Sandbox, ContainerID: w.ContainerID, Label: w.Label, Data: w.Data.v,
		Level: w.Level, Message: w.Message, Text: w.Text, Error: w.Error, Traceback: w.Traceback, Kind: w.Kind,
		Hint: w.Hint, ExecutionCount: w.ExecutionCount, CPUMS: w.CPUMS, PeakMemoryBytes: w.PeakMemoryBytes,
		Success: deref(w.Success), DurationMS: deref(w.DurationMS), OutputBytes: deref(w.OutputBytes),
		FinalData: w.FinalData.v, Path: w.Path, Bucket: w.Bucket, Object: w.Object, Size: w.Size,
		SHA256: w.SHA256, ContentType: w.ContentType,
	}
	return nil
}

// deref returns what p points to, or zero for nil.
func deref[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}

// MarshalJSON encodes e as [EncodeEvent] does with [ContentTypeJSON].
func (e Event) MarshalJSON() ([]byte, error) {
	w, err := e.toWire(ContentTypeJSON)
	if err != nil {
		return nil, err
	}
	return marshalJSON(w)
}

// UnmarshalJSON decodes a JSON event into e, as [DecodeEvent] does with
// [ContentTypeJSON]. JSON null leaves e as it is.
func (e *Event) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	return e.decode(ContentTypeJSON, b)
}

// EncodeMsgpack encodes e as [EncodeEvent] does with [ContentTypeMsgpack]
// (map keys are sorted only when enc sorts them).
func (e Event) EncodeMsgpack(enc *msgpack.Encoder) error {
	w, err := e.toWire(ContentTypeMsgpack)
	if err != nil {
		return err
	}
	return enc.Encode(w)
}

// DecodeMsgpack decodes a msgpack event into e as [DecodeEvent] does, with
// the check of the whole event first.
func (e *Event) DecodeMsgpack(dec *msgpack.Decoder) error {
	raw, err := dec.DecodeRaw()
	if err != nil {
		return err
	}
	return e.decode(ContentTypeMsgpack, raw)
}

// decode decodes b, an event in the encoding ct names, into e, which it
// leaves as it is on an error.
func (e *Event) decode(ct string, b []byte) error {
	var w eventWire
	var err error
	if ct == ContentTypeJSON {
		err = unmarshalJSON(b, &w)
	} else {
		err = decodeMsgpack(b, eventKind, &w)
	}
	if err != nil {
		return err
	}
	return w.toEvent(e)
}

var (
	_ json.Marshaler        = Event{}
	_ json.Unmarshaler      = (*Event)(nil)
	_ msgpack.CustomEncoder = Event{}
	_ msgpack.CustomDecoder = (*Event)(nil)
)
