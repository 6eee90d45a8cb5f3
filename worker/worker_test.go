package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

func TestAJSONJobFromAPlainNATSClientGetsItsEvents(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 1, nil)
	a := newAgent(t, nc)
	// Exactly what the README shows: a JSON body, two headers.
	body := `{"execution_id":"readme-1","script":"print('hi')\nemit_intermediate('step', {'n': 1})\nemit_log('note', level='warning')\nemit_result({'answer': word_count('a b c')})","metadata":{"session":"s1"}}`
	if err := a.publish("jazzmine.exec.default", []byte(body), map[string]string{"Nats-Msg-Id": "readme-1", "Content-Type": "application/json"}); err != nil {
		t.Fatal(err)
	}
	evs := a.events("readme-1", time.Minute)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
		if ev.Seq != uint64(len(types)) || ev.Attempt != 1 || ev.Metadata["session"] != "s1" || ev.WorkerID == "" {
			t.Errorf("event %s: seq %d attempt %d metadata %v worker %q", ev.Type, ev.Seq, ev.Attempt, ev.Metadata, ev.WorkerID)
		}
	}
	want := []string{"started", "stdout", "intermediate", "log", "final_result", "script_done"}
	if strings.Join(types, ",") != strings.Join(want, ",") {
		t.Errorf("event types = %v, want %v", types, want)
	}
	done := last(evs)
	final, _ := json.Marshal(done.FinalData)
	if !done.Success || string(final) != `{"answer":3}` {
		t.Errorf("script_done: success=%v final=%s error=%q", done.Success, final, done.Error)
	}
	if started := find(evs, wire.EventStarted); started.Sandbox != "default" || len(started.ContainerID) != 12 {
		t.Errorf("started event: %+v", started)
	}
}

func TestInvalidJobsEndInAClearErrorAndTheWorkerKeepsServing(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newAgent(t, nc)
	msgpackJob := func(job wire.Job) []byte {
		b, err := wire.EncodeJob(wire.ContentTypeMsgpack, &job)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name      string
		subject   string
		data      []byte
		headers   map[string]string
		id        string // where the error event is expected; "" when no id is usable
		errSubstr string
	}{
		{"malformed msgpack", "jazzmine.exec.default", []byte{0x85, 0xa1, 'x', 0xc1},
			map[string]string{"Nats-Msg-Id": "bad-msgpack", "Content-Type": "application/msgpack"}, "bad-msgpack", "msgpack"},
		{"malformed JSON", "jazzmine.exec.default", []byte(`{"execution_id": "bad-json", "script": `),
			map[string]string{"Nats-Msg-Id": "bad-json", "Content-Type": "application/json"}, "bad-json", "JSON"},
		{"an unknown content type", "jazzmine.exec.default", []byte(`x`),
			map[string]string{"Nats-Msg-Id": "bad-ct", "Content-Type": "text/yaml"}, "bad-ct", "content type"},
		{"an oversized script", "jazzmine.exec.default", msgpackJob(wire.Job{ExecutionID: "too-big", Script: strings.Repeat("#", wire.DefaultMaxScriptBytes+1)}),
			map[string]string{"Nats-Msg-Id": "too-big", "Content-Type": "application/msgpack"}, "too-big", "script"},
		{"a sandbox in the body that differs from the subject's", "jazzmine.exec.default", msgpackJob(wire.Job{ExecutionID: "wrong-sb", Sandbox: "other", Script: "emit_result(1)"}),
			map[string]string{"Nats-Msg-Id": "wrong-sb", "Content-Type": "application/msgpack"}, "wrong-sb", "sandbox"},
		{"no Nats-Msg-Id header", "jazzmine.exec.default", msgpackJob(wire.Job{ExecutionID: "no-header", Script: "emit_result(1)"}),
			map[string]string{"Content-Type": "application/msgpack"}, "", ""},
		{"a Nats-Msg-Id header that names another execution", "jazzmine.exec.default", msgpackJob(wire.Job{ExecutionID: "body-id", Script: "emit_result(1)"}),
			map[string]string{"Nats-Msg-Id": "header-id", "Content-Type": "application/msgpack"}, "", ""},
		{"an execution id with a dot", "jazzmine.exec.default", msgpackJob(wire.Job{ExecutionID: "a.b", Script: "emit_result(1)"}),
			map[string]string{"Content-Type": "application/msgpack"}, "", ""},
		{"an execution id with '>'", "jazzmine.exec.default", msgpackJob(wire.Job{ExecutionID: "a>", Script: "emit_result(1)"}),
			map[string]string{"Content-Type": "application/msgpack"}, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := a.publish(tc.subject, tc.data, tc.headers); err != nil {
				t.Fatal(err)
			}
			if tc.id == "" {
				return // nothing can be published under such an id; the next job shows the worker lives
			}
			evs := a.events(tc.id, 30*time.Second)
			e := find(evs, wire.EventError)
			if e == nil || e.Kind != wire.KindInvalidJob || !strings.Contains(e.Error, tc.errSubstr) {
				t.Errorf("events %s: want an invalid_job error mentioning %q", describe(evs), tc.errSubstr)
			}
			if done := last(evs); done.Success || done.Error == "" {
				t.Errorf("script_done: %+v", done)
			}
			if find(evs, wire.EventStarted) != nil {
				t.Error("an invalid job was started")
			}
		})
	}
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: "after-bad", Sandbox: "default", Script: "emit_result('still serving')"})
	if done := last(a.events("after-bad", time.Minute)); !done.Success {
		t.Errorf("a valid job after the invalid ones: %+v", done)
	}
}

