package worker_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestMaxAckPendingCapsTheFleet runs two workers with room for eight containers on one
// consumer whose MaxAckPending is 2, and measures from the events how many jobs ran at
// once.
func TestMaxAckPendingCapsTheFleet(t *testing.T) {
	_, nc := testenv.NATS(t)
	cap2 := func(c *worker.Config) { c.Sandboxes[0].MaxAckPending = 2 }
	startWorker(t, nc, 1, 3, cap2)
	startWorker(t, nc, 1, 3, cap2)
	a := newAgent(t, nc)
	var ids []string
	for i := range 12 {
		id := newID(fmt.Sprintf("cap%d", i))
		ids = append(ids, id)
		a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", Script: "import time\ntime.sleep(0.3)\nemit_result(1)"})
	}
	type span struct{ start, end time.Time }
	var spans []span
	workers := map[string]bool{}
	for _, id := range ids {
		evs := a.events(id, 2*time.Minute)
		if !last(evs).Success {
			t.Fatalf("job %s: %s", id, describe(evs))
		}
		spans = append(spans, span{find(evs, wire.EventStarted).Time, last(evs).Time})
		workers[last(evs).WorkerID] = true
	}
	// Sweep the start and end instants to find the most jobs running at one time.
	type point struct {
		at    time.Time
		delta int
	}
	var points []point
	for _, s := range spans {
		points = append(points, point{s.start, +1}, point{s.end, -1})
	}
	sort.Slice(points, func(i, j int) bool {
		if points[i].at.Equal(points[j].at) {
			return points[i].delta < points[j].delta
		}
		return points[i].at.Before(points[j].at)
	})
	running, most := 0, 0
	for _, p := range points {
		running += p.delta
		most = max(most, running)
	}
	if most > 2 {
		t.Errorf("%d jobs ran at once, want at most MaxAckPending = 2", most)
	}
	if most < 2 {
		t.Errorf("at most %d job ran at once: the test did not load the fleet", most)
	}
	t.Logf("most jobs at once: %d, over %d workers", most, len(workers))
}

// TestManyJobsFromConcurrentAgents: 200 jobs from 4 agents, each gets exactly one
// script_done with its own result.
func TestManyJobsFromConcurrentAgents(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 2, 2, nil)
	const agents, perAgent = 4, 50
	var wg sync.WaitGroup
	errs := make(chan error, agents*perAgent)
	for g := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := newAgent(t, nc)
			ct := wire.ContentTypeMsgpack
			if g%2 == 1 {
				ct = wire.ContentTypeJSON
			}
			var ids []string
			for i := range perAgent {
				id := fmt.Sprintf("agent%d-job%d-%d", g, i, time.Now().UnixNano()%100000)
				ids = append(ids, id)
				data, _ := wire.EncodeJob(ct, &wire.Job{ExecutionID: id, Script: fmt.Sprintf("emit_result({'agent': %d, 'job': %d})", g, i)})
				if err := a.publish(wire.ExecSubject("default"), data, map[string]string{wire.HeaderMsgID: id, wire.HeaderContentType: ct}); err != nil {
					errs <- err
					return
				}
			}
			for i, id := range ids {
				evs, err := a.tryEvents(id, 2*time.Minute)
				if err != nil {
					errs <- fmt.Errorf("%s: %v", id, err)
					continue
				}
				got, _ := json.Marshal(last(evs).FinalData)
				if want := fmt.Sprintf(`{"agent":%d,"job":%d}`, g, i); !last(evs).Success || string(got) != want {
					errs <- fmt.Errorf("%s: result %s, want %s", id, got, want)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Exactly one script_done each: read them all back now that every job is done.
	a := newAgent(t, nc)
	stream, err := a.js.Stream(t.Context(), wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(t.Context(), jetstreamSubjects(wire.AllEventsWildcard))
	if err != nil {
		t.Fatal(err)
	}
	dones := 0
	for subject, n := range info.State.Subjects {
		if len(subject) > len(".script_done") && subject[len(subject)-len(".script_done"):] == ".script_done" {
			dones++
			if n != 1 {
				t.Errorf("%s: %d script_done events", subject, n)
			}
		}
	}
	if dones != agents*perAgent {
		t.Errorf("%d executions have a script_done, want %d", dones, agents*perAgent)
	}
}

// TestATenantBacklogBoundNeverDeletesQueuedJobs: a fleet lowers the jobs stream's
// bound per tenant and sandbox (tenant_backlog) while a subject holds more queued
// jobs than the new bound. The server would make room by deleting the oldest, jobs
// it had accepted; the worker keeps the old bound until the backlog is below, and
// every job runs. A later start lowers it.
func TestATenantBacklogBoundNeverDeletesQueuedJobs(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, func(c *worker.Config) { c.TenantBacklog = -1 })
	a := newAgent(t, nc)
	var ids []string
	for i := range 6 {
		id := newID(fmt.Sprintf("kept%d", i))
		ids = append(ids, id)
		script := "emit_result(1)"
		if i == 0 {
			script = "import time\ntime.sleep(3)\nemit_result(1)" // holds the one slot
		}
		a.submit(wire.ContentTypeJSON, wire.Job{ExecutionID: id, Sandbox: "default", Script: script})
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	perSubject := func() int64 {
		t.Helper()
		stream, err := js.Stream(t.Context(), wire.StreamExec)
		if err != nil {
			t.Fatal(err)
		}
		return stream.CachedInfo().Config.MaxMsgsPerSubject
	}
	lower := func(c *worker.Config) { c.TenantBacklog = 2 }
	startWorker(t, nc, 1, 0, lower) // while 4 or 5 jobs wait
	if got := perSubject(); got == 2 {
		t.Errorf("the bound per subject was lowered to 2 over a backlog above it")
	}
	for _, id := range ids {
		if evs := a.events(id, 2*time.Minute); !last(evs).Success {
			t.Errorf("queued job %s: %s", id, describe(evs))
		}
	}
	startWorker(t, nc, 1, 0, lower)
	if got := perSubject(); got != 2 {
		t.Fatalf("with the backlog gone, the bound per subject is %d, want 2", got)
	}
}
