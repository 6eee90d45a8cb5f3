package worker

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// Decoding a job message: what the processor, the session openers and the cancel of
// a queued job read of a job before anything runs, and the ids an error may be
// published under.

// decode reads a job message: its tenant (from the subject), encoding and body,
// validated against the sandbox it was pulled for and the script limit, with its
// Nats-Msg-Id header naming the execution its body does. On error, job and ref are
// what could be read (ref.id is the id an error may be published under, or "").
func decode(sandbox string, msg message, maxScript int) (job *wire.Job, ref execRef, ct string, err error) {
	hdr := msg.Headers()
	headerID := hdr.Get(wire.HeaderMsgID)
	subject := parseJobSubject(msg.Subject())
	ref.tenant = subject.tenant
	ct, err = wire.ParseContentType(hdr.Get(wire.HeaderContentType))
	if err != nil {
		return nil, execRef{ref.tenant, ownedID(nil, headerID)}, wire.ContentTypeJSON, err // its own encoding is unknown: answer in the readable one
	}
	job, err = wire.DecodeJob(ct, msg.Data())
	if err == nil {
		err = job.Validate(sandbox, maxScript)
	}
	if err == nil {
		err = sameIDs(headerID, job.ExecutionID)
	}
	if err == nil {
		err = sameSession(subject, job)
	}
	if err != nil {
		return job, execRef{ref.tenant, ownedID(job, headerID)}, ct, err
	}
	return job, execRef{ref.tenant, job.ExecutionID}, ct, nil
}

// refusedToTenants is the error of a tenant's job or session call of sb, or nil if sb
// serves tenants (Sandbox.TenantRefusal).
func refusedToTenants(sb Sandbox) error {
	if sb.TenantRefusal == "" {
		return nil
	}
	return fmt.Errorf("sandbox %s serves no tenant: %s", sb.Name, sb.TenantRefusal)
}

// message is what decode reads of a message: a delivery (jetstream.Msg), or one read
// from a stream (storedMsg).
type message interface {
	Subject() string
	Headers() nats.Header
	Data() []byte
}

// storedMsg is a message read from a stream, as decode reads it.
type storedMsg struct{ m *jetstream.RawStreamMsg }

func (s storedMsg) Subject() string      { return s.m.Subject }
func (s storedMsg) Headers() nats.Header { return s.m.Header }
func (s storedMsg) Data() []byte         { return s.m.Data }

// sameSession checks that a session call came on its session's subject, and that a
// job on a sandbox's subject names no session.
func sameSession(subject jobSubject, job *wire.Job) error {
	switch {
	case !subject.session && job.SessionID != "":
		return fmt.Errorf("session_id %q: a session's calls are published on %s", job.SessionID, wire.SessionSubject(job.Sandbox, job.SessionID))
	case subject.session && job.SessionID != subject.id:
		return fmt.Errorf("session_id %q differs from the session %q of the subject", job.SessionID, subject.id)
	}
	return nil
}

// sameIDs checks that a job's Nats-Msg-Id header names the execution its body does.
// The header is what the events stream deduplicates jobs by, so a job whose header
// names another id (or none) could run under an id another job holds.
func sameIDs(header, body string) error {
	if header == "" {
		return fmt.Errorf("the job has no %s header: publish it with %s: %s", wire.HeaderMsgID, wire.HeaderMsgID, body)
	}
	if header != body {
		return fmt.Errorf("the job's %s header %q and its execution_id %q differ", wire.HeaderMsgID, header, body)
	}
	return nil
}

// ownedID is the id an invalid job's error may be published under: the Nats-Msg-Id
// header's, when it is a valid id and the body names no other. The stream took the
// message under that header, so no other job of the dedup window holds the id; an id
// named only by the body may be another agent's execution, whose events must not get
// a stranger's error (nor lose their message ids to it). Without one, the job is only
// terminated, with the reason.
func ownedID(job *wire.Job, header string) string {
	if wire.ValidateID("execution id", header) != nil {
		return ""
	}
	if job != nil && job.ExecutionID != "" && job.ExecutionID != header {
		return ""
	}
	return header
}

func truncateReason(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}
