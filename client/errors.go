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
	sentinel error
	err      error
}

func (e *clientError) Error() string   { return e.err.Error() }
func (e *clientError) Unwrap() []error { return []error{e.sentinel, e.err} }

// errorf formats an error like [fmt.Errorf] (so %w works) that also matches
// sentinel.
func errorf(sentinel error, format string, args ...any) error {
	return &clientError{sentinel: sentinel, err: fmt.Errorf(format, args...)}
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
