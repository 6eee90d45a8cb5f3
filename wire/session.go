package wire

// Sessions: the calls of a session are published on
// jazzmine.session.<sandbox>.<session_id> and kept in [StreamSessions]; the
// worker that opened the session takes them, in order, one at a time.
const (
	// SubjectPrefixSession is the prefix of the subjects of session calls.
	SubjectPrefixSession = "jazzmine.session"
	// SessionWildcard matches every session call: the subjects of
	// [StreamSessions].
	SessionWildcard = SubjectPrefixSession + ".*.*"
	// StreamSessions is the stream of session calls.
	StreamSessions = "JAZZMINE_SESSIONS"
)

// SessionSubject returns the subject the calls of session sessionID of
// sandbox are published on, jazzmine.session.<sandbox>.<session_id>. Both
// must be valid (see [ValidateID]).
func SessionSubject(sandbox, sessionID string) string {
	return SubjectPrefixSession + "." + sandbox + "." + sessionID
}

// SessionSandboxWildcard matches the calls of every session of sandbox.
func SessionSandboxWildcard(sandbox string) string {
	return SubjectPrefixSession + "." + sandbox + ".*"
}

// ParseSessionSubject returns the sandbox and session id of a subject
// jazzmine.session.<sandbox>.<session_id>. The error wraps
// [ErrInvalidSubject], and [ErrInvalidID] for an invalid token.
func ParseSessionSubject(subject string) (sandbox, sessionID string, err error) {
	return tokens(subject, SubjectPrefixSession, "sandbox", "session_id")
}

// SessionConsumerName is the name of the durable consumer of one session's
// calls, jazzmine-session-<session_id>.
func SessionConsumerName(sessionID string) string {
	return "jazzmine-session-" + sessionID
}

// SessionOpenerName is the name of the durable consumer that sees every call
// of sandbox's sessions, for the fleet to open new sessions and answer calls
// of sessions that ended: jazzmine-sessions-<sandbox>.
func SessionOpenerName(sandbox string) string {
	return "jazzmine-sessions-" + sandbox
}
