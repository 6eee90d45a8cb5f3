package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

func newSessionClient(t testing.TB, nc *nats.Conn) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// call runs script as the session's next call and returns its result.
func call(t testing.TB, s *client.Session, script string) *client.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := s.Run(ctx, wire.Job{Mode: wire.ModeInteractive, Script: script})
	if err != nil {
		t.Fatalf("session %s: %v", s.ID, err)
	}
	return res
}

func mustSucceed(t testing.TB, res *client.Result) *client.Result {
	t.Helper()
	if !res.Success {
		t.Fatalf("%s failed: %s: %s\n%s", res.ExecutionID, res.ErrorKind, res.Error, res.Traceback)
	}
	return res
}

// TestASessionKeepsItsStateBetweenCalls: a variable of call 1 is there in call 2, a
// module imported in call 1 is used in call 3, a file written in call 1 is read in
// call 3; a stateless job run beside the session sees none of it.
func TestASessionKeepsItsStateBetweenCalls(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 2, nil)
	c := newSessionClient(t, nc)
	s := c.NewSession("default")

	mustSucceed(t, call(t, s, "x = 41\nimport json\nopen('notes.txt', 'w').write('kept')"))
	if got := mustSucceed(t, call(t, s, "emit_result(x + 1)")).FinalData; got != int64(42) {
		t.Errorf("call 2 gave %v, want 42", got)
	}
	if got := mustSucceed(t, call(t, s, "emit_result(json.dumps({'notes': open('notes.txt').read()}))")).FinalData; got != `{"notes": "kept"}` {
		t.Errorf("call 3 gave %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: "import os\nemit_result(['x' in globals(), 'json' in globals(), os.path.exists('notes.txt')])"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(mustSucceed(t, res).FinalData); got != "[false false false]" {
		t.Errorf("a stateless job beside the session saw %s", got)
	}
	if got := mustSucceed(t, call(t, s, "emit_result(x)")).FinalData; got != int64(41) {
		t.Errorf("call 4 gave %v, want 41", got)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	res = call(t, s, "emit_result(x)")
	if res.Success || res.ErrorKind != wire.KindSessionLost || !strings.Contains(res.Error, "closed") {
		t.Errorf("a call after close: %v %s: %s; want session_lost saying it was closed", res.Success, res.ErrorKind, res.Error)
	}
	if err := s.Close(ctx); err != nil {
		t.Errorf("closing the closed session again: %v, want no error", err)
	}
}

// TestTwoSessionsDoNotSeeEachOther: sessions of one sandbox on one worker run in
// containers of their own: neither sees the other's globals, files or processes.
func TestTwoSessionsDoNotSeeEachOther(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 2, nil)
	c := newSessionClient(t, nc)
	a, b := c.NewSession("default"), c.NewSession("default")

	mustSucceed(t, call(t, a, `secret = "alpha"
open("secret.txt", "w").write(secret)
import subprocess
daemon = subprocess.Popen(["sleep", "300"])`))
	mustSucceed(t, call(t, b, "mine = 'beta'"))
	got := mustSucceed(t, call(t, b, `import os
procs = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            procs.append(open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode())
        except OSError:
            pass
emit_result({"secret": "secret" in globals(), "file": os.path.exists("secret.txt"), "sleep": any(p.startswith("sleep") for p in procs), "mine": mine})`)).FinalData
	if fmt.Sprint(got) != "map[file:false mine:beta secret:false sleep:false]" {
		t.Errorf("session b saw %v", got)
	}
	if got := mustSucceed(t, call(t, a, "emit_result([secret, daemon.poll() is None])")).FinalData; fmt.Sprint(got) != "[alpha true]" {
		t.Errorf("session a lost its state: %v", got)
	}
}

