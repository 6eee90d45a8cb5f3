package worker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// TestEventsTheStreamCannotTakeForAWhileAreStoredOnceItCan takes the events stream
// away while a job runs and brings it back after the job has ended: the worker keeps
// the job and sends its events again until the stream stores them. The agent sees
// every event of the first and only attempt, those published before the stream went
// away too.
func TestEventsTheStreamCannotTakeForAWhileAreStoredOnceItCan(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	a := newAgent(t, nc)
	ctx := t.Context()
	stream, err := a.js.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	id := newID("outage")
	// The test follows the job on a plain subscription, which the worker's publishes
	// reach with or without a stream: the outage begins once the script has printed and
	// ends once it has ended, whatever the machine's pace.
	live, err := nc.SubscribeSync(wire.EventsWildcard(id))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = live.Unsubscribe() }()
	next := func(typ string) {
		t.Helper()
		for {
			msg, err := live.NextMsg(time.Minute)
			if err != nil {
				t.Fatalf("waiting for the job's %s: %v", typ, err)
			}
			if msg.Subject == wire.EventSubject(id, typ) {
				return
			}
		}
	}
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", TimeoutSec: 30,
		Script: "print('going', flush=True)\nimport time\ntime.sleep(3)\nemit_result('kept')"})
	next(wire.EventStdout)
	if err := a.js.DeleteStream(ctx, wire.StreamEvents); err != nil {
		t.Fatal(err)
	}
	next(wire.EventScriptDone) // the script ended in the outage: its end found no stream
	if _, err := a.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	evs := a.events(id, time.Minute)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
		if ev.Attempt != 1 {
			t.Errorf("%s event of attempt %d: the job was run again instead of its events sent again", ev.Type, ev.Attempt)
		}
	}
	if got, want := strings.Join(types, ","), "started,stdout,final_result,script_done"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
	if done := last(evs); !done.Success {
		t.Errorf("script_done: %+v", done)
	}
}
