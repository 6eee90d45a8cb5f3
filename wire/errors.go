package wire

import (
	"errors"
	"fmt"
	"strconv"
)

// Sentinel errors of the package. Every error a function of the package
// returns matches one of them with [errors.Is]; the message of the error says
// what exactly was wrong, in words meant for the agent that sent the message.
var (
	// ErrMalformed means that bytes could not be decoded as a job or an event
	// in the encoding their content type names: broken syntax, a truncated
	// message, a field of the wrong type, a string that is not UTF-8.
	ErrMalformed = errors.New("malformed message")

	// ErrUnsupportedContentType means that a Content-Type header names
	// neither [ContentTypeMsgpack] nor [ContentTypeJSON].
	ErrUnsupportedContentType = errors.New("unsupported content type")

	// ErrInvalidJob means that a decoded job breaks a rule of [Job.Validate].
	// The more specific [ErrInvalidID] and [ErrScriptTooLarge] come with it
	// when they apply.
	ErrInvalidJob = errors.New("invalid job")

	// ErrInvalidID means that a sandbox name or an execution id does not
	// match ^[A-Za-z0-9_-]{1,64}$ (see [ValidateID]).
	ErrInvalidID = errors.New("invalid identifier")

	// ErrScriptTooLarge means that a job's script is longer than the limit
	// given to [Job.Validate].
	ErrScriptTooLarge = errors.New("script too large")

	// ErrInvalidSubject means that a subject does not have the shape of the
	// NATS contract, such as jazzmine.exec.<sandbox>.
	ErrInvalidSubject = errors.New("invalid subject")
)

// wireError is an error with its own message that also matches a sentinel.
// It lets a message read "execution_id "a.b" is invalid: ..." rather than
// repeating the sentinel's text.
type wireError struct {
	sentinel error
	err      error
}

func (e *wireError) Error() string   { return e.err.Error() }
func (e *wireError) Unwrap() []error { return []error{e.sentinel, e.err} }

// errorf formats an error like [fmt.Errorf] (so %w works) that also matches
// sentinel.
func errorf(sentinel error, format string, args ...any) error {
	return &wireError{sentinel: sentinel, err: fmt.Errorf(format, args...)}
}

// quote quotes s for an error message, cutting it short so that a megabyte
// of garbage does not end up in a log line.
func quote(s string) string {
	const limit = 80
	if len(s) <= limit {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:limit]) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}
