package worker_test

import (
	"context"
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// Attacks on the routing of session calls (opener.go, rescuer.go), from a review of an
// earlier version, whose opener held a session's last call to answer for the calls
// before it: each lost calls on the first version of that rule. A call "has no end" when the events stream holds no
// script_done of it: its agent waits for ever.

// publishCalls publishes n calls of the session with script, as raw messages, and
// returns their ids.
func publishCalls(t *testing.T, js jetstream.JetStream, sessionID string, n int, script string) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = client.NewExecutionID()
		publishCall(t, js, sessionID, ids[i], script)
	}
	return ids
}

// publishCall publishes a call of the session with execution id id.
func publishCall(t *testing.T, js jetstream.JetStream, sessionID, id, script string) {
	t.Helper()
	if err := tryCall(t, js, sessionID, id, script); err != nil {
		t.Fatal(err)
	}
}

// tryCall publishes a call of the session with execution id id, and returns the
// publish's error.
func tryCall(t *testing.T, js jetstream.JetStream, sessionID, id, script string) error {
	t.Helper()
	return tryCallOf(t, js, "default", sessionID, id, script)
}

// tryCallOf is tryCall for a session of sandbox.
func tryCallOf(t *testing.T, js jetstream.JetStream, sandbox, sessionID, id, script string) error {
	t.Helper()
	data, err := wire.EncodeJob(wire.ContentTypeJSON, &wire.Job{ExecutionID: id, Sandbox: sandbox, SessionID: sessionID, Mode: wire.ModeInteractive, Script: script})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(wire.SessionSubject(sandbox, sessionID))
	m.Header.Set(wire.HeaderMsgID, id)
	m.Header.Set(wire.HeaderContentType, wire.ContentTypeJSON)
	m.Data = data
	_, err = js.PublishMsg(t.Context(), m)
	return err
}

// fleetEvents returns the events stream, and a context of 10 s to read it with.
func fleetEvents(t *testing.T, js jetstream.JetStream) (jetstream.Stream, context.Context, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	stream, err := js.Stream(ctx, wire.StreamEvents)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	return stream, ctx, cancel
}

