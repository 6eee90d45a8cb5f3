package wire

import (
	"cmp"
	"fmt"
	"unicode/utf8"
)

// Modes of a job.
const (
	// ModePlan, the default on the wire, makes a script succeed only when it
	// gives a result: it ends with an expression (its value is the result,
	// see EventExecuteResult) or calls emit_result(); a script that ends
	// without one fails.
	ModePlan = "plan"
	// ModeInteractive, what the Go client and the CLI send unless told
	// otherwise, lets a script succeed without a result, as a notebook cell
	// does.
	ModeInteractive = "interactive"
)

// Limits that [Job.Validate] enforces.
const (
	// DefaultMaxScriptBytes is the script size limit of [Job.Validate] when
	// it is given zero: 256 KiB.
	DefaultMaxScriptBytes = 256 << 10

	// MaxTimeoutSec is the largest timeout_sec a job may ask for: one hour.
	// A worker may apply a lower ceiling of its own.
	MaxTimeoutSec = 3600

	// MaxOutputLimit is the largest max_output_bytes a job may ask for: 16 MiB. A
	// worker holds an execution's events until the stream has stored them all, so
	// this bounds what one job can make it hold.
	MaxOutputLimit = 16 << 20

	// MaxRequiredSecrets is the largest number of names in required_secrets.
	MaxRequiredSecrets = 64

	// MaxSecretNameLength is the longest name in required_secrets, in bytes.
	MaxSecretNameLength = 128

	// MaxMetadataKeys is the largest number of keys in a job's metadata.
	MaxMetadataKeys = 64

	// MaxMetadataBytes bounds the metadata of a job: the lengths of all its
	// keys and values added up, in bytes. Metadata is copied into every event
	// of the job, so it is kept small.
	MaxMetadataBytes = 4 << 10
)

// Job is what an agent publishes on jazzmine.exec.<sandbox> to run a script.
// Field names are snake_case in both encodings; see [EncodeJob] and
// [DecodeJob]. A decoded job must pass [Job.Validate] before it is run.
type Job struct {
	// ExecutionID names the execution; it is required, matches
	// ^[A-Za-z0-9_-]{1,64}$ (it becomes a subject token), and is the
	// Nats-Msg-Id the agent publishes with, so a resent job is dropped as a
	// duplicate.
	ExecutionID string `json:"execution_id" msgpack:"execution_id"`

	// Sandbox is the sandbox that runs the script. It comes from the subject;
	// when it is also in the body it must match the subject.
	Sandbox string `json:"sandbox,omitempty" msgpack:"sandbox,omitempty"`

	// Script is the Python source to run; it is required, UTF-8, and at
	// most the worker's limit ([DefaultMaxScriptBytes] unless configured).
	Script string `json:"script" msgpack:"script"`

	// Mode is [ModePlan] (the default when empty) or [ModeInteractive].
	Mode string `json:"mode,omitempty" msgpack:"mode,omitempty"`

	// TimeoutSec is the execution timeout in seconds; zero means the
	// worker's default (30 s), and at most [MaxTimeoutSec] is allowed.
	TimeoutSec float64 `json:"timeout_sec,omitempty" msgpack:"timeout_sec,omitempty"`

	// MaxOutputBytes bounds the bytes of the whole event stream of the
	// execution; zero means the worker's default (1 MiB), and at most
	// [MaxOutputLimit] is allowed.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty" msgpack:"max_output_bytes,omitempty"`

	// RequiredSecrets names the secrets (environment variables) the script
	// needs; the execution fails with [KindMissingSecrets] when one of them
	// is not set in the container. Names look like environment variables:
	// ^[A-Za-z_][A-Za-z0-9_]*$. An empty list decodes as nil.
	RequiredSecrets []string `json:"required_secrets,omitempty" msgpack:"required_secrets,omitempty"`

	// Metadata is echoed in every event of the execution; at most
	// [MaxMetadataKeys] keys and [MaxMetadataBytes] bytes. An empty map
	// decodes as nil.
	Metadata map[string]string `json:"metadata,omitempty" msgpack:"metadata,omitempty"`

	// Files are written into the workspace before the script runs; see
	// [File]. At most [MaxInputFiles], with at most [MaxInlineBytes] of
	// inline data. An empty list decodes as nil.
	Files []File `json:"files,omitempty" msgpack:"files,omitempty"`

	// Artifacts are workspace paths (files or directories) collected after
	// the run besides [OutDir], which always is; each becomes an
	// [EventArtifact]. At most [MaxArtifactPaths].
	Artifacts []string `json:"artifacts,omitempty" msgpack:"artifacts,omitempty"`

	// MaxArtifacts and MaxArtifactBytes bound the artifacts and display
	// images of the execution, by count and by their size added up; zero
	// means [DefaultMaxArtifacts] and [DefaultMaxArtifactBytes], and at
	// most [MaxArtifactsLimit] and [MaxArtifactBytesLimit] are allowed.
	// Past them the files of the workspace are not stored at all and the
	// execution fails with [KindArtifactLimit].
	MaxArtifacts     int   `json:"max_artifacts,omitempty" msgpack:"max_artifacts,omitempty"`
	MaxArtifactBytes int64 `json:"max_artifact_bytes,omitempty" msgpack:"max_artifact_bytes,omitempty"`

	// SessionID makes the job a call of a session: it runs in the session's
	// own Python process, whose globals, imports and workspace the earlier
	// calls left. Such a job is published on [SessionSubject]; it matches
	// ^[A-Za-z0-9_-]{1,64}$.
	SessionID string `json:"session_id,omitempty" msgpack:"session_id,omitempty"`
	// SessionClose ends the session after this call; its script may then be
	// empty (the call only closes the session).
	SessionClose bool `json:"session_close,omitempty" msgpack:"session_close,omitempty"`
}

