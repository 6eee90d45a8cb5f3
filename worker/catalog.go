package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

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
	kv        jetstream.KeyValue // wire.SandboxesBucket
	pool      *sandboxpool.Pool
	gates     *gates // which sandboxes serve (the others' images are being built, or failed)
	sandboxes []Sandbox
	workerID  string
	timeout   time.Duration // of a job that sets none
	log       *slog.Logger
	done      sync.WaitGroup
	bg        *background  // where tenants' catalog requests are served
	rates     *tenantRates // each tenant's catalog requests

	// toolErrors are the tool errors last logged, by sandbox (logToolErrors); only
	// the loop of keep reads and writes it.
	toolErrors map[string]string

	viewMu   sync.Mutex              // guards view, viewed, listed and listedAt
	view     map[string]catalogEntry // the bucket's entries, as watched (watch)
	viewed   bool                    // the watch has brought every entry there was
	listed   [2][]byte               // view as a tenant's answer and the fleet's (list)
	listedAt [2]time.Time
}

// catalogEntry is an entry of the bucket as watched, and when it was put.
type catalogEntry struct {
	info wire.SandboxInfo
	put  time.Time
}

// start puts the entries, and watches the bucket for tenants' requests (watch), until
// run ends; stop waits for it.
func (c *catalog) start(_, run context.Context) error {
	c.keep(run)
	return nil
}

func (c *catalog) keep(ctx context.Context) {
	c.done.Add(2)
	go func() {
		defer c.done.Done()
		c.watch(ctx)
	}()
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
			case <-c.gates.changed:
			case <-refresh.C:
			case <-retry:
			}
		}
	}()
}

func (c *catalog) stop(context.Context) { c.done.Wait() }

// putAll puts the entry of every sandbox that has a ready container, and of every
// sandbox this worker does not serve yet: building, or failed (putUnserved).
func (c *catalog) putAll(ctx context.Context) error {
	var errs []error
	for _, sb := range c.sandboxes {
		why, failed := c.gates.failure(sb.Name)
		if failed || !c.gates.serving(sb.Name) {
			if err := c.putUnserved(ctx, sb, why); err != nil {
				errs = append(errs, fmt.Errorf("sandbox %q: %w", sb.Name, err))
			}
			continue
		}
		ready, ok := c.pool.Ready(sb.Name)
		if !ok {
			// Served, with no container yet (none warm): an entry of this worker
			// that said it was building or failed goes; the next ready container
			// puts the sandbox's.
			if err := c.dropUnserved(ctx, sb.Name); err != nil {
				errs = append(errs, fmt.Errorf("sandbox %q: %w", sb.Name, err))
			}
			continue
		}
		c.logToolErrors(sb.Name, ready.ToolErrors)
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

// logToolErrors logs, at error level, each tool file (or preloaded module) of the
// sandbox that failed to load in its newest container, when they differ from those
// logged before: scripts would meet only a NameError, and the operator nothing.
func (c *catalog) logToolErrors(sandbox string, errs []harness.ToolError) {
	var key strings.Builder
	for _, e := range errs {
		key.WriteString(e.File + "\x00" + e.Error + "\x00")
	}
	if c.toolErrors[sandbox] == key.String() {
		return
	}
	c.toolErrors[sandbox] = key.String()
	for _, e := range errs {
		c.log.Error("a tool failed to load: scripts of the sandbox do not have what it defines", "sandbox", sandbox, "file", e.File, "err", e.Error)
	}
}

// putUnserved puts the entry of a sandbox this worker does not serve: why it cannot
// (a failure), or, why empty, that its image is being built. It leaves an entry a
// worker that serves the sandbox put lately (every worker puts its entries every
// SandboxesTTL/4), which replaces this one when it is put again (the bucket has one
// entry a sandbox). An entry of a worker that no longer puts it (it stopped, or
// failed), this worker's own, or one of a sandbox not served, is replaced.
func (c *catalog) putUnserved(ctx context.Context, sb Sandbox, why string) error {
	info := sb.Info
	info.Sandbox, info.Error, info.WorkerID, info.Updated = sb.Name, cut(why, maxToolError), c.workerID, time.Now().UTC()
	info.Building = why == ""
	info.FleetOnly = sb.TenantRefusal != ""
	info.Tools = []wire.ToolSpec{}
	if info.TimeoutSec == 0 {
		info.TimeoutSec = c.timeout.Seconds()
	}
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	entry, err := c.kv.Get(pctx, sb.Name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		if _, err = c.kv.Create(pctx, sb.Name, data); errors.Is(err, jetstream.ErrKeyExists) {
			return nil // another worker put it meanwhile
		}
		return err
	}
	if err != nil {
		return err
	}
	var put wire.SandboxInfo
	if json.Unmarshal(entry.Value(), &put) == nil && put.WorkerID != c.workerID && put.Error == "" && !put.Building &&
		time.Since(entry.Created()) < SandboxesTTL/4+time.Minute {
		return nil
	}
	if _, err = c.kv.Update(pctx, sb.Name, data, entry.Revision()); errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil // another worker put it meanwhile
	}
	return err
}

// dropUnserved deletes the sandbox's entry if this worker put it while it did not
// serve the sandbox (putUnserved).
func (c *catalog) dropUnserved(ctx context.Context, sandbox string) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	entry, err := c.kv.Get(pctx, sandbox)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var put wire.SandboxInfo
	if json.Unmarshal(entry.Value(), &put) != nil || put.WorkerID != c.workerID || (put.Error == "" && !put.Building) {
		return nil
	}
	if err = c.kv.Delete(pctx, sandbox, jetstream.LastRevision(entry.Revision())); errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil // another worker put it meanwhile
	}
	return err
}