// hasEnd reports whether the execution has a script_done in the events stream.
func hasEnd(t *testing.T, js jetstream.JetStream, id string) bool {
	t.Helper()
	stream, ctx, cancel := fleetEvents(t, js)
	defer cancel()
	_, err := stream.GetLastMsgForSubject(ctx, wire.EventSubject(id, wire.EventScriptDone))
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// waitForEnds waits up to within for every execution of ids to have its end, and
// fails the test with how many have none.
func waitForEnds(t *testing.T, js jetstream.JetStream, ids []string, within time.Duration, what string) {
	t.Helper()
	next := 0 // ids before it have their end
	for deadline := time.Now().Add(within); ; time.Sleep(time.Second) {
		for next < len(ids) && hasEnd(t, js, ids[next]) {
			next++
		}
		if next == len(ids) {
			return
		}
		if time.Now().After(deadline) {
			missing := 0
			for _, id := range ids[next:] {
				if !hasEnd(t, js, id) {
					missing++
				}
			}
			t.Fatalf("%s: %d of %d calls have no end after %v", what, missing, len(ids), within)
		}
	}
}

// processToKill starts a worker in a process of its own, to be killed, on a server
// of the test's own.
func processToKill(t *testing.T, name string) (*workerProcess, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv, nc := testenv.NATS(t)
	testenv.SandboxImage(t)
	w := startProcess(t, writeConfig(t, ""), srv.ClientURL(), newID(name))
	w.serving(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return w, nc, js
}

// TestOpenerAnEndCutShortIsFinishedByAnother: a session closes with 3,000 calls
// queued behind the close. The opener acked all but the one it holds; the owner's
// end answers them one at a time, and the owner is killed in the middle. The
// opener, holding the last call, finishes the end: every call gets its end (with
// the first version, 2,986 of 3,000 had none).
func TestOpenerAnEndCutShortIsFinishedByAnother(t *testing.T) {
	w, nc, js := processToKill(t, "cutshort")
	s := newSessionClient(t, nc).NewSession("default")
	mustSucceed(t, call(t, s, "x = 1"))
	closing, err := s.Submit(t.Context(), wire.Job{Mode: wire.ModeInteractive, Script: "import time\ntime.sleep(10)", SessionClose: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := publishCalls(t, js, s.ID, 3000, "emit_result(2)")
	mustSucceed(t, waitWithin(t, closing, time.Minute))
	testenv.WaitFor(t, 30*time.Second, "the owner's end to answer the first call", func() bool { return hasEnd(t, js, ids[0]) })
	if err := w.cmd.Process.Kill(); err != nil { // SIGKILL, in the middle of the answers
		t.Fatal(err)
	}
	_ = w.cmd.Wait()
	startWorker(t, nc, 1, 0, nil)
	waitForEnds(t, js, ids, 3*time.Minute, "calls queued behind a close whose worker died during the end")
}

// TestOpenerASessionThatFailsToOpenLeavesNoCall: the two workers' containers are
// busy. A session's first three calls come back to back: one worker claims the
// session on one of them and waits for a container until its ack wait; the other
// worker's opener holds the others meanwhile. The session could not be opened: each
// call gets its end (with the first version, a call the opener had acked on a later
// one had none).
func TestOpenerASessionThatFailsToOpenLeavesNoCall(t *testing.T) {
	_, nc := testenv.NATS(t)
	tweak := func(c *worker.Config) {
		c.AckWait, c.Heartbeat = 4*time.Second, time.Second
		c.Sandboxes[0].MaxAckPending = 4
	}
	for range 2 {
		testworker.Start(t, nc, testworker.Options{ID: newID("full"), Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: tweak})
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := newSessionClient(t, nc)
	for range 2 {
		e, err := c.Submit(t.Context(), wire.Job{Sandbox: "default", Script: "import time\ntime.sleep(25)", TimeoutSec: 60})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { waitWithin(t, e, time.Minute) })
	}
	time.Sleep(3 * time.Second) // both containers taken
	ids := publishCalls(t, js, c.NewSession("default").ID, 3, "emit_result(1)")
	waitForEnds(t, js, ids, 90*time.Second, "calls of a session that could not be opened")
}

// TestOpenerALastCallWithAFinishedIDHoldsTheSession: an agent's last call of a
// session carries the id of an execution that has its end already (a stateless job's
// here; a retry of an earlier call past the dedup window is the same). Nothing may
// take that end for the session's: the owner dies while a call runs, and that call
// and the one queued behind it get session_lost (with the first version of the
// opener's holding, neither had an end). The opener routes every call once and
// holds none: the owner's consumer has them, and the rescuer answers them.
func TestOpenerALastCallWithAFinishedIDHoldsTheSession(t *testing.T) {
	w, nc, js := processToKill(t, "finished")
	c := newSessionClient(t, nc)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	done, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: "emit_result(0)"})
	if err != nil || !done.Success {
		t.Fatalf("stateless job: %v %s", err, describeRes(done))
	}
	s := c.NewSession("default")
	mustSucceed(t, call(t, s, "x = 1"))
	running := submitCall(t, s, "import time\ntime.sleep(600)")
	queued := submitCall(t, s, "emit_result(x)")
	publishCall(t, js, s.ID, done.ExecutionID, "emit_result(3)")
	if pending, held := openerSettles(t, js, 0); pending != 0 || held != 0 {
		t.Errorf("the opener holds %d calls (%d not yet seen), want none", held, pending)
	}
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = w.cmd.Wait()
	startWorker(t, nc, 1, 0, nil)
	for name, e := range map[string]*client.Execution{"running": running, "queued": queued} {
		if res := waitWithin(t, e, time.Minute); res == nil || res.ErrorKind != wire.KindSessionLost {
			t.Errorf("the %s call of a dead worker's session: %s, want session_lost", name, describeRes(res))
		}
	}
}

// TestOpenerCallsOfSessionsNoWorkerHasRoomForAllGetTheirEnd: two workers with no room
// for any session, and 20 sessions of 6 calls each. Calls of one session reach their
// last delivery on both workers at once; the worker that lost the race to end the
// session acked its call with no answer (a review's attack: 15 of 120 had no end).
func TestOpenerCallsOfSessionsNoWorkerHasRoomForAllGetTheirEnd(t *testing.T) {
	_, nc := testenv.NATS(t)
	full := func(c *worker.Config) { c.Sandboxes[0].MaxSessions = -1 }
	for range 2 {
		testworker.Start(t, nc, testworker.Options{ID: newID("noroom"), NoPool: true, Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: full})
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := newSessionClient(t, nc)
	var ids []string
	for range 20 {
		ids = append(ids, publishCalls(t, js, c.NewSession("default").ID, 6, "pass")...)
	}
	waitForEnds(t, js, ids, time.Minute, "calls of sessions no worker had room for")
}

// TestOpenerAFloodOfCallsDropsNoOtherSessionsCall: a session's calls wait behind a
// slow one while another agent floods its own session with calls. The sessions
// stream kept every call and, full, dropped the oldest: the waiting calls of the
// first session, which then had no end (a review's attack: 3 of 3). Now it holds only
// the calls that wait, refuses a call beyond its bounds (one session's included), and
// the first session's calls run.
func TestOpenerAFloodOfCallsDropsNoOtherSessionsCall(t *testing.T) {
	_, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 1}, Worker: func(c *worker.Config) { c.MaxBacklog, c.TenantBacklog = 40, 20 }})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := newSessionClient(t, nc)
	victim := c.NewSession("default")
	mustSucceed(t, call(t, victim, "x = 1"))
	slow := submitCall(t, victim, "import time\ntime.sleep(8)")
	waiting := publishCalls(t, js, victim.ID, 3, "emit_result(x)")
	flood, refused := c.NewSession("default").ID, 0
	for range 45 {
		if err := tryCall(t, js, flood, client.NewExecutionID(), "pass"); err != nil {
			refused++
		}
	}
	if refused == 0 {
		t.Errorf("45 calls of one session were all taken, past its bound of 20")
	}
	mustSucceed(t, waitWithin(t, slow, time.Minute))
	waitForEnds(t, js, waiting, time.Minute, "a session's waiting calls after another session's flood")
}

