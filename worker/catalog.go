package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// SandboxesTTL is how long an entry of the sandbox catalog (wire.SandboxesBucket)
// lives after it was last put. Every worker puts its sandboxes' entries every quarter
// of it, so that a sandbox no worker serves any more leaves the catalog within it.
const SandboxesTTL = time.Hour

// Bounds of a catalog entry, which must fit in one NATS message with room to spare.
const (
	// maxToolDoc, maxSignature and maxToolError are the most bytes of a tool's
	// docstring, of its signature (a default's repr may be long) and of a tool
	// file's error that an entry carries; longer ones are cut (see cut).
	maxToolDoc   = 4 << 10
	maxSignature = 1 << 10
	maxToolError = 1 << 10
	// maxEntryBytes is the most bytes of an entry; a larger one leaves out the
	// docstrings.
	maxEntryBytes = 256 << 10
	// catalogRetry is how soon a put that failed is tried again.
	catalogRetry = 5 * time.Second
)

// catalog keeps the entries of this worker's sandboxes in the fleet's catalog: each
// once its first container is ready (what the harness loaded is what agents may
// call), again when that changes, and every SandboxesTTL/4.
type catalog struct {
	kv        jetstream.KeyValue // wire.SandboxesBucket, set by ensureStreams
	pool      *sandboxpool.Pool
	sandboxes []Sandbox
	workerID  string
	timeout   time.Duration // of a job that sets none
	log       *slog.Logger
	done      sync.WaitGroup
}

// keep puts the entries until ctx ends; stop waits for it.
func (c *catalog) keep(ctx context.Context) {
	c.done.Add(1)
	go func() {
		defer c.done.Done()
		refresh := time.NewTicker(SandboxesTTL / 4)
		defer refresh.Stop()
		for {
			changed := c.pool.ReadyChanged() // before the look, so that no change is missed
			var retry <-chan time.Time
			if err := c.putAll(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("put the sandbox catalog", "err", err)
				retry = time.After(catalogRetry)
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-refresh.C:
			case <-retry:
			}
		}
	}()
}

func (c *catalog) stop() { c.done.Wait() }

// putAll puts the entry of every sandbox that has a ready container.
func (c *catalog) putAll(ctx context.Context) error {
	var errs []error
	for _, sb := range c.sandboxes {
		ready, ok := c.pool.Ready(sb.Name)
		if !ok {
			continue
		}
		data, err := json.Marshal(c.entry(sb, ready, true))
		if err == nil && len(data) > maxEntryBytes {
			data, err = json.Marshal(c.entry(sb, ready, false))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox %q: %w", sb.Name, err))
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = c.kv.Put(pctx, sb.Name, data)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox %q: %w", sb.Name, err))
		}
	}
	return errors.Join(errs...)
}

// entry is the catalog entry of sb whose containers announced ready; docs says
// whether it carries the tools' docstrings.
func (c *catalog) entry(sb Sandbox, ready harness.Ready, docs bool) wire.SandboxInfo {
	info := sb.Info
	info.Sandbox, info.Python, info.WorkerID, info.Updated = sb.Name, ready.Python, c.workerID, time.Now().UTC()
	if info.TimeoutSec == 0 {
		info.TimeoutSec = c.timeout.Seconds()
	}
	info.Tools = make([]wire.ToolSpec, 0, len(ready.ToolSpecs))
	for _, t := range ready.ToolSpecs {
		t.Signature, t.Doc = cut(t.Signature, maxSignature), cut(t.Doc, maxToolDoc)
		if !docs {
			t.Doc = ""
		}
		info.Tools = append(info.Tools, t)
	}
	info.ToolErrors = nil
	for _, e := range ready.ToolErrors {
		info.ToolErrors = append(info.ToolErrors, cut(e.File+": "+e.Error, maxToolError))
	}
	return info
}