// entry is the catalog entry of sb whose containers announced ready; docs says
// whether it carries the tools' docstrings.
func (c *catalog) entry(sb Sandbox, ready harness.Ready, docs bool) wire.SandboxInfo {
	info := sb.Info
	info.Sandbox, info.Python, info.WorkerID, info.Updated = sb.Name, ready.Python, c.workerID, time.Now().UTC()
	info.FleetOnly = sb.TenantRefusal != ""
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

// The catalog's one read path: agents ask on wire.SubjectSandboxes and one worker
// answers with the catalog's entries. A tenant's account does not reach the catalog
// bucket: its request arrives as jazzmine.sandboxes.<tenant>, answered within the
// tenant's rate and its share of the background work; the fleet's own account's is
// answered at once. A worker keeps a view of the bucket, watched, so that no
// request reads it: a read that stalled held the requests' background slots, and the
// other tenants' cancels and chunks waited.
const (
	sandboxesAll   = wire.SubjectSandboxes + ".*"
	groupSandboxes = "jazzmine-sandboxes"
	// catalogRate and catalogBurst bound a tenant's catalog requests on a worker: an
	// answer is as large as the catalog (a few KiB; at most maxCatalogAnswer), to a
	// reply subject nobody may read, and an agent asks for it once in a while.
	catalogRate  = 4
	catalogBurst = 8
	// maxCatalogAnswer is the most bytes of an answer (a NATS message is 1 MiB by
	// default): past it the tools' docstrings are left out, and past that again it is
	// an error.
	maxCatalogAnswer = 768 << 10
	// watchRetry is how soon a watch of the bucket that ended is made again.
	watchRetry = 5 * time.Second
	// listFresh is how long an answer is kept, unless the view changes: entries that
	// aged out of the bucket leave it.
	listFresh = time.Minute
)

// watch keeps c.view as the bucket's entries until ctx ends. An entry the bucket's
// TTL removed sends no update: list leaves out those put longer ago than the TTL.
func (c *catalog) watch(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := c.kv.WatchAll(ctx)
		if err == nil {
			for entry := range w.Updates() {
				if entry != nil {
					c.fold(entry)
					continue
				}
				c.viewMu.Lock()
				c.viewed = true // every entry there was has come
				c.viewMu.Unlock()
			}
			_ = w.Stop()
		} else if ctx.Err() == nil {
			c.log.Warn("watch the sandbox catalog", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(watchRetry):
		}
	}
}

// fold folds an update of the bucket into the view.
func (c *catalog) fold(entry jetstream.KeyValueEntry) {
	c.viewMu.Lock()
	defer c.viewMu.Unlock()
	if c.view == nil {
		c.view = map[string]catalogEntry{}
	}
	c.listed = [2][]byte{}
	var info wire.SandboxInfo
	if entry.Operation() != jetstream.KeyValuePut || json.Unmarshal(entry.Value(), &info) != nil {
		delete(c.view, entry.Key()) // deleted, purged, or no entry a worker of this version wrote
		return
	}
	c.view[entry.Key()] = catalogEntry{info: info, put: entry.Created()}
}

// serveTenants is the handler of sandboxesAll: a tenant's catalog request, served in
// the background within the tenant's rate (catalogRate).
func (c *catalog) serveTenants(m *nats.Msg) {
	c.bg.serveTenant(m, wire.ParseSandboxesSubject, c.rates, func(context.Context, string) *nats.Msg {
		return c.answer(false)
	})
}

// serveFleet is the handler of wire.SubjectSandboxes in the fleet's own account: the
// whole catalog, answered at once from the view.
func (c *catalog) serveFleet(m *nats.Msg) {
	if m.Reply != "" {
		_ = m.RespondMsg(c.answer(true))
	}
}

// answer is a catalog request's answer: the catalog as a tenant sees it, or all of
// it for the fleet's own account (fleet).
func (c *catalog) answer(fleet bool) *nats.Msg {
	c.viewMu.Lock()
	viewed := c.viewed
	c.viewMu.Unlock()
	if !viewed { // a starting worker: not an empty catalog, but asked again
		return &nats.Msg{Header: busyHeader}
	}
	reply := &nats.Msg{Header: nats.Header{wire.HeaderContentType: {wire.ContentTypeJSON}}}
	var err error
	if reply.Data, err = c.list(fleet); err != nil {
		reply.Data = nil
		reply.Header.Set(wire.HeaderError, "the sandbox catalog: "+err.Error())
	}
	return reply
}

// list returns the view's entries put within the bucket's TTL, sorted by name, as a
// JSON array, made again after a change or listFresh: those a tenant may use, or
// every one for the fleet (fleet).
func (c *catalog) list(fleet bool) ([]byte, error) {
	c.viewMu.Lock()
	defer c.viewMu.Unlock()
	k := 0
	if fleet {
		k = 1
	}
	if c.listed[k] != nil && time.Since(c.listedAt[k]) < listFresh {
		return c.listed[k], nil
	}
	infos := []wire.SandboxInfo{}
	for _, e := range c.view {
		if time.Since(e.put) < SandboxesTTL && (fleet || !e.info.FleetOnly) {
			infos = append(infos, e.info)
		}
	}
	slices.SortFunc(infos, func(a, b wire.SandboxInfo) int { return strings.Compare(a.Sandbox, b.Sandbox) })
	data, err := json.Marshal(infos)
	if err == nil && len(data) > maxCatalogAnswer {
		for i := range infos {
			infos[i].Tools = slices.Clone(infos[i].Tools)
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
	c.listed[k], c.listedAt[k] = data, time.Now()
	return data, nil
}