// TestOpenerCallsOfASandboxNobodyServesHoldNoRoom: an agent sends calls to a sandbox
// no worker serves, one new session each. They were answered (invalid_job) and kept
// until the stream's max age: once the stream refused calls when full, 40 of them
// refused every session's calls (a review's attack). The sessions stream takes the
// served sandboxes' subjects only: each is refused at publish, and none holds room.
func TestOpenerCallsOfASandboxNobodyServesHoldNoRoom(t *testing.T) {
	_, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: func(c *worker.Config) { c.MaxBacklog, c.TenantBacklog = 40, 20 }})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if err := tryCallOf(t, js, "nobody", client.NewExecutionID(), client.NewExecutionID(), "pass"); !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Fatalf("call %d of sandbox nobody: %v; want no stream response", i+1, err)
		}
	}
	stream, err := js.Stream(t.Context(), wire.StreamSessions)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := stream.Info(t.Context()); err != nil || info.State.Msgs != 0 {
		t.Fatalf("the sessions stream: %+v, %v; want no call held", info, err)
	}
	s := newSessionClient(t, nc).NewSession("default")
	mustSucceed(t, call(t, s, "emit_result(1)"))
}

// TestOpenerAFullStreamOfAnEarlierVersionRefusesNoCall: an earlier version's sessions
// stream kept every call, run or not, and dropped the oldest when full. Made to
// refuse calls when full, it refused every call until they aged out (a review's
// attack): it keeps dropping the oldest while more than half full.
func TestOpenerAFullStreamOfAnEarlierVersionRefusesNoCall(t *testing.T) {
	_, nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.StreamSessions, Subjects: []string{wire.SessionWildcard}, MaxAge: 2 * time.Hour, MaxMsgs: 40, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for range 60 { // the earlier fleet ran them; the stream kept the last 40
		publishCall(t, js, client.NewExecutionID(), client.NewExecutionID(), "pass")
	}
	// The earlier fleet's opener had seen them all.
	if _, err := js.CreateConsumer(ctx, wire.StreamSessions, jetstream.ConsumerConfig{Durable: wire.SessionOpenerName("default"), FilterSubject: "jazzmine.session.default.*", DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: func(c *worker.Config) { c.MaxBacklog, c.TenantBacklog = 40, 20 }})
	s := newSessionClient(t, nc).NewSession("default")
	mustSucceed(t, call(t, s, "emit_result(1)"))
}

// TestOpenerAnOwnerTakenForDeadFreesItsContainer: a worker that holds a session stops
// answering for 20 s (SIGSTOP: a long pause, a partition). Another worker's opener
// takes it for dead and ends its session. Once it runs again, it gives the session's
// container back at once; it held it until the session's idle TTL, 10 minutes (a
// review's finding).
func TestOpenerAnOwnerTakenForDeadFreesItsContainer(t *testing.T) {
	w, nc, js := processToKill(t, "stalled")
	t.Cleanup(func() { _ = w.cmd.Process.Signal(syscall.SIGCONT) })
	s := newSessionClient(t, nc).NewSession("default")
	first := mustSucceed(t, call(t, s, "x = 1"))
	if first.WorkerID != w.id {
		t.Fatalf("the session opened on %s, not the worker to stop", first.WorkerID)
	}
	stream, err := js.Stream(t.Context(), wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	raw := testenv.StoredMsg(t, stream, wire.EventSubject(first.ExecutionID, wire.EventStarted))
	started, err := wire.DecodeEvent(raw.Header.Get(wire.HeaderContentType), raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	holds := func() bool { return slices.Contains(testenv.ContainersOf(t, w.id), started.ContainerID) }
	if !holds() {
		t.Fatalf("the session's container %s is not among the worker's: %v", started.ContainerID, testenv.ContainersOf(t, w.id))
	}
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	startWorker(t, nc, 1, 0, nil)
	if res := waitWithin(t, submitCall(t, s, "emit_result(x)"), time.Minute); res == nil || res.ErrorKind != wire.KindSessionLost {
		t.Fatalf("a call while the owner is stopped: %s, want session_lost", describeRes(res))
	}
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the owner to give the session's container back", func() bool { return !holds() })
}
