package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// SandboxInfo is one sandbox of the fleet's catalog: its tools with their
// signatures and docstrings, and its limits (see [wire.SandboxInfo]).
type SandboxInfo = wire.SandboxInfo

// Sandboxes returns the sandboxes the fleet serves, sorted by name, as the workers
// describe them in the catalog bucket [wire.SandboxesBucket]. A worker puts its
// sandboxes there once their first container is ready, so a sandbox still warming
// up is not listed yet; one no worker serves any more leaves it within an hour. An
// entry that cannot be decoded is logged and left out.
//
// On a fleet with tenant accounts the bucket is in the fleet's account, out of an
// agent's reach: the workers answer its request on [wire.SubjectSandboxes], which the
// client makes first. Where nothing answers it within catalogWait (in the fleet's own
// account nothing does, at once, or the request is not permitted), the client reads
// the bucket. The error wraps [ErrNoStream] when neither a worker nor the bucket is
// there.
func (c *Client) Sandboxes(ctx context.Context) ([]SandboxInfo, error) {
	rctx, cancel := context.WithTimeout(ctx, catalogWait)
	m, err := c.nc.RequestWithContext(rctx, wire.SubjectSandboxes, nil)
	cancel()
	switch {
	case err == nil && m.Header.Get(wire.HeaderError) == wire.Busy:
		return c.askSandboxes(ctx)
	case err == nil:
		return decodeSandboxes(m)
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	kv, err := c.js.KeyValue(ctx, wire.SandboxesBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, errorf(ErrNoStream, "key-value bucket %s not found: is a jazzmine worker running against this NATS server? (%w)", wire.SandboxesBucket, err)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox catalog %s: %w", wire.SandboxesBucket, err)
	}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the sandbox catalog: %w", err)
	}
	slices.Sort(keys)
	var out []SandboxInfo
	for _, key := range keys {
		entry, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // expired meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read sandbox %q of the catalog: %w", key, err)
		}
		var info SandboxInfo
		if err := json.Unmarshal(entry.Value(), &info); err != nil {
			c.log.Warn("jazzmine client: skipped a sandbox catalog entry that cannot be decoded", "key", key, "error", err)
			continue
		}
		out = append(out, info)
	}
	return out, nil
}

// catalogWait is how long Sandboxes waits for the workers' answer before it reads the
// bucket.
const catalogWait = 2 * time.Second

// askSandboxes asks the workers for the catalog, as an agent of a tenant does, again
// while they say busy, within askBudget.
func (c *Client) askSandboxes(ctx context.Context) ([]SandboxInfo, error) {
	m, err := c.ask(ctx, wire.SubjectSandboxes, nil)
	if err != nil {
		return nil, err
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
