package wire_test

import (
	"errors"
	"testing"

	"github.com/jazzmine/worker/wire"
)

func TestSubjectBuilders(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{name: "jobs of a sandbox go to jazzmine.exec.<sandbox>", got: wire.ExecSubject("default"), want: "jazzmine.exec.default"},
		{name: "the exec stream covers every sandbox", got: wire.ExecWildcard, want: "jazzmine.exec.*"},
		{name: "a sandbox's consumer is jazzmine-<sandbox>", got: wire.ConsumerName("py-data"), want: "jazzmine-py-data"},
		{name: "an event goes to jazzmine.events.<id>.<type>", got: wire.EventSubject("exec-1", wire.EventScriptDone), want: "jazzmine.events.exec-1.script_done"},
		{name: "an execution's events match jazzmine.events.<id>.>", got: wire.EventsWildcard("exec-1"), want: "jazzmine.events.exec-1.>"},
		{name: "the events stream covers every execution", got: wire.AllEventsWildcard, want: "jazzmine.events.>"},
		{name: "a cancel goes to jazzmine.cancel.<id>", got: wire.CancelSubject("exec-1"), want: "jazzmine.cancel.exec-1"},
		{name: "workers listen on jazzmine.cancel.*", got: wire.CancelWildcard, want: "jazzmine.cancel.*"},
		{name: "an event's message id is <id>.<attempt>.<seq>", got: wire.EventMsgID("exec-1", 2, 17), want: "exec-1.2.17"},
		{name: "the largest seq prints in full", got: wire.EventMsgID("e", 1, 1<<64-1), want: "e.1.18446744073709551615"},
		{name: "the job stream is JAZZMINE_EXEC", got: wire.StreamExec, want: "JAZZMINE_EXEC"},
		{name: "the event stream is JAZZMINE_EVENTS", got: wire.StreamEvents, want: "JAZZMINE_EVENTS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestHeaderNames(t *testing.T) {
	for got, want := range map[string]string{
		wire.HeaderMsgID:       "Nats-Msg-Id",
		wire.HeaderContentType: "Content-Type",
		wire.HeaderTraceparent: "traceparent",
		wire.HeaderTracestate:  "tracestate",
	} {
		if got != want {
			t.Errorf("header %q, want %q", got, want)
		}
	}
}

func TestSubjectParsers(t *testing.T) {
	tests := []struct {
		name      string
		parse     func(string) (string, error)
		subject   string
		want      string
		wantIs    []error // nil when the subject is valid
		wantNotID bool    // the error is about the shape, not the id
	}{
		{name: "an exec subject gives its sandbox", parse: wire.SandboxFromExecSubject, subject: "jazzmine.exec.default", want: "default"},
		{name: "an exec subject round-trips through ExecSubject", parse: wire.SandboxFromExecSubject, subject: wire.ExecSubject("a_b-9"), want: "a_b-9"},
		{name: "an exec subject with an extra token is rejected", parse: wire.SandboxFromExecSubject, subject: "jazzmine.exec.a.b",
			wantIs: []error{wire.ErrInvalidSubject, wire.ErrInvalidID}},
		{name: "an exec subject without a sandbox is rejected", parse: wire.SandboxFromExecSubject, subject: "jazzmine.exec.",
			wantIs: []error{wire.ErrInvalidSubject, wire.ErrInvalidID}},
		{name: "the exec prefix alone is rejected", parse: wire.SandboxFromExecSubject, subject: "jazzmine.exec",
			wantIs: []error{wire.ErrInvalidSubject}, wantNotID: true},
		{name: "another subject is rejected", parse: wire.SandboxFromExecSubject, subject: "jazzmine.cancel.x",
			wantIs: []error{wire.ErrInvalidSubject}, wantNotID: true},
		{name: "a prefix that only looks alike is rejected", parse: wire.SandboxFromExecSubject, subject: "jazzmine.execx.default",
			wantIs: []error{wire.ErrInvalidSubject}, wantNotID: true},
		{name: "a cancel subject gives its execution id", parse: wire.ExecutionIDFromCancelSubject, subject: "jazzmine.cancel.exec-1", want: "exec-1"},
		{name: "a cancel subject round-trips through CancelSubject", parse: wire.ExecutionIDFromCancelSubject, subject: wire.CancelSubject("X"), want: "X"},
		{name: "a cancel wildcard is rejected", parse: wire.ExecutionIDFromCancelSubject, subject: "jazzmine.cancel.*",
			wantIs: []error{wire.ErrInvalidSubject, wire.ErrInvalidID}},
		{name: "an exec subject is not a cancel subject", parse: wire.ExecutionIDFromCancelSubject, subject: "jazzmine.exec.x",
			wantIs: []error{wire.ErrInvalidSubject}, wantNotID: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.parse(tt.subject)
			if tt.wantIs == nil {
				if err != nil || got != tt.want {
					t.Fatalf("parse(%q) = %q, %v; want %q", tt.subject, got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("parse(%q) = %q, want an error", tt.subject, got)
			}
			for _, target := range tt.wantIs {
				if !errors.Is(err, target) {
					t.Errorf("parse(%q) = %v, want an error wrapping %v", tt.subject, err, target)
				}
			}
			if tt.wantNotID && errors.Is(err, wire.ErrInvalidID) {
				t.Errorf("parse(%q) = %v, which should not wrap ErrInvalidID", tt.subject, err)
			}
		})
	}
}

func TestTenantSubjectParsers(t *testing.T) {
	tests := []struct {
		name           string
		parse          func(string) (string, string, error)
		subject        string
		tenant, last   string
		wantErr, badID bool
	}{
		{name: "a job without a tenant", parse: wire.ParseExecSubject, subject: "jazzmine.exec.default", last: "default"},
		{name: "a tenant's job", parse: wire.ParseExecSubject, subject: "jazzmine.exec.acme.default", tenant: "acme", last: "default"},
		{name: "a cancel without a tenant", parse: wire.ParseCancelSubject, subject: "jazzmine.cancel.x-1", last: "x-1"},
		{name: "a tenant's cancel", parse: wire.ParseCancelSubject, subject: "jazzmine.cancel.acme.x-1", tenant: "acme", last: "x-1"},
		{name: "three tokens after the prefix are rejected", parse: wire.ParseExecSubject, subject: "jazzmine.exec.a.b.c", wantErr: true},
		{name: "a literal wildcard sandbox is rejected", parse: wire.ParseExecSubject, subject: "jazzmine.exec.acme.*", wantErr: true, badID: true},
		{name: "a literal wildcard tenant is rejected", parse: wire.ParseCancelSubject, subject: "jazzmine.cancel.>.x", wantErr: true, badID: true},
		{name: "a stray character is rejected", parse: wire.ParseExecSubject, subject: "jazzmine.exec.x!y", wantErr: true, badID: true},
		{name: "another prefix is rejected", parse: wire.ParseCancelSubject, subject: "jazzmine.exec.acme.x", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tenant, last, err := tt.parse(tt.subject)
			if tt.wantErr {
				if !errors.Is(err, wire.ErrInvalidSubject) || errors.Is(err, wire.ErrInvalidID) != tt.badID {
					t.Errorf("parse(%q) = %v; want ErrInvalidSubject (and ErrInvalidID: %v)", tt.subject, err, tt.badID)
				}
				return
			}
			if err != nil || tenant != tt.tenant || last != tt.last {
				t.Errorf("parse(%q) = %q, %q, %v; want %q, %q", tt.subject, tenant, last, err, tt.tenant, tt.last)
			}
		})
	}
}

// TestParseSourceSubject: a tenant's source request names its tenant, and only that.
func TestParseSourceSubject(t *testing.T) {
	if tenant, err := wire.ParseSourceSubject("jazzmine.source.acme"); err != nil || tenant != "acme" {
		t.Errorf("ParseSourceSubject(jazzmine.source.acme) = %q, %v", tenant, err)
	}
	for _, bad := range []string{"jazzmine.source", "jazzmine.source.*", "jazzmine.source.a.b", "jazzmine.sourced.acme"} {
		if _, err := wire.ParseSourceSubject(bad); !errors.Is(err, wire.ErrInvalidSubject) {
			t.Errorf("ParseSourceSubject(%q) = %v, want ErrInvalidSubject", bad, err)
		}
	}
}

func TestParseSessionSubject(t *testing.T) {
	tests := []struct {
		name                       string
		subject                    string
		tenant, sandbox, sessionID string
		wantErr, badID             bool
	}{
		{name: "a session call gives its sandbox and session", subject: "jazzmine.session.py.s-1", sandbox: "py", sessionID: "s-1"},
		{name: "a call round-trips through SessionSubject", subject: wire.SessionSubject("a_b", "X"), sandbox: "a_b", sessionID: "X"},
		{name: "a tenant's call gives its tenant too", subject: "jazzmine.session.acme.py.s-1", tenant: "acme", sandbox: "py", sessionID: "s-1"},
		{name: "a tenant's call round-trips through TenantSessionSubject", subject: wire.TenantSessionSubject("t", "a_b", "X"), tenant: "t", sandbox: "a_b", sessionID: "X"},
		{name: "no tenant is the fleet's subject", subject: wire.TenantSessionSubject("", "py", "X"), sandbox: "py", sessionID: "X"},
		{name: "a subject without a session id is rejected", subject: "jazzmine.session.py", wantErr: true},
		{name: "a subject with more tokens is rejected", subject: "jazzmine.session.t.py.a.b", wantErr: true},
		{name: "an empty sandbox is an invalid id", subject: "jazzmine.session..s", wantErr: true, badID: true},
		{name: "an empty tenant is an invalid id", subject: "jazzmine.session..py.s", wantErr: true, badID: true},
		{name: "a wildcard session is an invalid id", subject: "jazzmine.session.py.*", wantErr: true, badID: true},
		{name: "a wildcard tenant is an invalid id", subject: "jazzmine.session.*.py.s", wantErr: true, badID: true},
		{name: "another prefix is rejected", subject: "jazzmine.exec.py.s", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tenant, sandbox, sessionID, err := wire.ParseSessionSubject(tt.subject)
			if tt.wantErr {
				if !errors.Is(err, wire.ErrInvalidSubject) || errors.Is(err, wire.ErrInvalidID) != tt.badID {
					t.Errorf("ParseSessionSubject(%q) = %v; want ErrInvalidSubject (and ErrInvalidID: %v)", tt.subject, err, tt.badID)
				}
				return
			}
			if err != nil || tenant != tt.tenant || sandbox != tt.sandbox || sessionID != tt.sessionID {
				t.Errorf("ParseSessionSubject(%q) = %q, %q, %q, %v; want %q, %q, %q", tt.subject, tenant, sandbox, sessionID, err, tt.tenant, tt.sandbox, tt.sessionID)
			}
		})
	}
}

func TestNoTwoSessionsShareAConsumerName(t *testing.T) {
	// Ids may hold '-' and '_': a joiner made of them would give tenant "a" with session
	// "b-c" the name of tenant "a-b" with session "c".
	names := map[string][2]string{}
	for _, ts := range [][2]string{{"", "a-b-c"}, {"a", "b-c"}, {"a-b", "c"}, {"a_b", "c"}, {"", "a_b-c"}, {"a", "b"}} {
		name := wire.SessionConsumerName(ts[0], ts[1])
		if other, ok := names[name]; ok {
			t.Errorf("SessionConsumerName(%q, %q) = %q, the name of %q too", ts[0], ts[1], name, other)
		}
		names[name] = ts
	}
}
