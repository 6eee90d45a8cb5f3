package wire

import (
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Subjects, streams and consumers of the NATS contract. The builders take ids
// that [ValidateID] accepted: they do not check them, and an id with a '.',
// '*' or '>' would change the subject's meaning. They never panic.
const (
	// SubjectPrefixExec is the prefix of the subjects jobs are published on,
	// jazzmine.exec.<sandbox>.
	SubjectPrefixExec = "jazzmine.exec"
	// SubjectPrefixEvents is the prefix of the subjects events are
	// published on, jazzmine.events.<execution_id>.<type>.
	SubjectPrefixEvents = "jazzmine.events"
	// SubjectPrefixCancel is the prefix of the subjects cancel requests are
	// published on, jazzmine.cancel.<execution_id>.
	SubjectPrefixCancel = "jazzmine.cancel"
	// SubjectSource is where an agent of a tenant asks the fleet to carry its
	// executions' events to its account (jazzmine.source.<tenant> in the fleet's
	// account): a worker makes the fleet's consumer of them, which the tenant's
	// events stream sources ([SourceConsumer]).
	SubjectSource = "jazzmine.source"
	// SubjectPrefixSourced is the prefix of the subjects the fleet's consumer
	// delivers a tenant's events on, jazzmine.sourced.<tenant>; the tenant's
	// account sees them on jazzmine.sourced, its stream's source.
	SubjectPrefixSourced = "jazzmine.sourced"
	// SourceAPIPrefix is the JetStream API prefix under which a tenant's account
	// reaches the one call of the fleet's API its events stream makes: the reset
	// of [SourceConsumer].
	SourceAPIPrefix = "jazzmine.fleet"
	// SourceConsumer is the name a tenant's events stream knows the fleet's
	// consumer of its events by (in the fleet's account it is
	// [TenantEventsConsumer]).
	SourceConsumer = "events"

	// ExecWildcard matches the jobs of every sandbox of the fleet's own
	// account (a tenant's have one token more). [StreamExec] takes those of
	// the sandboxes the fleet serves only.
	ExecWildcard = SubjectPrefixExec + ".*"
	// AllEventsWildcard matches the events of every execution: the subjects
	// of [StreamEvents].
	AllEventsWildcard = SubjectPrefixEvents + ".>"
	// CancelWildcard matches the cancel requests of every execution.
	CancelWildcard = SubjectPrefixCancel + ".*"

	// StreamExec is the work-queue stream of jobs.
	StreamExec = "JAZZMINE_EXEC"
	// StreamEvents is the stream of execution events.
	StreamEvents = "JAZZMINE_EVENTS"
)

// Header names of jobs and events.
const (
	// HeaderMsgID carries a job's execution id (the server drops a
	// duplicate within the stream's window) and an event's [EventMsgID].
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderContentType names the encoding; see [ParseContentType].
	HeaderContentType = "Content-Type"
	// HeaderTraceparent carries the W3C trace context's traceparent,
	// lowercase, on jobs and events.
	HeaderTraceparent = "traceparent"
	// HeaderTracestate carries the W3C trace context's tracestate,
	// lowercase, on jobs and events.
	HeaderTracestate = "tracestate"
)

// ExecSubject returns the subject jobs for sandbox are published on,
// jazzmine.exec.<sandbox>. sandbox must be valid (see [ValidateID]).
func ExecSubject(sandbox string) string {
	return SubjectPrefixExec + "." + sandbox
}

// SandboxFromExecSubject returns the sandbox of a subject
// jazzmine.exec.<sandbox>. The error wraps [ErrInvalidSubject], and also
// [ErrInvalidID] when the sandbox token is not a valid name.
func SandboxFromExecSubject(subject string) (string, error) {
	t, err := tokens(subject, SubjectPrefixExec, "sandbox")
	return t[0], err
}

// ConsumerName returns the name of the durable consumer of sandbox's jobs,
// jazzmine-<sandbox>. sandbox must be valid (see [ValidateID]).
func ConsumerName(sandbox string) string {
	return "jazzmine-" + sandbox
}

// EventSubject returns the subject of an event,
// jazzmine.events.<execution_id>.<type>. executionID must be valid (see
// [ValidateID]) and eventType one of the Event constants.
func EventSubject(executionID, eventType string) string {
	return SubjectPrefixEvents + "." + executionID + "." + eventType
}

// EventsWildcard returns the subject that matches every event of an
// execution, jazzmine.events.<execution_id>.>. executionID must be valid (see
// [ValidateID]).
func EventsWildcard(executionID string) string {
	return SubjectPrefixEvents + "." + executionID + ".>"
}

// CancelSubject returns the subject that cancels an execution,
// jazzmine.cancel.<execution_id>. executionID must be valid (see
// [ValidateID]).
func CancelSubject(executionID string) string {
	return SubjectPrefixCancel + "." + executionID
}

// ExecutionIDFromCancelSubject returns the execution id of a subject
// jazzmine.cancel.<execution_id>. The error wraps [ErrInvalidSubject], and
// also [ErrInvalidID] when the id token is not a valid id.
func ExecutionIDFromCancelSubject(subject string) (string, error) {
	t, err := tokens(subject, SubjectPrefixCancel, "execution_id")
	return t[0], err
}

// EventMsgID returns the Nats-Msg-Id of an event,
// <execution_id>.<attempt>.<seq>, unique per event of every attempt.
func EventMsgID(executionID string, attempt int, seq uint64) string {
	return executionID + "." + strconv.Itoa(attempt) + "." + strconv.FormatUint(seq, 10)
}

// ParseExecSubject returns the tenant ("" for none) and the sandbox of a job's
// subject as the fleet's account sees it: jazzmine.exec.<sandbox>, or
// jazzmine.exec.<tenant>.<sandbox> for a tenant's job (the server adds the
// tenant token; see deploy/nats/auth.conf). The error wraps
// [ErrInvalidSubject], and also [ErrInvalidID] when a token is not a valid id.
func ParseExecSubject(subject string) (tenant, sandbox string, err error) {
	t, err := tenantTokens(subject, SubjectPrefixExec, "sandbox")
	return t[0], t[1], err
}

// TenantEventsConsumer is the name of the fleet's consumer that carries tenant's
// events to the tenant's events stream. tenant must be valid (see ValidateID).
func TenantEventsConsumer(tenant string) string { return "jazzmine-events-" + tenant }

// TenantEventsSubject is the subject that consumer delivers on,
// jazzmine.sourced.<tenant>.
func TenantEventsSubject(tenant string) string { return SubjectPrefixSourced + "." + tenant }

// ParseSourceSubject returns the tenant of a source request's subject as the
// fleet's account sees it, jazzmine.source.<tenant>. Errors wrap
// [ErrInvalidSubject].
func ParseSourceSubject(subject string) (tenant string, err error) {
	t, err := tokens(subject, SubjectSource, "tenant")
	return t[0], err
}

// ParseCancelSubject returns the tenant ("" for none) and the execution id of a
// cancel's subject as the fleet's account sees it: jazzmine.cancel.<execution_id>,
// or jazzmine.cancel.<tenant>.<execution_id>. Errors as [ParseExecSubject].
func ParseCancelSubject(subject string) (tenant, executionID string, err error) {
	t, err := tenantTokens(subject, SubjectPrefixCancel, "execution_id")
	return t[0], t[1], err
}

// tokens returns the tokens after prefix in subject,
// prefix.<names[0]>[.<names[1]>...], each a valid id, or as many empty strings
// and an error. The last takes the rest of the subject, so that a '.' in it
// makes an invalid id.
func tokens(subject, prefix string, names ...string) ([]string, error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	t := strings.SplitN(rest, ".", len(names))
	if !ok || len(t) < len(names) {
		return make([]string, len(names)), errorf(ErrInvalidSubject, "subject %s is not %s.<%s>", quote(subject), prefix, strings.Join(names, ">.<"))
	}
	for i, name := range names {
		if err := ValidateID(name, t[i]); err != nil {
			return make([]string, len(names)), errorf(ErrInvalidSubject, "subject %s: %w", quote(subject), err)
		}
	}
	return t, nil
}

// tenantTokens returns the valid tokens after prefix in subject:
// prefix.<tenant>.<names...> or prefix.<names...>, the tenant first ("" for none).
func tenantTokens(subject, prefix string, names ...string) ([]string, error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	switch n := strings.Count(rest, "."); {
	case ok && n == len(names)-1:
		t, err := tokens(subject, prefix, names...)
		return append([]string{""}, t...), err
	case ok && n == len(names):
		return tokens(subject, prefix, append([]string{"tenant"}, names...)...)
	}
	shape := strings.Join(names, ">.<")
	return make([]string, len(names)+1), errorf(ErrInvalidSubject, "subject %s is not %s.<%s> or %s.<tenant>.<%s>", quote(subject), prefix, shape, prefix, shape)
}

// HeaderCarrier reads and writes message headers (a nats.Header converts to it) for
// OpenTelemetry's text-map propagators, without this package importing OpenTelemetry.
// Keys are kept as they are, so the W3C propagator's lowercase traceparent and
// tracestate stay lowercase.
type HeaderCarrier map[string][]string

// Get returns the first value of key, or "".
func (h HeaderCarrier) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key with value.
func (h HeaderCarrier) Set(key, value string) { h[key] = []string{value} }

// Keys lists the keys.
func (h HeaderCarrier) Keys() []string { return slices.Collect(maps.Keys(h)) }
