package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/sandboxspec"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// Adversarial tests of sessions (see the review report). Each names what it attacks;
// a failure here is a finding, not a flaky test.

// submitCall publishes script as the session's next call without waiting for it.
func submitCall(t testing.TB, s *client.Session, script string) *client.Execution {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := s.Submit(ctx, wire.Job{Mode: wire.ModeInteractive, Script: script})
	if err != nil {
		t.Fatalf("session %s: %v", s.ID, err)
	}
	return e
}

// waitWithin waits for e's result, or returns nil when it has none within d.
func waitWithin(t testing.TB, e *client.Execution, d time.Duration) *client.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res, err := e.Wait(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		t.Fatalf("wait: %v", err)
	}
	return res
}

func describeRes(res *client.Result) string {
	if res == nil {
		return "no answer"
	}
	if res.Success {
		return fmt.Sprintf("success %v", res.FinalData)
	}
	return fmt.Sprintf("%s: %s", res.ErrorKind, res.Error)
}

// TestSessionAttackFirstCallsKeepTheirOrder: an agent submits a session's first two
// calls back to back (Session is "safe for concurrent use"). The fleet's opener hands
// them to two workers at once; worker A, at its limit, naks the first; worker B takes
// the second, claims the session and makes its consumer start AT THAT CALL. The second
// then runs first (in an empty session: NameError) and the first is never run: the
// opener watches it until the session ends (idle), then answers session_lost.
func TestSessionAttackFirstCallsKeepTheirOrder(t *testing.T) {
	_, nc := testenv.NATS(t)
	tweak := func(c *worker.Config) {
		c.MaxDeliver = 50
		c.SessionIdleTTL = 3 * time.Second
	}
	testworker.Start(t, nc, testworker.Options{ID: newID("full"), Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 1}, Worker: func(c *worker.Config) {
		tweak(c)
		c.Sandboxes[0].MaxSessions = 1
	}})
	c := newSessionClient(t, nc)
	mustSucceed(t, call(t, c.NewSession("default"), "pass")) // worker "full" is now at its limit
	testworker.Start(t, nc, testworker.Options{ID: newID("free"), Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 3}, Worker: tweak})
	for i := range 8 {
		s := c.NewSession("default")
		first := submitCall(t, s, "x = 1")
		time.Sleep(time.Duration(i%4) * 20 * time.Millisecond)
		second := submitCall(t, s, "emit_result(x + 1)")
		r1, r2 := waitWithin(t, first, 30*time.Second), waitWithin(t, second, 30*time.Second)
		t.Logf("session %d: first call: %s; second call: %s", i, describeRes(r1), describeRes(r2))
		if r1 == nil || !r1.Success || r2 == nil || !r2.Success || r2.FinalData != int64(2) {
			t.Errorf("session %d: its first two calls did not run in order: first %s; second %s", i, describeRes(r1), describeRes(r2))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = s.Close(ctx)
		cancel()
	}
}

// twoSandboxes makes the test worker serve "default" and "second", one image.
func twoSandboxes(t *testing.T, nc *nats.Conn, tweak func(*worker.Config)) {
	var second sandboxpool.Sandbox
	testworker.Start(t, nc, testworker.Options{
		Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 2},
		Pool: func(c *sandboxpool.Config) {
			second = c.Sandboxes[0]
			second.Name = "second"
			c.Sandboxes = append(c.Sandboxes, second)
		},
		Worker: func(c *worker.Config) {
			c.Sandboxes = append(c.Sandboxes, sandboxspec.Worker(second, nil))
			if tweak != nil {
				tweak(c)
			}
		},
	})
}