// TestAnInvalidJobUnderAnotherAgentsIDChangesNothingItReads: a hostile agent publishes
// jobs that name a victim's execution id in their body, under message ids of their
// own, before and after the victim's real job. Reading its events from the stream,
// as the README tells agents to, the victim finds its own events and nothing else.
func TestAnInvalidJobUnderAnotherAgentsIDChangesNothingItReads(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	hostile, victim := newAgent(t, nc), newAgent(t, nc)
	id := newID("victim")
	forge := func(n int) {
		for _, job := range []wire.Job{
			{ExecutionID: id, Script: "emit_result(1)", Mode: "bogus"}, // decodes, fails validation
			{ExecutionID: id, Script: ""},                              // likewise
			{ExecutionID: id, Script: "emit_result('not the victim')"}, // valid, under another message id
		} {
			data, err := wire.EncodeJob(wire.ContentTypeJSON, &job)
			if err != nil {
				t.Fatal(err)
			}
			if err := hostile.publish(wire.ExecSubject("default"), data, map[string]string{wire.HeaderMsgID: newID(fmt.Sprintf("hostile-%d", n)), wire.HeaderContentType: wire.ContentTypeJSON}); err != nil {
				t.Fatal(err)
			}
		}
	}
	forge(1)
	victim.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", Script: "emit_result('mine')"})
	forge(2)
	victim.events(id, time.Minute)
	// Whatever the worker would publish for the hostile jobs has had time to arrive:
	// a job after them has ended.
	after := newID("after")
	victim.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: after, Sandbox: "default", Script: "emit_result(1)"})
	victim.events(after, time.Minute)
	evs := victim.allEvents(id)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	if want := []string{wire.EventStarted, wire.EventFinalResult, wire.EventScriptDone}; !slices.Equal(types, want) || last(evs).FinalData != "mine" {
		t.Errorf("the victim read %s, want only its own %v", describe(evs), want)
	}
}

// TestOutputIsBoundedAndNothingRunsTwiceForIt: a result larger than an event may
// hold, output at the largest limit a job may ask for, and a job asking for more. Each
// ends once, in its first attempt, with an error that says why.
func TestOutputIsBoundedAndNothingRunsTwiceForIt(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newAgent(t, nc)
	for _, tc := range []struct {
		name, script string
		max          int64
		kind, err    string
	}{
		{"a 5 MiB result", "emit_result('x' * (5 << 20))", wire.MaxOutputLimit, wire.KindOutputLimit, "the result is"},
		{"50 MiB printed under the largest limit", "import sys\nfor _ in range(50):\n    sys.stdout.write('y' * (1 << 20))\nemit_result(1)", wire.MaxOutputLimit, wire.KindOutputLimit, "Output limit exceeded"},
		{"50 MiB printed asking for 1 GiB", "import sys\nfor _ in range(50):\n    sys.stdout.write('y' * (1 << 20))\nemit_result(1)", 1 << 30, wire.KindInvalidJob, "max_output_bytes 1073741824 is invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := newID("bound")
			a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", Script: tc.script, MaxOutputBytes: tc.max, TimeoutSec: 60})
			evs := a.events(id, 2*time.Minute)
			e := find(evs, wire.EventError)
			if done := last(evs); done.Success || e == nil || e.Kind != tc.kind || !strings.Contains(e.Error, tc.err) || !strings.Contains(done.Error, tc.err) {
				t.Errorf("want a %s error saying %q: %s", tc.kind, tc.err, describe(evs))
			}
			a.oneAttemptOneEnd(id)
		})
	}
}

func TestAJobPublishedTwiceWithOneMessageIDRunsOnce(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newAgent(t, nc)
	job := wire.Job{ExecutionID: newID("dup"), Sandbox: "default", Script: "print('ran')\nemit_result(1)"}
	a.submit(wire.ContentTypeMsgpack, job)
	a.submit(wire.ContentTypeMsgpack, job)
	a.events(job.ExecutionID, time.Minute)
	// Another job through the same single slot: once it is done, a second run of the
	// first would have shown.
	after := newID("after")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: after, Sandbox: "default", Script: "emit_result(2)"})
	a.events(after, time.Minute)
	evs := a.allEvents(job.ExecutionID)
	if n := count(evs, wire.EventStarted); n != 1 {
		t.Errorf("the job started %d times: %s", n, describe(evs))
	}
	if n := count(evs, wire.EventScriptDone); n != 1 {
		t.Errorf("%d script_done events", n)
	}
}

