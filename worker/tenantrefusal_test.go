package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestASandboxRefusedToTenantsServesOnlyTheFleetsOwnAccount: a fleet that requires
// gVisor for its tenants (worker.require_gvisor: tenants) gives each sandbox under
// another runtime a TenantRefusal. A tenant's job of it, and its session call, end
// with an invalid_job error that says why, never run, and open no session; a job of
// the fleet's own account runs as before.
func TestASandboxRefusedToTenantsServesOnlyTheFleetsOwnAccount(t *testing.T) {
	_, nc := testenv.NATS(t)
	const why = "this fleet runs its tenants' scripts under gVisor only"
	startWorker(t, nc, 1, 0, func(c *worker.Config) { c.Sandboxes[0].TenantRefusal = why })

	// The catalog says so, and a tenant's catalog answer leaves the sandbox out
	// (TestATenantsCatalogAnswerFitsAMessage).
	testenv.WaitFor(t, time.Minute, "the sandbox's catalog entry to say it serves the fleet only", func() bool {
		entry, err := bucket(t, nc, wire.SandboxesBucket).Get(t.Context(), "default")
		return err == nil && strings.Contains(string(entry.Value()), `"fleet_only":true`)
	})

	a := newAgent(t, nc)
	id := newID("own")
	a.submit(wire.ContentTypeJSON, wire.Job{ExecutionID: id, Sandbox: "default", Script: "emit_result(42)"})
	if evs := a.events(id, time.Minute); !last(evs).Success || fmt.Sprint(last(evs).FinalData) != "42" {
		t.Errorf("the fleet's own job: %s", describe(evs))
	}

	for _, job := range []wire.Job{
		{ExecutionID: newID("tenant"), Script: "open('/workspace/ran', 'w').write('x')\nemit_result(1)"},
		{ExecutionID: newID("call"), SessionID: newID("s"), Script: "emit_result(1)"},
	} {
		evs := runTenantJob(t, nc, "alpha", job)
		e := find(evs, wire.EventError)
		if last(evs).Success || e == nil || e.Kind != wire.KindInvalidJob || !strings.Contains(e.Error, why) {
			t.Errorf("a tenant's %s: want an invalid_job error saying %q: %s", job.ExecutionID, why, describe(evs))
		}
		if find(evs, wire.EventStarted) != nil {
			t.Errorf("a tenant's %s ran: %s", job.ExecutionID, describe(evs))
		}
		if job.SessionID == "" {
			continue
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		kv, err := js.KeyValue(ctx, worker.BucketSessions)
		if err == nil {
			_, err = kv.Get(ctx, "alpha."+job.SessionID)
		}
		cancel()
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("the tenant's session %s has an entry (or the look-up failed): %v", job.SessionID, err)
		}
	}
}
