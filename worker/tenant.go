package worker

import (
	"strings"

	"github.com/jazzmine/worker/wire"
)

// Tenants. A fleet may serve several tenants, each a NATS account of its own that
// reaches the fleet's account only through the imports deploy/nats/auth.conf gives
// it: its jazzmine.exec.<sandbox> lands here as jazzmine.exec.<tenant>.<sandbox>,
// its jazzmine.cancel.<id> as jazzmine.cancel.<tenant>.<id>, and it sees only the
// events published on jazzmine.events.<tenant>.>. A client in the fleet's own
// account (the embedded server, a deployment without tenants) has no tenant token.
// The server writes the token, from the account the message came from: a job or a
// cancel cannot name another tenant.
//
// Inside the worker an execution is an execRef, and its key, <tenant>.<id> or <id>,
// stands where the bare id stood in subjects, message ids, buckets and maps: two
// tenants may use one id without meeting.
const cancelAll = wire.SubjectPrefixCancel + ".>"

// execRef names an execution of the fleet: its tenant ("" for the fleet's own
// account) and its id.
type execRef struct{ tenant, id string }

// key is <tenant>.<id>, or <id> without a tenant: the token(s) the execution's
// subjects and keys use in place of the id.
func (r execRef) key() string {
	if r.tenant == "" {
		return r.id
	}
	return r.tenant + "." + r.id
}

func (r execRef) String() string { return r.key() }

// tenantExecSubjects are the subjects of sandbox's jobs, from every tenant:
// jazzmine.exec.<sandbox> and jazzmine.exec.*.<sandbox>.
func tenantExecSubjects(sandbox string) []string {
	return []string{wire.ExecSubject(sandbox), wire.SubjectPrefixExec + ".*." + sandbox}
}

// tenantSessionSubjects are the subjects of the calls of sandbox's sessions, from
// every tenant: jazzmine.session.<sandbox>.* and jazzmine.session.*.<sandbox>.*.
func tenantSessionSubjects(sandbox string) []string {
	return []string{wire.SubjectPrefixSession + "." + sandbox + ".*", wire.SubjectPrefixSession + ".*." + sandbox + ".*"}
}

// jobSubject is what the subject of a job or of a session call says, as the fleet's
// account sees it (the consumers' filters match no other shapes): its tenant ("" for
// none) and, for a call, its session (session is false for a job, or a subject that
// names no session).
type jobSubject struct {
	tenant, id string
	session    bool
}

// parseJobSubject reads a job's or a session call's subject, once.
func parseJobSubject(subject string) jobSubject {
	if strings.HasPrefix(subject, wire.SubjectPrefixSession+".") {
		tenant, _, id, err := wire.ParseSessionSubject(subject)
		return jobSubject{tenant: tenant, id: id, session: err == nil}
	}
	tenant, _, _ := wire.ParseExecSubject(subject)
	return jobSubject{tenant: tenant}
}

// parseCancelSubject returns the execution a cancel names, from its subject
// jazzmine.cancel.<id> or jazzmine.cancel.<tenant>.<id>.
func parseCancelSubject(subject string) (execRef, error) {
	tenant, id, err := wire.ParseCancelSubject(subject)
	return execRef{tenant, id}, err
}

// sessionRef names a session of the fleet: its tenant ("" for the fleet's own
// account) and its id, the tenant's own choice. Its key, <tenant>.<id> or <id>, keys
// its entry in BucketSessions and this worker's maps; its id alone is what the
// tenant's agents know it by.
type sessionRef execRef

func (r sessionRef) key() string { return execRef(r).key() }

// subject is the subject of the session's calls of sandbox, as the fleet's account
// sees it.
func (r sessionRef) subject(sandbox string) string {
	return wire.TenantSessionSubject(r.tenant, sandbox, r.id)
}

// consumer is the name of the session's own consumer.
func (r sessionRef) consumer() string { return wire.SessionConsumerName(r.tenant, r.id) }