// TestSessionAttackSameIDInAnotherSandbox: the sessions bucket and the session's
// consumer are keyed by session id alone, the subject by sandbox and id. A call of
// session S of sandbox "second" while S of "default" is open is seen by second's
// opener as a call of an open session, whose owner is alive: it is watched until the
// other sandbox's session ends (10 minutes idle by default), never run nor refused.
func TestSessionAttackSameIDInAnotherSandbox(t *testing.T) {
	_, nc := testenv.NATS(t)
	twoSandboxes(t, nc, nil)
	c := newSessionClient(t, nc)
	a := c.NewSession("default")
	mustSucceed(t, call(t, a, "x = 'default'"))
	b := c.NewSession("second")
	b.ID = a.ID
	res := waitWithin(t, submitCall(t, b, "emit_result(1)"), 20*time.Second)
	t.Logf("a call of session %s of sandbox second, while the same id is open in default: %s", a.ID, describeRes(res))
	if res == nil {
		t.Errorf("the call of the other sandbox's session %s had no answer in 20 s (it waits for the session of sandbox default to end)", a.ID)
	}
	// It is answered only once the other sandbox's session ends, with its reason.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSessionAttackSandboxNobodyServes: a stateless job of a sandbox nobody serves,
// and a session call of one, are refused at publish (no stream takes their
// subjects): neither holds room in a stream nor waits for an answer (a session call
// of one used to sit in JAZZMINE_SESSIONS for SessionMaxLife + EventsMaxAge).
func TestSessionAttackSandboxNobodyServes(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 0, nil)
	c := newSessionClient(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Run(ctx, wire.Job{Sandbox: "nobody", Script: "emit_result(1)"}); !errors.Is(err, client.ErrUnknownSandbox) {
		t.Errorf("a stateless job of sandbox nobody: %v; want ErrUnknownSandbox", err)
	}
	if _, err := c.NewSession("nobody").Run(ctx, wire.Job{Mode: wire.ModeInteractive, Script: "emit_result(1)"}); !errors.Is(err, client.ErrUnknownSandbox) {
		t.Errorf("a session call of sandbox nobody: %v; want ErrUnknownSandbox", err)
	}
}

// eventsOf returns the types (kind for errors) of the events stored for execution id.
func eventsOf(t testing.TB, nc *nats.Conn, id string) []string {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, wire.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{wire.EventsWildcard(id)}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return got
		}
		var ev struct {
			Type, Kind, Error string
		}
		_ = json.Unmarshal(msg.Data(), &ev)
		if ev.Type == "" {
			ev.Type = msg.Subject()[strings.LastIndex(msg.Subject(), ".")+1:]
		}
		if ev.Type == wire.EventError {
			got = append(got, "error:"+ev.Kind)
		} else {
			got = append(got, ev.Type)
		}
	}
}

// TestSessionAttackOwnerDeemedDeadWhileRunning: the opener ends a session as soon as
// its owner's liveness key is gone, without knowing whether the owner still runs a
// call. A worker that missed its refreshes (a NATS hiccup or a pause; here its key is
// deleted) while a call runs: another worker's opener answers the running call with
// session_lost under attempt 1, whose error event has the Nats-Msg-Id of the owner's
// "started" (seq 1) and is dropped as a duplicate. The client gets a failure without
// an error kind ("its worker died") for a call that ran, with its side effects, on an
// owner alive all along, whose own script_done is dropped in turn.
func TestSessionAttackOwnerDeemedDeadWhileRunning(t *testing.T) {
	_, nc := testenv.NATS(t)
	owner := newID("owner")
	testworker.Start(t, nc, testworker.Options{ID: owner, Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 1}, Worker: func(c *worker.Config) { c.LivenessTTL = time.Minute }})
	c := newSessionClient(t, nc)
	s := c.NewSession("default")
	mustSucceed(t, call(t, s, "x = 1"))
	// Another worker of the fleet, whose opener watches the next call too.
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 1}})
	e := submitCall(t, s, "import time\ntime.sleep(6)\nopen('side-effect', 'w').write('ran')\nemit_result('ran')")
	time.Sleep(500 * time.Millisecond)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, worker.BucketWorkers)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, owner); err != nil {
		t.Fatal(err)
	}
	res := waitWithin(t, e, 30*time.Second)
	time.Sleep(8 * time.Second) // the call's own end, if any
	evs := eventsOf(t, nc, e.ID)
	t.Logf("client result: %s; events stored: %v", describeRes(res), evs)
	// The owner ran the call to its end (it was alive all along): the client must not
	// be told the session died, nor get a failure without its error event.
	if res == nil || !res.Success {
		t.Errorf("a call its (alive) owner ran: the client got %s, events %v", describeRes(res), evs)
	}
}

