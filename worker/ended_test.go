package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestARedeliveredJobThatAlreadyEndedIsNotRunAgain: a worker runs a job and stores
// its events, but its ack never reaches the server (its NATS user may not ack, as if
// it died or was cut off right after storing them). The job is redelivered to another
// worker, which finds its script_done and acks it without running it again.
func TestARedeliveredJobThatAlreadyEndedIsNotRunAgain(t *testing.T) {
	url := natsWithUsers(t, map[string]*server.Permissions{
		"agent":  nil,
		"no-ack": {Publish: &server.SubjectPermission{Deny: []string{"$JS.ACK.>"}}},
	})
	agentConn, noAck := connectAs(t, url, "agent"), connectAs(t, url, "no-ack")
	quick := func(c *worker.Config) { c.AckWait, c.Heartbeat = 3*time.Second, time.Second }
	first := startWorker(t, noAck, 1, 0, quick)
	a := newAgent(t, agentConn)
	id := newID("acklost")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default",
		Script: "import secrets\nprint('side effect', secrets.token_hex(8))\nemit_result('ran')"})
	if done := last(a.events(id, time.Minute)); !done.Success || done.WorkerID != first.ID() {
		t.Fatalf("the first run: %+v", done)
	}
	// The first worker stops before the job comes back, which only the other may take.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := first.Shutdown(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if n := jobsQueued(t, a.js); n != 1 {
		t.Fatalf("%d jobs in the stream after the first run, want 1: the ack was not lost, the test would prove nothing", n)
	}

	second := startWorker(t, agentConn, 1, 0, quick)
	testenv.WaitFor(t, time.Minute, "the redelivered job to be acked", func() bool { return jobsQueued(t, a.js) == 0 })
	evs := a.allEvents(id)
	if n := count(evs, wire.EventScriptDone); n != 1 {
		t.Errorf("%d script_done events, want 1: %s", n, describe(evs))
	}
	if n := count(evs, wire.EventStarted); n != 1 {
		t.Errorf("the script started %d times, want once: %s", n, describe(evs))
	}
	if n := count(evs, wire.EventStdout); n != 1 {
		t.Errorf("the script's side effect happened %d times, want once: %s", n, describe(evs))
	}
	for _, ev := range evs {
		if ev.Attempt != 1 || ev.WorkerID == second.ID() {
			t.Errorf("a %s event of attempt %d from %s: the redelivery published events", ev.Type, ev.Attempt, ev.WorkerID)
		}
	}
}

// TestAForgedMaxDeliveriesAdvisoryIsIgnored: a plain client publishes the advisory the
// server sends for a job out of deliveries, naming a queued job and a running one.
// Both run to their own result, with one script_done each.
func TestAForgedMaxDeliveriesAdvisoryIsIgnored(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil) // one slot: the second job waits in the queue
	a := newAgent(t, nc)
	running, queued := newID("running"), newID("queued")
	seqs := map[string]uint64{}
	for _, job := range []wire.Job{
		{ExecutionID: running, Sandbox: "default", Script: "print('go', flush=True)\nimport time\ntime.sleep(2)\nemit_result('running')"},
		{ExecutionID: queued, Sandbox: "default", Script: "emit_result('queued')"},
	} {
		data, err := wire.EncodeJob(wire.ContentTypeMsgpack, &job)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: wire.ExecSubject("default"), Data: data, Header: nats.Header{}}
		msg.Header.Set(wire.HeaderMsgID, job.ExecutionID)
		msg.Header.Set(wire.HeaderContentType, wire.ContentTypeMsgpack)
		ack, err := a.js.PublishMsg(t.Context(), msg)
		if err != nil {
			t.Fatal(err)
		}
		seqs[job.ExecutionID] = ack.Sequence
		if job.ExecutionID == running {
			testenv.WaitFor(t, time.Minute, "the first job to run", func() bool { return find(a.allEvents(running), wire.EventStdout) != nil })
		}
	}
	consumer := wire.ConsumerName("default")
	for _, id := range []string{queued, running} {
		adv, _ := json.Marshal(map[string]any{
			"type": "io.nats.jetstream.advisory.v1.max_deliver", "id": newID("adv"), "timestamp": time.Now().UTC(),
			"stream": wire.StreamExec, "consumer": consumer, "stream_seq": seqs[id], "deliveries": worker.DefaultMaxDeliver,
		})
		if err := nc.Publish("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+wire.StreamExec+"."+consumer, adv); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{running, queued} {
		a.events(id, time.Minute)
	}
	testenv.WaitFor(t, 10*time.Second, "both jobs to leave the stream", func() bool { return jobsQueued(t, a.js) == 0 })
	for _, id := range []string{running, queued} {
		evs := a.allEvents(id)
		if n := count(evs, wire.EventScriptDone); n != 1 || !last(evs).Success || find(evs, wire.EventError) != nil {
			t.Errorf("%s: %d script_done, want its own result alone: %s", id, n, describe(evs))
		}
	}
}

