package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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
	bg        *background  // where tenants' catalog requests are served
	rates     *tenantRates // each tenant's catalog requests

	listMu   sync.Mutex // guards listed and listedAt
	listed   []byte     // the catalog as last read for a tenant (list)
	listedAt time.Time
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

// Tenants' catalog. A tenant's account does not reach the catalog bucket: its agents
// ask on wire.SubjectSandboxes, which arrives as jazzmine.sandboxes.<tenant>, and one
// worker answers with the catalog's entries, read from the bucket at most once per
// catalogFresh, within the tenant's rate and its share of the background work.
const (
	sandboxesAll   = wire.SubjectSandboxes + ".*"
	groupSandboxes = "jazzmine-sandboxes"
	catalogFresh   = time.Second
	// catalogRate and catalogBurst bound a tenant's catalog requests on a worker: an
	// answer is as large as the catalog (a few KiB; at most maxCatalogAnswer), to a
	// reply subject nobody may read, and an agent asks for it once in a while.
	catalogRate  = 4
	catalogBurst = 8
	// maxCatalogAnswer is the most bytes of an answer (a NATS message is 1 MiB by
	// default): past it the tools' docstrings are left out, and past that again it is
	// an error.
	maxCatalogAnswer = 768 << 10
)

// see is the handler of sandboxesAll: a tenant's catalog request, served in the
// background within the tenant's rate (catalogRate).
func (c *catalog) see(m *nats.Msg) {
	c.bg.serveTenant(m, wire.ParseSandboxesSubject, c.rates, func(ctx context.Context, _ string) *nats.Msg {
		reply := &nats.Msg{Header: nats.Header{wire.HeaderContentType: {wire.ContentTypeJSON}}}
		var err error
		if reply.Data, err = c.list(ctx); err != nil {
			reply.Data = nil
			reply.Header.Set(wire.HeaderError, "the sandbox catalog: "+err.Error())
		}
		return reply
	})
}

// list returns the catalog's entries, sorted by name, as a JSON array: as read from
// the bucket within the last catalogFresh, or read now.
func (c *catalog) list(ctx context.Context) ([]byte, error) {
	c.listMu.Lock()
	defer c.listMu.Unlock()
	if c.listed != nil && time.Since(c.listedAt) < catalogFresh {
		return c.listed, nil
	}
	keys, err := c.kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, err
	}
	slices.Sort(keys)
	infos := []wire.SandboxInfo{}
	for _, key := range keys {
		entry, err := c.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // expired meanwhile
		} else if err != nil {
			return nil, err
		}
		var info wire.SandboxInfo
		if err := json.Unmarshal(entry.Value(), &info); err != nil {
			continue // an entry no worker of this version wrote: the Go client skips it too
		}
		infos = append(infos, info)
	}
	data, err := json.Marshal(infos)
	if err == nil && len(data) > maxCatalogAnswer {
		for i := range infos {
			for j := range infos[i].Tools {
				infos[i].Tools[j].Doc = ""
			}
		}
		if data, err = json.Marshal(infos); err == nil && len(data) > maxCatalogAnswer {
			err = fmt.Errorf("%d bytes, more than an answer holds (%d)", len(data), maxCatalogAnswer)
		}
	}
	if err != nil {
		return nil, err
	}
	c.listed, c.listedAt = data, time.Now()
	return data, nil
}