// openedSession starts a worker of one container that holds a session, and opens one
// with its first call, script.
func openedSession(t *testing.T, script string) *client.Session {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 1, nil)
	s := newSessionClient(t, nc).NewSession("default")
	mustSucceed(t, call(t, s, script))
	return s
}

// TestSessionAttackAnOversizedDisplayRunsTheCallOnce: a call displays text forms larger
// than an event may hold (2 MB of HTML, with a max_output_bytes the contract allows).
// The worker could not publish that display, counted its events unstored and ran the
// call again until its deliveries were used up: a counter it added to came back 3 (a
// review's attack). The display is cut, the call runs once and succeeds.
func TestSessionAttackAnOversizedDisplayRunsTheCallOnce(t *testing.T) {
	s := openedSession(t, "n = 0\nclass H:\n    def _repr_html_(self): return 'x' * 2_000_000")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := s.Run(ctx, wire.Job{Mode: wire.ModeInteractive, MaxOutputBytes: 4 << 20, Script: "n += 1\ndisplay(H())"})
	if err != nil || !res.Success {
		t.Fatalf("the displaying call: %s, %v", describeRes(res), err)
	}
	if len(res.Displays) != 1 || !strings.HasPrefix(res.Displays[0].Data["text/plain"], "[display not sent: it is ") {
		t.Errorf("displays %+v, want one whose text forms say they were not sent", res.Displays)
	}
	if got := mustSucceed(t, call(t, s, "emit_result(n)")).FinalData; got != int64(1) {
		t.Errorf("the call ran %v times in the session, want once", got)
	}
}