// TestJobsOutOfDeliveriesEndOnceTheEventsStreamIsBack: jobs whose worker died on their
// last delivery come back to a worker while the events stream cannot store their end,
// longer than that worker's first try. The worker tries again until it can, and each
// job ends with one script_done, an infrastructure error, and no run.
func TestJobsOutOfDeliveriesEndOnceTheEventsStreamIsBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		// breakStream makes the events stream unable to store the jobs' ends; the
		// function it returns repairs it.
		breakStream func(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) (repair func())
		// failed is what the worker logs for each job once a try failed.
		failed string
		// retried reports whether the end was stored by a later delivery than the
		// first past the last (the first one's try failed), rather than by the
		// first delivery asking again.
		retried bool
	}{
		{"when its subjects are not accepted", func(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) func() {
			broken := cfg
			broken.Subjects = []string{"jazzmine.unavailable.>"}
			if _, err := js.UpdateStream(t.Context(), broken); err != nil {
				t.Fatal(err)
			}
			return func() {
				if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
					t.Fatal(err)
				}
			}
		}, "was not stored", true},
		{"when it is deleted", func(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) func() {
			if err := js.DeleteStream(t.Context(), wire.StreamEvents); err != nil {
				t.Fatal(err)
			}
			return func() {
				if _, err := js.CreateStream(t.Context(), cfg); err != nil {
					t.Fatal(err)
				}
			}
		}, "cannot tell", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, nc := testenv.NATS(t)
			once := func(c *worker.Config) {
				c.MaxDeliver, c.AckWait, c.Heartbeat, c.NakDelay = 1, 3*time.Second, time.Second, 200*time.Millisecond
				c.Sandboxes[0].Slots, c.Sandboxes[0].MaxAckPending = 3, 10 // one delivery each at once; no container is used
			}
			setup := startBareWorker(t, nc, once, nil) // creates the streams and the consumer
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := setup.Shutdown(ctx, time.Second); err != nil {
				t.Fatal(err)
			}
			a := newAgent(t, nc)
			var ids []string
			for i := range 3 {
				id := newID(fmt.Sprintf("lastgone%d", i))
				ids = append(ids, id)
				a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", Script: "emit_result('must not run')"})
			}
			// A worker that takes the jobs and dies: their only delivery is used up.
			cons, err := a.js.Consumer(ctx, wire.StreamExec, wire.ConsumerName("default"))
			if err != nil {
				t.Fatal(err)
			}
			batch, err := cons.Fetch(len(ids), jetstream.FetchMaxWait(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			taken := 0
			for range batch.Messages() {
				taken++
			}
			if taken != len(ids) {
				t.Fatalf("the dying worker took %d jobs, want %d: %v", taken, len(ids), batch.Error())
			}

			logs := &syncWriter{w: &bytes.Buffer{}}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("the worker's log:\n%s", logs.String())
				}
			})
			startBareWorker(t, nc, once, slog.New(slog.NewTextHandler(logs, nil)))
			events, err := a.js.Stream(ctx, wire.StreamEvents)
			if err != nil {
				t.Fatal(err)
			}
			repair := tc.breakStream(t, a.js, events.CachedInfo().Config)
			testenv.WaitFor(t, time.Minute, "a failed try for every job", func() bool {
				for _, id := range ids {
					if !logged(logs.String(), tc.failed, id) {
						return false
					}
				}
				return true
			})
			repair()

			for _, id := range ids {
				a.events(id, time.Minute)
			}
			testenv.WaitFor(t, 10*time.Second, "the jobs to leave the stream", func() bool { return jobsQueued(t, a.js) == 0 })
			for _, id := range ids {
				evs := a.allEvents(id)
				done, e := last(evs), find(evs, wire.EventError)
				if n := count(evs, wire.EventScriptDone); n != 1 || done.Success || e == nil || e.Kind != wire.KindInfrastructure || find(evs, wire.EventStarted) != nil {
					t.Errorf("%s: %d script_done, want one end with an infrastructure error and no run: %s", id, n, describe(evs))
				}
				if tc.retried && done.Attempt < 3 {
					t.Errorf("%s: the end was stored by delivery %d, want a later one than the first past the last (2): %s", id, done.Attempt, describe(evs))
				}
			}
		})
	}
}

// natsWithUsers starts an in-process NATS server with JetStream whose users (password
// "pw") have the given permissions (nil: all), and returns its URL.
func natsWithUsers(t *testing.T, users map[string]*server.Permissions) string {
	t.Helper()
	opts := &server.Options{ServerName: "users", Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true}
	for name, perms := range users {
		opts.Users = append(opts.Users, &server.User{Username: name, Password: "pw", Permissions: perms})
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv.ClientURL()
}

func connectAs(t *testing.T, url, user string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, "pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// startBareWorker starts a worker whose pool is never started: it answers deliveries
// that need no container. logger nil means the default.
func startBareWorker(t *testing.T, nc *nats.Conn, tweak func(*worker.Config), logger *slog.Logger) *worker.Worker {
	t.Helper()
	w, _ := testworker.Start(t, nc, testworker.Options{ID: newID("bare"), Sandbox: sandboxpool.Sandbox{PoolSize: 1}, NoPool: true,
		Worker: func(c *worker.Config) {
			c.Logger = logger
			if tweak != nil {
				tweak(c)
			}
		}})
	return w
}

// jobsQueued is how many jobs the jobs stream holds.
func jobsQueued(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	stream, err := js.Stream(t.Context(), wire.StreamExec)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// logged reports whether a line of the log has both what and the execution id.
func logged(log, what, id string) bool {
	for line := range strings.Lines(log) {
		if strings.Contains(line, what) && strings.Contains(line, id) {
			return true
		}
	}
	return false
}