// Validate checks j against the rules of the NATS contract and fills its
// defaults: Sandbox from subjectSandbox when the body has none, and Mode
// [ModePlan] when empty. The defaults are filled only when j is valid.
//
// subjectSandbox is the sandbox of the subject the job arrived on (see
// [SandboxFromExecSubject]); a sandbox in the body must match it. An empty
// subjectSandbox (an agent checking a job before it publishes it) means that
// the body's sandbox is used and must be valid. maxScriptBytes is the script
// size limit; zero or less means [DefaultMaxScriptBytes].
//
// The error wraps [ErrInvalidJob], and also [ErrInvalidID] for a bad
// execution id or sandbox name and [ErrScriptTooLarge] for a script over the
// limit. Its message names the field and the rule, for the agent to read.
func (j *Job) Validate(subjectSandbox string, maxScriptBytes int) error {
	if err := j.validate(subjectSandbox, maxScriptBytes); err != nil {
		return errorf(ErrInvalidJob, "invalid job: %w", err)
	}
	j.Sandbox, j.Mode = cmp.Or(j.Sandbox, subjectSandbox), cmp.Or(j.Mode, ModePlan)
	return nil
}

func (j *Job) validate(subjectSandbox string, maxScriptBytes int) error {
	if maxScriptBytes <= 0 {
		maxScriptBytes = DefaultMaxScriptBytes
	}
	if err := ValidateID("execution_id", j.ExecutionID); err != nil {
		return err
	}

	if j.Sandbox != "" && subjectSandbox != "" && j.Sandbox != subjectSandbox {
		return fmt.Errorf("sandbox %s in the job does not match the sandbox %s of the subject", quote(j.Sandbox), quote(subjectSandbox))
	}
	if err := ValidateID("sandbox", cmp.Or(j.Sandbox, subjectSandbox)); err != nil {
		return err
	}

	if j.SessionID != "" {
		if err := ValidateID("session_id", j.SessionID); err != nil {
			return err
		}
	} else if j.SessionClose {
		return fmt.Errorf("session_close without a session_id")
	}
	switch {
	case j.Script == "" && j.SessionClose:
	case j.Script == "":
		return fmt.Errorf("script is missing")
	case len(j.Script) > maxScriptBytes:
		return errorf(ErrScriptTooLarge, "script is %d bytes, more than the limit of %d bytes", len(j.Script), maxScriptBytes)
	case !utf8.ValidString(j.Script):
		return fmt.Errorf("script is not valid UTF-8")
	}

	switch j.Mode {
	case "", ModePlan, ModeInteractive:
	default:
		return fmt.Errorf("mode %s is invalid: it must be %q (the default) or %q", quote(j.Mode), ModePlan, ModeInteractive)
	}

	// The negated comparison also catches NaN.
	if !(j.TimeoutSec >= 0 && j.TimeoutSec <= MaxTimeoutSec) {
		return fmt.Errorf("timeout_sec %v is invalid: it must be between 0 (the worker's default) and %d seconds", j.TimeoutSec, MaxTimeoutSec)
	}
	if j.MaxOutputBytes < 0 || j.MaxOutputBytes > MaxOutputLimit {
		return fmt.Errorf("max_output_bytes %d is invalid: it must be between 0 (the worker's default) and %d", j.MaxOutputBytes, MaxOutputLimit)
	}

	if err := validateSecrets(j.RequiredSecrets); err != nil {
		return err
	}
	if err := j.validateFiles(); err != nil {
		return err
	}
	return validateMetadata(j.Metadata)
}

func validateSecrets(names []string) error {
	if len(names) > MaxRequiredSecrets {
		return fmt.Errorf("required_secrets holds %d names, at most %d are allowed", len(names), MaxRequiredSecrets)
	}
	for i, name := range names {
		switch {
		case len(name) > MaxSecretNameLength:
			return fmt.Errorf("required_secrets[%d] %s is too long: at most %d characters are allowed", i, quote(name), MaxSecretNameLength)
		case !validSecretName(name):
			return fmt.Errorf("required_secrets[%d] %s is invalid: a secret name is an environment variable name, letters, digits and '_', not starting with a digit", i, quote(name))
		}
	}
	return nil
}

// validateMetadata checks the bounds of a job's metadata. Every event of the
// job carries it, so it is small and valid UTF-8.
func validateMetadata(m map[string]string) error {
	if len(m) > MaxMetadataKeys {
		return fmt.Errorf("metadata holds %d keys, at most %d are allowed", len(m), MaxMetadataKeys)
	}
	size := 0
	for k, v := range m {
		switch {
		case k == "":
			return fmt.Errorf("metadata has an empty key")
		case !utf8.ValidString(k):
			return fmt.Errorf("metadata key %s is not valid UTF-8", quote(k))
		case !utf8.ValidString(v):
			return fmt.Errorf("metadata value of key %s is not valid UTF-8", quote(k))
		}
		size += len(k) + len(v)
	}
	if size > MaxMetadataBytes {
		return fmt.Errorf("metadata is %d bytes (keys and values added up), at most %d are allowed", size, MaxMetadataBytes)
	}
	return nil
}