// TestSessionAttackARunningCallIsCancelled: a cancel of a session call that runs. The
// coordinator looked for the call in the jobs stream only, found none there (a session
// call is in the sessions stream) and took the cancel as void: the call ran its 20 s
// to a success, holding its container (a review found it; the MCP server cancels a
// call its client cancels this way).
func TestSessionAttackARunningCallIsCancelled(t *testing.T) {
	s := openedSession(t, "pass")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := s.Submit(ctx, wire.Job{Mode: wire.ModeInteractive, Script: "print('up', flush=True)\nimport time\ntime.sleep(20)\nemit_result('ran to its end')", TimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for ev := range e.Events() {
		if ev.Type == wire.EventStdout {
			break
		}
	}
	if err := e.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	res := waitWithin(t, e, 10*time.Second)
	if res == nil || res.ErrorKind != wire.KindCancelled {
		t.Errorf("the running session call: %s, want cancelled within 10 s", describeRes(res))
	}
	// The call's process was killed with it: the session has ended, as README says.
	if next := call(t, s, "emit_result(1)"); next.ErrorKind != wire.KindSessionLost {
		t.Errorf("the call after the cancelled one: %s, want session_lost", describeRes(next))
	}
}

// TestSessionAttackTheOpenerWatchesAnyNumberOfCalls: the opener watched every call of
// a live session until it had its end. At its default of 1,000 unacknowledged calls,
// one session's 1,001 queued calls kept every other session of the sandbox from
// opening (a review's attack: no answer within 45 s, against 5 ms). It has no such
// cap now, on a new fleet and on one whose opener an earlier version made: it holds
// the last call of each live session, whatever their number (and
// TestSessionAttackOneSessionsQueueHoldsTheOpenerOnce checks it holds no more).
func TestSessionAttackTheOpenerWatchesAnyNumberOfCalls(t *testing.T) {
	_, nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	maxAckPending := func() int {
		t.Helper()
		opener, err := js.Consumer(ctx, wire.StreamSessions, wire.SessionOpenerName("default"))
		if err != nil {
			t.Fatal(err)
		}
		return opener.CachedInfo().Config.MaxAckPending
	}
	startWorker(t, nc, 1, 1, nil)
	if got := maxAckPending(); got != -1 {
		t.Fatalf("the opener holds at most %d unacknowledged calls, want no cap", got)
	}
	// An opener as an earlier version made it, with the server's default cap.
	opener, err := js.Consumer(ctx, wire.StreamSessions, wire.SessionOpenerName("default"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := opener.CachedInfo().Config
	cfg.MaxAckPending = 1000
	if _, err := js.UpdateConsumer(ctx, wire.StreamSessions, cfg); err != nil {
		t.Fatal(err)
	}
	startWorker(t, nc, 1, 1, nil)
	if got := maxAckPending(); got != -1 {
		t.Errorf("over an earlier opener, the opener holds at most %d unacknowledged calls, want no cap", got)
	}
}

// sessionFleet starts a worker of two containers and returns a JetStream context
// and a client on its server.
func sessionFleet(t *testing.T) (jetstream.JetStream, *client.Client) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 1, nil)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, newSessionClient(t, nc)
}

// openerSettles waits up to 10 s for the default sandbox's opener to have seen every
// call and to hold at most held of them, and returns how many it has not seen and
// how many it holds.
func openerSettles(t *testing.T, js jetstream.JetStream, held int) (uint64, int) {
	t.Helper()
	opener, err := js.Consumer(t.Context(), wire.StreamSessions, wire.SessionOpenerName("default"))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, err := opener.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending <= held || time.Now().After(deadline) {
			return info.NumPending, info.NumAckPending
		}
	}
}

// TestSessionAttackOneSessionsQueueHoldsTheOpenerOnce: an agent queues hundreds of
// calls in one session behind a slow one. The opener used to watch each of them
// until it had its end, a look every few seconds each, one at a time: 20,000 queued
// calls delayed the opening of the sandbox's other sessions past 150 s (a review's
// run). It now routes each call once and holds none (an earlier version held the
// last call of each session); the calls it acked still get their end when the
// session closes before them.
func TestSessionAttackOneSessionsQueueHoldsTheOpenerOnce(t *testing.T) {
	js, c := sessionFleet(t)
	ctx := t.Context()
	s := c.NewSession("default")
	mustSucceed(t, call(t, s, "x = 1"))
	slow := submitCall(t, s, "import time\ntime.sleep(15)")
	closing, err := s.Submit(ctx, wire.Job{Mode: wire.ModeInteractive, Script: "emit_result(x)", SessionClose: true})
	if err != nil {
		t.Fatal(err)
	}
	const queued = 300
	var after []*client.Execution
	for range queued {
		after = append(after, submitCall(t, s, "emit_result(2)"))
	}
	if pending, held := openerSettles(t, js, 1); pending != 0 || held > 1 {
		t.Fatalf("with %d calls queued in one session, the opener holds %d of them (%d not yet seen), want only the last", queued+2, held, pending)
	}
	other := c.NewSession("default")
	mustSucceed(t, call(t, other, "emit_result(3)"))
	mustSucceed(t, waitWithin(t, slow, time.Minute))
	if res := waitWithin(t, closing, time.Minute); res == nil || !res.Success || fmt.Sprint(res.FinalData) != "1" {
		t.Errorf("the closing call: %s, want success 1", describeRes(res))
	}
	lost := 0
	for _, e := range after {
		if res := waitWithin(t, e, time.Minute); res != nil && res.ErrorKind == wire.KindSessionLost {
			lost++
		} else if lost+1 == len(after) || res == nil || res.Success {
			t.Errorf("a call after the session closed: %s, want session_lost", describeRes(res))
		}
	}
	if lost != queued {
		t.Errorf("%d of the %d calls after the close got session_lost", lost, queued)
	}
	// The stream holds the calls that wait, none of these.
	stream, err := js.Stream(ctx, wire.StreamSessions)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the sessions stream to drop the calls done with", func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	if pending, held := openerSettles(t, js, 0); pending != 0 || held != 0 {
		t.Errorf("with every call done with, the opener holds %d (%d not yet seen)", held, pending)
	}
}