// TestAnIdleSessionEndsAndFreesItsContainer: past the idle TTL the session ends, its
// container is retired, and its next call gets session_lost saying why.
func TestAnIdleSessionEndsAndFreesItsContainer(t *testing.T) {
	_, nc := testenv.NATS(t)
	_, pool := startWorkerPool(t, nc, sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 1}, nil, func(c *worker.Config) { c.SessionIdleTTL = time.Second })
	c := newSessionClient(t, nc)
	s := c.NewSession("default")
	mustSucceed(t, call(t, s, "x = 1"))
	retired := func() uint64 { return pool.Stats().Sandboxes["default"].Retired[sandboxpool.RetireSession] }
	testenv.WaitFor(t, 30*time.Second, "the idle session's container to be retired", func() bool { return retired() == 1 })
	res := call(t, s, "emit_result(x)")
	if res.Success || res.ErrorKind != wire.KindSessionLost || !strings.Contains(res.Error, "idle") {
		t.Errorf("a call after the idle TTL: %v %s: %s; want session_lost saying it was idle", res.Success, res.ErrorKind, res.Error)
	}
}

// TestSessionCallsFindTheirWorker: two workers, 20 sessions opened at once, three
// calls each: every call of a session runs on the worker that opened it, in its
// process (it sees the session's own value).
func TestSessionCallsFindTheirWorker(t *testing.T) {
	_, nc := testenv.NATS(t)
	tweak := func(c *worker.Config) { c.Sandboxes[0].MaxSessions = 12 }
	for i := range 2 {
		testworker.Start(t, nc, testworker.Options{ID: fmt.Sprintf("route-%d-%d", i, time.Now().UnixNano()), Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 12}, Worker: tweak})
	}
	c := newSessionClient(t, nc)
	var wg sync.WaitGroup
	workers := make([]map[string]bool, 20)
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := c.NewSession("default")
			workers[i] = map[string]bool{}
			for n := range 3 {
				res := call(t, s, fmt.Sprintf("if %d == 0:\n    mine = %q\nemit_result(mine)", n, s.ID))
				if !res.Success || res.FinalData != s.ID {
					errs <- fmt.Errorf("session %d call %d: %v %s %s: %v", i, n, res.Success, res.ErrorKind, res.Error, res.FinalData)
					return
				}
				workers[i][res.WorkerID] = true
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	used := map[string]bool{}
	for i, ws := range workers {
		if len(ws) != 1 {
			t.Errorf("session %d ran on workers %v", i, ws)
		}
		for w := range ws {
			used[w] = true
		}
	}
	// Each worker holds at most 12: both hold some, so calls had to find their worker.
	if len(used) != 2 {
		t.Errorf("the 20 sessions ran on workers %v, want both", used)
	}
}

// TestAKilledWorkersSessionsAreLost: a worker that holds a session is killed with
// SIGKILL; the session's next call, taken by another worker once the first's liveness
// key expired, gets session_lost, never a new empty session.
func TestAKilledWorkersSessionsAreLost(t *testing.T) {
	srv, nc := testenv.NATS(t)
	testenv.SandboxImage(t)
	w := startProcess(t, writeConfig(t, ""), srv.ClientURL(), newID("killed"))
	w.serving(t)
	c := newSessionClient(t, nc)
	s := c.NewSession("default")
	first := mustSucceed(t, call(t, s, "x = 1"))
	if first.WorkerID != w.id {
		t.Fatalf("the session opened on %s, not the worker to kill", first.WorkerID)
	}
	// A call running when the worker dies, and calls queued behind it: the opener
	// watches only the last, and acked the others.
	left := []*client.Execution{submitCall(t, s, "import time\ntime.sleep(600)")}
	for range 3 {
		left = append(left, submitCall(t, s, "emit_result(x)"))
	}
	time.Sleep(time.Second) // for the opener to see them
	// SIGKILL:
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Answers them, once the killed worker has not refreshed its session's entry for
	// 15 s, and the next call too.
	startWorker(t, nc, 1, 0, nil)
	for i, e := range left {
		if res := waitWithin(t, e, 2*time.Minute); res == nil || res.ErrorKind != wire.KindSessionLost || !strings.Contains(res.Error, w.id) {
			t.Errorf("call %d left when the worker died: %s; want session_lost naming the dead worker", i+2, describeRes(res))
		}
	}
	res := call(t, s, "emit_result(x)")
	if res.Success || res.ErrorKind != wire.KindSessionLost || !strings.Contains(res.Error, w.id) {
		t.Errorf("the call after the worker died: %v %s: %s (worker %s); want session_lost naming the dead worker", res.Success, res.ErrorKind, res.Error, res.WorkerID)
	}
}