func TestCancelEndsQueuedAndRunningJobs(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil) // one slot: the second job waits in the queue
	a := newAgent(t, nc)
	running, queued := newID("running"), newID("queued")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: running, Sandbox: "default", Script: "print('sleeping', flush=True)\nimport time\ntime.sleep(60)", TimeoutSec: 120})
	testenv.WaitFor(t, 30*time.Second, "the long job to start", func() bool { return find(a.allEvents(running), wire.EventStdout) != nil })
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: queued, Sandbox: "default", Script: "emit_result('should not run')"})

	if err := nc.Publish(wire.CancelSubject(queued), nil); err != nil {
		t.Fatal(err)
	}
	evs := a.events(queued, 5*time.Second) // "within a second or two"
	if e := find(evs, wire.EventError); e == nil || e.Kind != wire.KindCancelled {
		t.Errorf("queued job: %s, want a cancelled error", describe(evs))
	}
	if err := nc.Publish(wire.CancelSubject(running), nil); err != nil {
		t.Fatal(err)
	}
	evs = a.events(running, 5*time.Second)
	if e := find(evs, wire.EventError); e == nil || e.Kind != wire.KindCancelled {
		t.Errorf("running job: %s, want a cancelled error", describe(evs))
	}
	if done := last(evs); done.Success {
		t.Errorf("a cancelled job succeeded: %+v", done)
	}
	// The queued job, now taken from the queue, is not run, and the slot serves on.
	neverRanAndServesOn(t, a, queued)
}

// neverRanAndServesOn checks that the cancelled job id never started and has one
// script_done, and that the worker runs the next job.
func neverRanAndServesOn(t *testing.T, a *agent, id string) {
	t.Helper()
	next := newID("next")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: next, Sandbox: "default", Script: "emit_result(3)"})
	if done := last(a.events(next, time.Minute)); !done.Success {
		t.Errorf("the job after the cancel: %+v", done)
	}
	if evs := a.allEvents(id); count(evs, wire.EventStarted) != 0 || count(evs, wire.EventScriptDone) != 1 {
		t.Errorf("the cancelled job: %s, want no start and one script_done", describe(evs))
	}
}

// TestACancelWhoseCoordinatorStoppedAfterItsSwapStillEndsTheJob: the coordinator of
// a queued job's cancel swapped its entry to "queued" and stopped before it published
// the job's end (its worker was killed, or the store failed). The worker that takes the
// job runs nothing and publishes that end itself: a cancelled error and one
// script_done, under attempt 0 as the coordinator would have. It acked the job
// silently, and the agent waited for an end that never came.
func TestACancelWhoseCoordinatorStoppedAfterItsSwapStillEndsTheJob(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newAgent(t, nc)
	id := newID("orphaned-cancel")
	recordCancel(t, nc, id, "queued")
	a.submit(wire.ContentTypeJSON, wire.Job{ExecutionID: id, Sandbox: "default", Script: "emit_result('ran')"})
	evs := a.events(id, time.Minute)
	if e := find(evs, wire.EventError); e == nil || e.Kind != wire.KindCancelled || e.Attempt != 0 || last(evs).Success {
		t.Errorf("the job: %s, want a cancelled end under attempt 0", describe(evs))
	}
	neverRanAndServesOn(t, a, id)
}

// recordCancel writes execution key's entry in BucketCancels as state, as the
// coordinator of its cancel has it in the middle of the protocol (worker/cancel.go).
func recordCancel(t *testing.T, nc *nats.Conn, key, state string) {
	t.Helper()
	if _, err := bucket(t, nc, worker.BucketCancels).Create(t.Context(), key, []byte(state)); err != nil {
		t.Fatal(err)
	}
}

// TestACancelOfAJobThatDoesNotExistIsVoid: an agent that cancels an id before its job
// is published (a guess at another's id, or a cancel sent too early) cancels nothing:
// the job published afterwards runs, and no event is published under the id for the
// cancel alone.
func TestACancelOfAJobThatDoesNotExistIsVoid(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newAgent(t, nc)
	id := newID("early")

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cancels, err := js.KeyValue(ctx, worker.BucketCancels)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := cancels.Watch(ctx, id, jetstream.IncludeHistory())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	if err := nc.Publish(wire.CancelSubject(id), nil); err != nil {
		t.Fatal(err)
	}
	// The coordinator records the cancel, finds no job, and forgets it.
	for forgotten := false; !forgotten; {
		select {
		case e := <-watch.Updates():
			forgotten = e != nil && e.Operation() != jetstream.KeyValuePut
		case <-ctx.Done():
			t.Fatal("the cancel of a job that does not exist was not forgotten")
		}
	}
	if evs := a.allEvents(id); len(evs) != 0 {
		t.Errorf("events for a cancel alone: %s", describe(evs))
	}
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", Script: "emit_result('ran')"})
	evs := a.events(id, time.Minute)
	if done := last(evs); !done.Success || count(evs, wire.EventStarted) != 1 {
		t.Errorf("the job published after a void cancel: %s, want it run", describe(evs))
	}
}