// TestSessionAttackACallWithNoValidIDOpensNothing: a session's first call whose
// Nats-Msg-Id is no execution id (here a subject wildcard). Nothing can ever be
// published under it, so the opener acks it at once: it neither opens a session for it
// (a container held until the session's idle end) nor watches it, and the id never
// reaches a subject (the opener looked it up in the events stream as it was).
func TestSessionAttackACallWithNoValidIDOpensNothing(t *testing.T) {
	js, c := sessionFleet(t)
	ctx := t.Context()
	s := c.NewSession("default")
	data, err := wire.EncodeJob(wire.ContentTypeJSON, &wire.Job{ExecutionID: "x", Sandbox: "default", SessionID: s.ID, Script: "pass"})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(wire.SessionSubject("default", s.ID))
	m.Header.Set(wire.HeaderMsgID, "x.*")
	m.Header.Set(wire.HeaderContentType, wire.ContentTypeJSON)
	m.Data = data
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if pending, held := openerSettles(t, js, 0); pending != 0 || held != 0 {
		t.Fatalf("the opener still holds the call: %d pending, %d unacknowledged", pending, held)
	}
	kv, err := js.KeyValue(ctx, worker.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	if entry, err := kv.Get(ctx, s.ID); err == nil {
		t.Errorf("the call opened session %s: %s", s.ID, entry.Value())
	}
	mustSucceed(t, call(t, s, "emit_result(1)")) // its first real call opens it
}

// TestSessionAttackTenantsShareNoSessionAndNoTenantTakesEveryRoom: on a fleet with
// tenants, a tenant's session calls arrive as
// jazzmine.session.<tenant>.<sandbox>.<session_id> (the server writes the tenant). A
// tenant that uses another's session id, known or guessed, would run in that
// session's process, reading and changing its state, if session ids were the
// fleet's. Each tenant's ids are its own: the attacker's call opens a session of
// its own, sees nothing of the victim's, and closing it leaves the victim's open;
// the fleet's own account has its own too. And one tenant holds at most half of a
// sandbox's sessions on a worker: past that its next session fails with
// session_limit, saying so, and another tenant still opens one.
func TestSessionAttackTenantsShareNoSessionAndNoTenantTakesEveryRoom(t *testing.T) {
	_, nc := testenv.NATS(t)
	startWorker(t, nc, 1, 4, nil) // 4 sessions of the sandbox, 2 a tenant
	run := func(tenant, session, script string, close bool) (bool, string, string, any) {
		t.Helper()
		return runTenantCall(t, nc, tenant, wire.Job{Sandbox: "default", SessionID: session, SessionClose: close, Script: script})
	}
	if ok, kind, msg, _ := run("alpha", "s1", "secret = 'alpha'\nimport os\nopen('secret.txt', 'w').write(secret)", false); !ok {
		t.Fatalf("alpha's first call: %s: %s", kind, msg)
	}
	probe := "import os\nemit_result(['secret' in globals(), os.path.exists('secret.txt')])"
	if ok, kind, msg, got := run("beta", "s1", probe, false); !ok || fmt.Sprint(got) != "[false false]" {
		t.Errorf("beta's call on alpha's session id: %v %s %s, saw %v; want a session of its own, seeing nothing", ok, kind, msg, got)
	}
	c := newSessionClient(t, nc)
	own := c.NewSession("default")
	own.ID = "s1"
	if got := mustSucceed(t, call(t, own, probe)).FinalData; fmt.Sprint(got) != "[false false]" {
		t.Errorf("the fleet's own session s1 saw %v", got)
	}
	if ok, kind, msg, _ := run("beta", "s1", "", true); !ok {
		t.Errorf("beta closing its s1: %s: %s", kind, msg)
	}
	if ok, kind, msg, got := run("alpha", "s1", "emit_result(secret)", false); !ok || got != "alpha" {
		t.Errorf("alpha's s1 after beta closed its own s1: %v %s %s, %v; want its state", ok, kind, msg, got)
	}

	// Alpha holds s1 and s2, its half of the sandbox's 4; s3 is one too many.
	if ok, kind, msg, _ := run("alpha", "s2", "x = 2", false); !ok {
		t.Fatalf("alpha's second session: %s: %s", kind, msg)
	}
	ok, kind, msg, _ := run("alpha", "s3", "x = 3", false)
	if ok || kind != wire.KindSessionLimit || !strings.Contains(msg, "of this tenant") {
		t.Errorf("alpha's third session: %v %s: %s; want session_limit naming the tenant's limit", ok, kind, msg)
	}
	if ok, kind, msg, _ := run("beta", "s9", "x = 9", false); !ok {
		t.Errorf("beta's session while alpha is at its limit: %s: %s", kind, msg)
	}
}

// runTenantCall runs job (a session call: interactive, with a new id) as tenant's
// (runTenantJob) and returns its end: success, the error's kind and text, the result.
func runTenantCall(t *testing.T, nc *nats.Conn, tenant string, job wire.Job) (bool, string, string, any) {
	t.Helper()
	job.ExecutionID, job.Mode = client.NewExecutionID(), wire.ModeInteractive
	evs := runTenantJob(t, nc, tenant, job)
	done := evs[len(evs)-1]
	kind := ""
	for _, ev := range evs {
		if ev.Type == wire.EventError {
			kind = ev.Kind
		}
	}
	return done.Success, kind, done.Error, done.FinalData
}

// TestSessionAttackATenantTakesNoWorkersEverySessionAcrossSandboxes: with a cap per
// sandbox only, a tenant opens sessions in each sandbox, each within its cap, until
// the worker holds no more (a review's attack: two sandboxes of 4 on a worker of 4).
// A tenant holds at most half of the worker's sessions in all: alpha's third is
// refused, saying so, and beta's opens.
func TestSessionAttackATenantTakesNoWorkersEverySessionAcrossSandboxes(t *testing.T) {
	_, nc := testenv.NATS(t)
	twoSandboxes(t, nc, func(c *worker.Config) { c.MaxSessions = 4 })
	for _, call := range []struct{ sandbox, session string }{{"default", "a1"}, {"second", "a2"}} {
		if ok, kind, msg, _ := runTenantCall(t, nc, "alpha", wire.Job{Sandbox: call.sandbox, SessionID: call.session, Script: "x = 1"}); !ok {
			t.Fatalf("alpha's %s of %s: %s: %s", call.session, call.sandbox, kind, msg)
		}
	}
	ok, kind, msg, _ := runTenantCall(t, nc, "alpha", wire.Job{Sandbox: "second", SessionID: "a3", Script: "x = 1"})
	if ok || kind != wire.KindSessionLimit || !strings.Contains(msg, "held 2 sessions of this tenant") {
		t.Errorf("alpha's third session, in a sandbox where it holds one: %v %s: %s; want session_limit naming the tenant's share of the worker", ok, kind, msg)
	}
	for _, sb := range []string{"default", "second"} {
		if ok, kind, msg, _ := runTenantCall(t, nc, "beta", wire.Job{Sandbox: sb, SessionID: "b-" + sb, Script: "x = 1"}); !ok {
			t.Errorf("beta's session of %s: %s: %s", sb, kind, msg)
		}
	}
}

// TestSessionAttackATenantsShareHoldsForSessionsOpenedAtOnce: each sandbox's opener
// checked the tenant's share on its own, before the session was held, so two new
// sessions in two sandboxes at once both passed (a review's attack, 3 runs of 3). A
// worker of 6 sessions (a tenant's share 3), two sandboxes: alpha holds one in each,
// then opens one more in each at once; one of them is refused.
func TestSessionAttackATenantsShareHoldsForSessionsOpenedAtOnce(t *testing.T) {
	_, nc := testenv.NATS(t)
	twoSandboxes(t, nc, func(c *worker.Config) { c.MaxSessions = 6 })
	for _, c := range []struct{ sb, id string }{{"default", "a1"}, {"second", "a2"}} {
		if ok, kind, msg, _ := runTenantCall(t, nc, "alpha", wire.Job{Sandbox: c.sb, SessionID: c.id, Script: "x = 1"}); !ok {
			t.Fatalf("alpha's %s: %s: %s", c.id, kind, msg)
		}
	}
	opened := make(chan bool, 2)
	t.Run("at once", func(t *testing.T) { // returns when both parallel calls have
		for _, c := range []struct{ sb, id string }{{"default", "a3"}, {"second", "a4"}} {
			t.Run(c.id, func(t *testing.T) {
				t.Parallel()
				ok, kind, msg, _ := runTenantCall(t, nc, "alpha", wire.Job{Sandbox: c.sb, SessionID: c.id, Script: "x = 1"})
				t.Logf("alpha's %s: %v %s %s", c.id, ok, kind, msg)
				opened <- ok
			})
		}
	})
	close(opened)
	n := 2
	for ok := range opened {
		if ok {
			n++
		}
	}
	if n != 3 {
		t.Errorf("alpha holds %d sessions of a worker of 6; want its share, 3", n)
	}
}

// eventCounts returns how many events of each type the execution has in the events
// stream.
func eventCounts(t *testing.T, js jetstream.JetStream, id string) map[string]uint64 {
	t.Helper()
	stream, ctx, cancel := fleetEvents(t, js)
	defer cancel()
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(wire.EventsWildcard(id)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for subj, n := range info.State.Subjects {
		out[subj[len(wire.SubjectPrefixEvents)+len(id)+2:]] = n
	}
	return out
}

// TestASessionSlowToOpenIsNotTakenForDead: worker A claims a session while its only
// container is busy with a stateless job, and waits for it (up to the ack wait). A
// review found that nothing wrote the session's entry meanwhile (its touch started
// once the session served): worker B's rescuer saw an open entry unwritten for 15 s
// and ended the session as if A had died, its first call got session_lost, and A,
// once it had its container, ran a later call of the ended session. The entry is
// written from the claim on, and a session the fleet ended while it was being opened
// is not served.
func TestASessionSlowToOpenIsNotTakenForDead(t *testing.T) {
	_, nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	slow := func(c *worker.Config) { c.AckWait, c.Heartbeat = 60*time.Second, 5*time.Second }
	testworker.Start(t, nc, testworker.Options{ID: newID("slowopen"), Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: slow})
	c := newSessionClient(t, nc)
	busy, err := c.Submit(t.Context(), wire.Job{Sandbox: "default", Script: "import time\ntime.sleep(32)", TimeoutSec: 90})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waitWithin(t, busy, 2*time.Minute) })
	testenv.WaitFor(t, 30*time.Second, "the busy job to start", func() bool { return eventCounts(t, js, busy.ID)[wire.EventStarted] > 0 })
	s := c.NewSession("default")
	first := publishCalls(t, js, s.ID, 1, "x = 1\nemit_result(1)")
	opened := time.Now()
	testworker.Start(t, nc, testworker.Options{ID: newID("rescuer"), Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: slow})
	testenv.WaitFor(t, 90*time.Second, "A's session consumer", func() bool {
		_, err := js.Consumer(t.Context(), wire.StreamSessions, wire.SessionConsumerName("", s.ID))
		return err == nil
	})
	t.Logf("the session's consumer exists %v after the first call", time.Since(opened).Round(time.Second))
	later := publishCalls(t, js, s.ID, 3, "import time\ntime.sleep(1)\nemit_result(2)")
	waitForEnds(t, js, append(first, later...), time.Minute, "calls of the slowly opened session")
	time.Sleep(10 * time.Second) // late second ends
	kv, err := js.KeyValue(t.Context(), worker.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(t.Context(), s.ID); err == nil {
		t.Logf("entry: %s", e.Value())
	}
	for i, id := range append(first, later...) {
		n := eventCounts(t, js, id)
		t.Logf("call %d: %v", i+1, n)
		stream, _ := js.Stream(t.Context(), wire.StreamEvents)
		for _, typ := range []string{wire.EventError, wire.EventScriptDone} {
			if m, err := stream.GetLastMsgForSubject(t.Context(), wire.EventSubject(id, typ)); err == nil {
				t.Logf("  %s: %s", typ, m.Data)
			}
		}
		if n[wire.EventScriptDone] > 1 {
			t.Errorf("call %d has %d ends", i+1, n[wire.EventScriptDone])
		}
		if i == 0 && n[wire.EventStarted] == 0 {
			t.Errorf("call 1, of a live worker's session, did not run: %v", n)
		}
		if i > 0 && n[wire.EventStarted] > 0 && eventCounts(t, js, first[0])[wire.EventStarted] == 0 {
			t.Errorf("call %d ran in a session whose first call got session_lost", i+1)
		}
	}
}