// sessionsStreamOfEarlierFleet starts a NATS server whose sessions stream is there,
// as a fleet of other sandboxes (or an earlier run) left it, and no worker.
func sessionsStreamOfEarlierFleet(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	_, nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.StreamSessions, Subjects: []string{wire.SessionWildcard}}); err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// TestASessionCallWaitsForTheFirstWorkerOfItsSandbox: the sessions stream is there
// (a fleet ran before) and no worker of the sandbox has run yet. A call published
// then waits in the stream and runs when the first worker comes, as a job would. Once
// a worker of other sandboxes runs, the stream takes the calls of the sandboxes
// served, and a new call of the unserved one is refused at publish.
func TestASessionCallWaitsForTheFirstWorkerOfItsSandbox(t *testing.T) {
	nc, js := sessionsStreamOfEarlierFleet(t)
	c := newSessionClient(t, nc)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	waiting := make(chan *client.Result, 1)
	go func() {
		res, err := c.NewSession("default").Run(ctx, wire.Job{Mode: wire.ModeInteractive, Script: "emit_result(7)"})
		if err != nil {
			res = &client.Result{Error: err.Error()}
		}
		waiting <- res
	}()
	stream, err := js.Stream(t.Context(), wire.StreamSessions)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the call stored", func() bool {
		info, err := stream.Info(t.Context())
		return err == nil && info.State.Msgs == 1
	})

	startBareWorker(t, nc, func(c *worker.Config) { c.Sandboxes[0].Name = "other" }, nil)
	if _, err := c.NewSession("default").Run(ctx, wire.Job{Mode: wire.ModeInteractive, Script: "emit_result(8)"}); !errors.Is(err, client.ErrUnknownSandbox) {
		t.Fatalf("a call no worker serves: %v; want ErrUnknownSandbox", err)
	}

	startWorker(t, nc, 1, 0, nil)
	if res := mustSucceed(t, <-waiting); res.FinalData != int64(7) {
		t.Errorf("the waiting call's result: %v, want 7", res.FinalData)
	}
	opener, err := js.Consumer(t.Context(), wire.StreamSessions, wire.SessionOpenerName("default"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the opener done with the call", func() bool {
		info, err := opener.Info(t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// TestAWorkerStartsOverAnOpenerOfAnEarlierVersion: openers used to deliver only new
// calls, and JetStream updates no consumer's deliver policy; a worker of this version
// starts beside one and leaves its policy.
func TestAWorkerStartsOverAnOpenerOfAnEarlierVersion(t *testing.T) {
	nc, js := sessionsStreamOfEarlierFleet(t)
	name := wire.SessionOpenerName("default")
	if _, err := js.CreateConsumer(t.Context(), wire.StreamSessions, jetstream.ConsumerConfig{
		Durable: name, FilterSubject: "jazzmine.session.default.*", DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	startBareWorker(t, nc, nil, nil)
	opener, err := js.Consumer(t.Context(), wire.StreamSessions, name)
	if err != nil {
		t.Fatal(err)
	}
	if got := opener.CachedInfo().Config; got.DeliverPolicy != jetstream.DeliverNewPolicy || got.MaxDeliver != -1 {
		t.Errorf("the opener after the worker started: deliver policy %v, max deliver %d; want the old policy kept and the rest updated", got.DeliverPolicy, got.MaxDeliver)
	}
}

// BenchmarkSessionCall is a session's call against a stateless call of the trivial
// job, in the same run, alternating, 5 ms apart: their median and p99.
func BenchmarkSessionCall(b *testing.B) {
	_, nc := testenv.NATS(b)
	startWorker(b, nc, 2, 1, nil)
	c := newClient(b, nc)
	ctx := context.Background()
	s := c.NewSession("default")
	session := func() {
		res, err := s.Run(ctx, wire.Job{Script: trivial})
		if err != nil || !res.Success {
			b.Fatalf("session call: %v %+v", err, res)
		}
	}
	run(b, ctx, c, 3)
	session()
	stateless := make([]time.Duration, 0, b.N)
	calls := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		time.Sleep(callGap)
		b.StartTimer()
		t0 := time.Now()
		run(b, ctx, c, 1)
		stateless = append(stateless, time.Since(t0))
		b.StopTimer()
		time.Sleep(callGap)
		b.StartTimer()
		t0 = time.Now()
		session()
		calls = append(calls, time.Since(t0))
	}
	b.StopTimer()
	testenv.ReportLatency(b, "stateless-", stateless)
	testenv.ReportLatency(b, "session-", calls)
}

// TestASessionPastTheLimitsFailsAndEvictsNone: a worker at its limit of sessions
// opens no other; with no other worker, the new session's first call fails with
// session_limit, its later calls with session_lost, and the session held before is
// untouched.
func TestASessionPastTheLimitsFailsAndEvictsNone(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 2, func(c *worker.Config) { c.Sandboxes[0].MaxSessions = 1 })
	c := newSessionClient(t, nc)
	held, refused := c.NewSession("default"), c.NewSession("default")
	mustSucceed(t, call(t, held, "x = 'kept'"))
	res := call(t, refused, "y = 1")
	if res.Success || res.ErrorKind != wire.KindSessionLimit {
		t.Errorf("a session past the limit: %v %s: %s; want session_limit", res.Success, res.ErrorKind, res.Error)
	}
	if res := call(t, refused, "emit_result(1)"); res.Success || res.ErrorKind != wire.KindSessionLost {
		t.Errorf("the refused session's next call: %v %s: %s; want session_lost, not a new session", res.Success, res.ErrorKind, res.Error)
	}
	if got := mustSucceed(t, call(t, held, "emit_result(x)")).FinalData; got != "kept" {
		t.Errorf("the held session gave %v", got)
	}
}

// TestACancelEndsASessionCallWaitingBehindAnother: a session call waits behind a slow
// call of its session, and its agent cancels it. It ends at once with a cancelled
// error and never runs; the slow call runs to its end and the session goes on, its
// state untouched by the cancelled call. The coordinator looked for a queued job in
// the jobs stream only: the cancel was void, and the waiting call ran later. In the
// fleet's own account (the Go client) and in a tenant's (its calls and its cancel on
// the subjects the server writes for it).
func TestACancelEndsASessionCallWaitingBehindAnother(t *testing.T) {
	const slow = "import time\ntime.sleep(5)\nx += 1"
	t.Run("own account", func(t *testing.T) {
		s := openedSession(t, "x = 0")
		slowCall := submitCall(t, s, slow)
		cancelledWithin(t, "the cancelled waiting call", submitCall(t, s, "x += 100\nemit_result(x)"))
		mustSucceed(t, waitWithin(t, slowCall, time.Minute))
		if got := mustSucceed(t, call(t, s, "emit_result(x)")).FinalData; got != int64(1) {
			t.Errorf("x after the calls: %v, want 1: the cancelled call ran", got)
		}
	})
	t.Run("tenant", func(t *testing.T) {
		_, nc := testenv.NATS(t)
		startWorker(t, nc, 1, 1, nil)
		sid := "cancel-" + client.NewExecutionID()
		submit := func(script string) (string, func() []*wire.Event) {
			id := client.NewExecutionID()
			return id, submitTenantJob(t, nc, "alpha", wire.Job{ExecutionID: id, Mode: wire.ModeInteractive, SessionID: sid, Script: script})
		}
		cancelAs := func(tenant, id string) {
			subject := wire.CancelSubject(id)
			if tenant != "" {
				subject = wire.SubjectPrefixCancel + "." + tenant + "." + id
			}
			if err := nc.Publish(subject, nil); err != nil {
				t.Fatal(err)
			}
		}
		_, opened := submit("x = 0")
		if evs := opened(); !last(evs).Success {
			t.Fatalf("the session's first call: %s", describe(evs))
		}
		_, slowCall := submit(slow)
		// Beta, and the fleet's own account, cancel a waiting call of alpha's by its
		// id: they find nothing of theirs, and it runs. Alpha's own cancel of the next
		// one ends it.
		othersID, othersCancel := submit("x += 10")
		var heard []*nats.Subscription // what the others' cancels published, under their own ids
		for _, subject := range []string{wire.EventsWildcard("beta." + othersID), wire.EventsWildcard(othersID)} {
			sub, err := nc.SubscribeSync(subject)
			if err != nil {
				t.Fatal(err)
			}
			heard = append(heard, sub)
		}
		cancelAs("beta", othersID)
		cancelAs("", othersID)
		id, waiting := submit("x += 100\nemit_result(x)")
		cancelAs("alpha", id)
		evs := waiting()
		if last(evs).Success || count(evs, wire.EventError) != 1 || find(evs, wire.EventError).Kind != wire.KindCancelled {
			t.Errorf("the cancelled waiting call: %s, want one cancelled error", describe(evs))
		}
		for what, wait := range map[string]func() []*wire.Event{"the slow call": slowCall, "the call others cancelled": othersCancel} {
			if evs := wait(); !last(evs).Success {
				t.Errorf("%s: %s", what, describe(evs))
			}
		}
		// Void, they publish nothing: had they found alpha's call, each would have
		// published a cancelled end under its own key, telling its sender that alpha
		// had a call of that id waiting.
		for _, sub := range heard {
			if msg, err := sub.NextMsg(100 * time.Millisecond); err == nil {
				t.Errorf("a cancel by another account of alpha's call published %s", msg.Subject)
			}
		}
		if ok, kind, msg, got := runTenantCall(t, nc, "alpha", wire.Job{Sandbox: "default", SessionID: sid, Script: "emit_result(x)"}); !ok || got != int64(11) {
			t.Errorf("x after the calls: %v (%s %s), want 11: the slow call and the one others cancelled ran, alpha's cancelled one did not", got, kind, msg)
		}
	})
}

// cancelledWithin cancels e, a session call that waits, and checks that it ends
// cancelled within a minute.
func cancelledWithin(t *testing.T, what string, e *client.Execution) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if res := waitWithin(t, e, time.Minute); res == nil || res.ErrorKind != wire.KindCancelled {
		t.Errorf("%s: %s, want cancelled", what, describeRes(res))
	}
}

// TestASessionCallCancelledAsItsOwnerTakesItLeavesTheSession: the cancel of a waiting
// session call is under way (its entry in BucketCancels says "pending": the
// coordinator is asking the fleet who runs it) when the session's owner takes the
// call. The owner wins the entry, and the call ends cancelled without running; its
// session goes on. The call used to run with its context cancelled, which kills the
// session's process as the cancel of a running call does: the next call got
// session_lost.
func TestASessionCallCancelledAsItsOwnerTakesItLeavesTheSession(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 1, nil)
	s := newSessionClient(t, nc).NewSession("default")
	mustSucceed(t, call(t, s, "x = 0"))
	id := client.NewExecutionID()
	recordCancel(t, nc, id, "pending")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := s.Submit(ctx, wire.Job{ExecutionID: id, Mode: wire.ModeInteractive, Script: "x += 100"})
	if err != nil {
		t.Fatal(err)
	}
	if res := waitWithin(t, e, time.Minute); res == nil || res.ErrorKind != wire.KindCancelled {
		t.Errorf("the call cancelled as it was taken: %s, want cancelled", describeRes(res))
	}
	if res := call(t, s, "emit_result(x)"); !res.Success || res.FinalData != int64(0) {
		t.Errorf("the next call: %s, want success 0: the session goes on, the cancelled call did not run", describeRes(res))
	}
}

// TestACancelledFirstCallOpensNoSession: a session's first call waits, every worker
// at its limit of sessions, and its agent cancels it. It ends cancelled and opens
// nothing: once there is room, the session's next call opens the session afresh,
// without the cancelled call's state.
func TestACancelledFirstCallOpensNoSession(t *testing.T) {
	_, nc := testenv.NATS(t)
	// One session at a time; a first call is looked at again for a while (20
	// deliveries, 200 ms apart) before it is refused with session_limit.
	startWorker(t, nc, 1, 1, func(c *worker.Config) {
		c.MaxDeliver = 20
		c.Sandboxes[0].MaxSessions = 1
	})
	c := newSessionClient(t, nc)
	holder := c.NewSession("default")
	mustSucceed(t, call(t, holder, "pass"))
	s := c.NewSession("default")
	cancelledWithin(t, "the cancelled first call", submitCall(t, s, "x = 'set by the cancelled call'"))
	if err := holder.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if res := call(t, s, "emit_result('x' in globals())"); !res.Success || res.FinalData != false {
		t.Errorf("the session's next call: %s, want a new session without x", describeRes(res))
	}
}
