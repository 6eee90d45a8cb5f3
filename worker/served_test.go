package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/fakeengine"
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
	orphans := []*client.Execution{queued("a worker runs", wire.Job{Sandbox: "building", Script: "emit_result(1)"})}

	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := first.Shutdown(sctx, time.Second); err != nil {
		t.Fatal(err)
	}
	refused("no worker runs", wire.Job{Sandbox: "nosuch", Script: "emit_result(1)"})
	waiting := queued("no worker runs", wire.Job{Sandbox: "default", Script: "emit_result('queued while no worker ran')"})
	orphans = append(orphans, queued("no worker runs", wire.Job{Sandbox: "building", Script: "emit_result(1)"}))

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
	// The jobs it still held end, rather than wait for good and hold backlog room.
	for _, e := range orphans {
		res, err := e.Wait(sctx)
		if err != nil || res.Success || res.ErrorKind != wire.KindInvalidJob || !strings.Contains(res.Error, `unknown sandbox "building"`) {
			t.Errorf("a job queued for the retired sandbox: %+v, %v; want invalid_job, unknown sandbox", res, err)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "the retired sandbox's jobs to leave the stream", func() bool {
		s, err := js.Stream(ctx, wire.StreamExec)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
		return err == nil && info.State.Subjects["jazzmine.exec.building"] == 0
	})
}

// TestWorkersServingDifferentSandboxesStartAtOnceAndEachIsTaken: workers, each with
// sandboxes of its own, start together on a server with no streams yet, then again
// on the streams they made. Each start succeeds, and once it has, the streams take
// every worker's sandboxes: JetStream replaces a stream's config whole, and changes
// made at once without the fleet's lock lost each other's subjects (a review's run:
// 8 workers restarting 5 times, two sandboxes refused until a later beat; on a fresh
// server, half the starts failed with "stream name already in use").
func TestWorkersServingDifferentSandboxesStartAtOnceAndEachIsTaken(t *testing.T) {
	_, nc := testenv.NATS(t)
	const n = 6
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		var wg sync.WaitGroup
		errs := make([]error, n)
		workers := make([]*worker.Worker, n)
		for i := range n {
			pool, err := sandboxpool.New(sandboxpool.Config{Docker: &fakeengine.Engine{}, WorkerID: fmt.Sprintf("w%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			workers[i], err = worker.New(worker.Config{NATS: nc, Pool: pool, Logger: slog.New(slog.DiscardHandler),
				Sandboxes: []worker.Sandbox{{Name: fmt.Sprintf("sb%d", i), Slots: 1, Pending: true}}})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { errs[i] = workers[i].Start(t.Context()) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: worker %d's start: %v", round, i, err)
			}
		}
		for _, name := range []string{wire.StreamExec, wire.StreamSessions} {
			s, err := js.Stream(t.Context(), name)
			if err != nil {
				t.Fatal(err)
			}
			subjects := s.CachedInfo().Config.Subjects
			format := map[string]string{wire.StreamExec: "jazzmine.exec.*.sb%d", wire.StreamSessions: "jazzmine.session.*.sb%d.*"}[name]
			for i := range n {
				if !slices.Contains(subjects, fmt.Sprintf(format, i)) {
					t.Errorf("round %d: stream %s does not take sandbox sb%d: %v", round, name, i, subjects)
				}
			}
		}
		for _, w := range workers {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := w.Shutdown(ctx, time.Second); err != nil {
				t.Error(err)
			}
			cancel()
		}
	}
}

// TestAWorkerOfAnEarlierVersionKeepsTheWildcardSubjects: an earlier version's workers
// took every job on jazzmine.exec.> and answered those of unknown sandboxes. While
// one of them is alive (its liveness entry names no sandbox), a worker of this
// version leaves the streams' subjects as they are, so that the sandboxes only it
// serves are not refused; once it is gone, the subjects become the served sandboxes'.
func TestAWorkerOfAnEarlierVersionKeepsTheWildcardSubjects(t *testing.T) {
	_, nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.StreamExec, Subjects: []string{wire.SubjectPrefixExec + ".>"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: worker.BucketWorkers, TTL: worker.DefaultLivenessTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "old-worker", []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
	testworker.Start(t, nc, testworker.Options{NoPool: true, Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: func(c *worker.Config) { c.LivenessTTL = 3 * time.Second }})
	subjects := func() []string {
		s, err := js.Stream(ctx, wire.StreamExec)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.Subjects
	}
	if got := subjects(); !slices.Equal(got, []string{wire.SubjectPrefixExec + ".>"}) {
		t.Fatalf("with a worker of an earlier version alive, the jobs stream takes %v; want its wildcard kept", got)
	}
	if err := kv.Delete(ctx, "old-worker"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the subjects to become the served sandbox's", func() bool {
		return slices.Equal(subjects(), []string{"jazzmine.exec.*.default", "jazzmine.exec.default"})
	})
}
