package wire

// Sessions: the calls of a session are published on
// jazzmine.session.<sandbox>.<session_id> and kept in [StreamSessions]; the
// worker that opened the session takes them, in order, one at a time. A
// tenant's calls arrive in the fleet's account as
// jazzmine.session.<tenant>.<sandbox>.<session_id> (the server writes the
// tenant token; see deploy/nats/auth.conf): a session id is the tenant's own,
// and two tenants may use one without meeting.
const (
	// SubjectPrefixSession is the prefix of the subjects of session calls.
	SubjectPrefixSession = "jazzmine.session"
	// SessionWildcard matches every session call of the fleet's own account
	// (a tenant's have one token more).
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

// TenantSessionSubject returns the subject of a session's calls as the
// fleet's account sees it: jazzmine.session.<tenant>.<sandbox>.<session_id>,
// or [SessionSubject] for no tenant. All must be valid (see [ValidateID]).
func TenantSessionSubject(tenant, sandbox, sessionID string) string {
	if tenant == "" {
		return SessionSubject(sandbox, sessionID)
	}
	return SubjectPrefixSession + "." + tenant + "." + sandbox + "." + sessionID
}

// ParseSessionSubject returns the tenant ("" for none), the sandbox and the
// session id of a session call's subject as the fleet's account sees it:
// jazzmine.session.<sandbox>.<session_id>, or
// jazzmine.session.<tenant>.<sandbox>.<session_id>. The error wraps
// [ErrInvalidSubject], and [ErrInvalidID] for an invalid token.
func ParseSessionSubject(subject string) (tenant, sandbox, sessionID string, err error) {
	t, err := tenantTokens(subject, SubjectPrefixSession, "sandbox", "session_id")
	return t[0], t[1], t[2], err
}

// SessionConsumerName is the name of the durable consumer of one session's
// calls: jazzmine-session-<session_id>, or jazzmine-session-<tenant>~<session_id>
// for a tenant's session ('~' is in no id, so no two sessions share a name).
func SessionConsumerName(tenant, sessionID string) string {
	if tenant == "" {
		return "jazzmine-session-" + sessionID
	}
	return "jazzmine-session-" + tenant + "~" + sessionID
}

// SessionOpenerName is the name of the durable consumer that sees every call
// of sandbox's sessions, for the fleet to open new sessions and answer calls
// of sessions that ended: jazzmine-sessions-<sandbox>.
func SessionOpenerName(sandbox string) string {
	return "jazzmine-sessions-" + sandbox
}
