package client

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Sentinel errors of the package. The errors the package returns match them
// with [errors.Is] and say what exactly went wrong; those of an invalid job
// match the sentinels of package wire instead ([wire.ErrInvalidJob],
// [wire.ErrInvalidID], [wire.ErrScriptTooLarge]).
var (
	// ErrNoStream means that JetStream has no stream for the job's subject
	// (jazzmine.exec.<sandbox>) or for the events (JAZZMINE_EVENTS), or no
	// JetStream at all: no jazzmine worker has created the streams on this
	// NATS server.
	ErrNoStream = errors.New("client: no JetStream stream")

	// ErrUnknownSandbox means that the jobs stream (or the sessions stream, for
	// a session's call) does not take the job's subject: no worker of the fleet
	// serves its sandbox, or served it lately (the streams' subjects are the
	// sandboxes the fleet serves). The server refuses the publish, so nothing
	// was queued. An error that matches it also matches [ErrNoStream]: with no
	// streams at all (no worker ever ran against this server) the server
	// answers alike.
	ErrUnknownSandbox = errors.New("client: unknown sandbox")

	// ErrBacklogFull means that the jobs stream refused the job because its
	// backlog is full (its MaxMsgs or MaxBytes is reached and it discards
	// new messages), or the server is out of storage. It is backpressure:
	// try again later.
	ErrBacklogFull = errors.New("client: job backlog full")

	// ErrClosed is what [Execution.Wait] returns when the execution was
	// closed before its script_done arrived.
	ErrClosed = errors.New("client: execution closed")
)

// clientError is an error with its own message that also matches a
// sentinel, so that a message reads as one sentence rather than repeating
// the sentinel's text. Its message is err's; err wraps the cause.
type clientError struct {
	sentinels []error
	err       error
}

func (e *clientError) Error() string { return e.err.Error() }
func (e *clientError) Unwrap() []error {
	return append(e.sentinels[:len(e.sentinels):len(e.sentinels)], e.err)
}

// errorf formats an error like [fmt.Errorf] (so %w works) that also matches
// sentinel.
func errorf(sentinel error, format string, args ...any) error {
	return &clientError{sentinels: []error{sentinel}, err: fmt.Errorf(format, args...)}
}

// unknownSandbox is the error of a job or call whose subject no stream takes.
func unknownSandbox(id, sandbox, subject string, err error) error {
	return &clientError{sentinels: []error{ErrUnknownSandbox, ErrNoStream}, err: fmt.Errorf(
		"submit execution %q: unknown sandbox %q: no worker of the fleet serves it (no stream takes %s; is a jazzmine worker serving it against this NATS server?) (%w)",
		id, sandbox, subject, err)}
}

// JetStream API error codes the package classifies. nats.go names the first
// three; the server's "store failed" and "insufficient storage" codes it
// does not.
const (
	codeStreamNotFound     = jetstream.JSErrCodeStreamNotFound                // 10059
	codeNotEnabled         = jetstream.JSErrCodeJetStreamNotEnabled           // 10076
	codeNotEnabledAccount  = jetstream.JSErrCodeJetStreamNotEnabledForAccount // 10039
	codeStreamStoreFailed  = jetstream.ErrorCode(10077)                       // JSStreamStoreFailedF
	codeStorageResourceOut = jetstream.ErrorCode(10047)                       // JSStorageResourcesExceededErr
)

// apiErrorCode returns the JetStream API error code err carries, if any.
func apiErrorCode(err error) (jetstream.ErrorCode, bool) {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr != nil {
		return apiErr.ErrorCode, true
	}
	return 0, false
}

// isNoStream reports whether err says that there is no stream to talk to:
// no responders on the subject or the JetStream API, a stream that is not
// found, or JetStream not enabled.
func isNoStream(err error) bool {
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		return true
	}
	switch code, _ := apiErrorCode(err); code {
	case codeStreamNotFound, codeNotEnabled, codeNotEnabledAccount:
		return true
	}
	return false
}

// isBacklogFull reports whether a publish error says that the stream did not
// store the job for lack of room. The server answers a stream at its MaxMsgs,
// MaxBytes or MaxMsgsPerSubject with DiscardNew with the code 10077, "store
// failed", whose description names the limit (so does nats-server v2.15);
// the only other reason it gives with that code is a message over
// 32 MiB, far above a job's size (scripts are limited to hundreds of KiB).
// An account or server out of storage answers 10047. nats.go names neither
// code, so the numbers are here; the description is never matched.
func isBacklogFull(err error) bool {
	switch code, _ := apiErrorCode(err); code {
	case codeStreamStoreFailed, codeStorageResourceOut:
		return true
	}
	return false
}
