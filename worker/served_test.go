package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestAJobForASandboxNobodyServesIsRefusedAtPublish: the jobs and sessions streams
// take the subjects of the sandboxes the fleet serves and no others, so the agent
// learns at publish that nobody serves its sandbox, with a worker running and with
// none, and nothing is left queued. A sandbox the fleet served lately keeps queueing
// while no worker runs (a restart loses no job), until no live worker has named it
// for the grace.
func TestAJobForASandboxNobodyServesIsRefusedAtPublish(t *testing.T) {
	_, nc := testenv.NATS(t)
	first, _ := testworker.Start(t, nc, testworker.Options{NoPool: true, Sandbox: sandboxpool.Sandbox{PoolSize: 1}, ID: "served-first", Worker: func(c *worker.Config) {
		// A sandbox whose image is "being built": it is served, its jobs queue.
		c.Sandboxes = append(c.Sandboxes, worker.Sandbox{Name: "building", Slots: 1, MaxAckPending: 1, Pending: true})
	}})
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	refused := func(when string, job wire.Job) {
		t.Helper()
		e, err := c.Submit(ctx, job)
		if err == nil {
			e.Close()
			t.Fatalf("%s: a job for sandbox %q (session %q) was taken; want ErrUnknownSandbox", when, job.Sandbox, job.SessionID)
		}
		if !errors.Is(err, client.ErrUnknownSandbox) {
			t.Fatalf("%s: %v; want ErrUnknownSandbox", when, err)
		}
	}
	queued := func(when string, job wire.Job) *client.Execution {
		t.Helper()
		e, err := c.Submit(ctx, job)
		if err != nil {
			t.Fatalf("%s: a job for sandbox %q: %v; want it queued", when, job.Sandbox, err)
		}
		t.Cleanup(e.Close)
		return e
	}
	held := func() uint64 {
		t.Helper()
		s, err := js.Stream(ctx, wire.StreamExec)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	refused("a worker runs", wire.Job{Sandbox: "nosuch", Script: "emit_result(1)"})
	refused("a worker runs", wire.Job{Sandbox: "nosuch", SessionID: "s1", Script: "emit_result(1)"})
	// A literal wildcard names no sandbox: the server finds no stream for it either.
	if _, err := js.Publish(ctx, wire.SubjectPrefixExec+".*", []byte("{}")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("a job on a literal wildcard: %v; want no stream response", err)
	}
	if n := held(); n != 0 {
		t.Fatalf("the jobs stream holds %d messages after the refused jobs; want none", n)
	}
	queued("a worker runs", wire.Job{Sandbox: "building", Script: "emit_result(1)"})

	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := first.Shutdown(sctx, time.Second); err != nil {
		t.Fatal(err)
	}
	refused("no worker runs", wire.Job{Sandbox: "nosuch", Script: "emit_result(1)"})
	waiting := queued("no worker runs", wire.Job{Sandbox: "default", Script: "emit_result('queued while no worker ran')"})
	queued("no worker runs", wire.Job{Sandbox: "building", Script: "emit_result(1)"})

	// A worker that serves "default" only: the job queued meanwhile runs, and
	// "building", which no live worker names, leaves the streams after the grace.
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1}, ID: "served-second", Worker: func(c *worker.Config) { c.UnservedGrace = 2 * time.Second }})
	res, err := waiting.Wait(sctx)
	if err != nil || !res.Success {
		t.Fatalf("the job queued while no worker ran: %+v, %v", res, err)
	}
	testenv.WaitFor(t, 30*time.Second, `sandbox "building" to be refused`, func() bool {
		e, err := c.Submit(ctx, wire.Job{Sandbox: "building", Script: "emit_result(1)"})
		if err == nil {
			e.Close()
			return false
		}
		if !errors.Is(err, client.ErrUnknownSandbox) {
			t.Fatalf("a job for a retired sandbox: %v; want ErrUnknownSandbox", err)
		}
		return true
	})
	refused("after the grace", wire.Job{Sandbox: "building", SessionID: "s2", Script: "emit_result(1)"})
	queued("after the grace", wire.Job{Sandbox: "default", Script: "emit_result(1)"})
}
