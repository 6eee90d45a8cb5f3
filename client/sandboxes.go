package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/wire"
)

// SandboxInfo is one sandbox of the fleet's catalog: its tools with their
// signatures and docstrings, and its limits (see [wire.SandboxInfo]).
type SandboxInfo = wire.SandboxInfo

// Sandboxes returns the sandboxes the fleet serves, sorted by name, as the workers
// describe them: it asks on [wire.SubjectSandboxes], and a worker answers from the
// catalog (the bucket [wire.SandboxesBucket], in the fleet's account), asking again
// while the workers say busy. A worker puts its sandboxes there as it builds and
// serves them (a sandbox still building says so); one no worker serves any more
// leaves it within an hour. A tenant's agents get the sandboxes they may use; the
// fleet's own account gets every one. The error wraps [ErrNoStream] when no worker
// answers (none is running against this NATS server).
func (c *Client) Sandboxes(ctx context.Context) ([]SandboxInfo, error) {
	m, err := c.ask(ctx, wire.SubjectSandboxes, nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, errorf(ErrNoStream, "no worker answers on %s: is a jazzmine worker running against this NATS server? (%w)", wire.SubjectSandboxes, err)
	}
	if err != nil {
		return nil, fmt.Errorf("ask the workers for the sandbox catalog: %w", err)
	}
	return decodeSandboxes(m)
}

// decodeSandboxes reads the workers' answer with the catalog.
func decodeSandboxes(m *nats.Msg) ([]SandboxInfo, error) {
	if e := m.Header.Get(wire.HeaderError); e != "" {
		return nil, errors.New(e)
	}
	var out []SandboxInfo
	if err := json.Unmarshal(m.Data, &out); err != nil {
		return nil, fmt.Errorf("the workers' sandbox catalog: %w", err)
	}
	return out, nil
}
