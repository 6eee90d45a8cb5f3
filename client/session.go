package client

import (
	"context"
	"fmt"

	"github.com/jazzmine/worker/wire"
)

// Session is a session of a sandbox: its calls run one at a time, in order, in one
// Python process of a container of its own, which keeps its globals, imports and
// workspace files from one call to the next. The first call opens it on a worker of
// the fleet; later calls go to that worker. It ends when closed, when idle past the
// workers' idle TTL (10 minutes by default), past its maximum life (an hour), or
// when its process or worker dies: a call after that fails with
// [wire.KindSessionLost], never runs in a new empty session.
//
// A Session is safe for concurrent use, but its calls run one at a time anyway.
type Session struct {
	c *Client
	// ID is the session's id, and Sandbox its sandbox.
	ID, Sandbox string
}

// NewSession returns a new session of sandbox, with a new random id. Nothing is
// sent until its first call, which opens it.
func (c *Client) NewSession(sandbox string) *Session {
	return &Session{c: c, ID: NewExecutionID(), Sandbox: sandbox}
}

// Submit submits job as the session's next call (see [Client.Submit]).
func (s *Session) Submit(ctx context.Context, job wire.Job) (*Execution, error) {
	job.Sandbox, job.SessionID = s.Sandbox, s.ID
	return s.c.Submit(ctx, job)
}

// Run runs job as the session's next call and returns its result (see
// [Client.Run]).
func (s *Session) Run(ctx context.Context, job wire.Job) (*Result, error) {
	job.Sandbox, job.SessionID = s.Sandbox, s.ID
	return s.c.Run(ctx, job)
}

// Close ends the session: its container is retired. Calls after it fail with
// [wire.KindSessionLost]. Closing a session that has ended already (closed, idle,
// lost with its worker) is not an error.
func (s *Session) Close(ctx context.Context) error {
	res, err := s.Run(ctx, wire.Job{SessionClose: true})
	if err != nil {
		return fmt.Errorf("close session %s: %w", s.ID, err)
	}
	if !res.Success && res.ErrorKind != wire.KindSessionLost {
		return fmt.Errorf("close session %s: %s: %s", s.ID, res.ErrorKind, res.Error)
	}
	return nil
}
