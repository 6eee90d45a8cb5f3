package nats_test

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
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestAnAgentMaySubmitCancelAndReadButNothingElse runs a server with auth.conf, a
// worker with the worker identity and an agent of the tenant "agents". The agent's
// job runs; then the agent plays a hostile client: forging an event, asking who runs
// an execution, deleting a worker's liveness key, deleting the jobs stream, forging a
// max-deliveries advisory, acking a job, taking jobs with a consumer of its own, and
// making the server publish for it (requests whose reply subjects are the subject
// that cancels a running execution and the workers' liveness key). Each is
// refused by the server or lands in the agent's own account, changes nothing of the
// fleet's, and the fleet serves the next job.
func TestAnAgentMaySubmitCancelAndReadButNothingElse(t *testing.T) {
	workerSeed, workerPub := testenv.UserKey(t)
	agentSeed, agentPub := testenv.UserKey(t)
	t.Setenv("JAZZMINE_WORKER_NKEY", workerPub)
	t.Setenv("JAZZMINE_AGENT_NKEY", agentPub)
	srv := testenv.AuthServer(t, "auth.conf")

	if _, err := nats.Connect(srv.ClientURL()); err == nil || !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect without credentials: err = %v, want an authorization violation", err)
	}

	wnc := connectAs(t, srv.ClientURL(), workerSeed, nil)
	wid := startAuthWorker(t, wnc)
	wjs, err := jetstream.New(wnc)
	if err != nil {
		t.Fatal(err)
	}

	violations := make(chan error, 16)
	anc := connectAs(t, srv.ClientURL(), agentSeed, func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			violations <- err
		}
	})
	c, err := client.New(client.Config{Conn: anc})
	if err != nil {
		t.Fatal(err)
	}
	run := func(script string) *client.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: script})
		if err != nil {
			t.Fatalf("run a job as the agent: %v", err)
		}
		if !res.Success {
			t.Fatalf("the agent's job failed: %+v", res)
		}
		return res
	}
	res := run("emit_result(6 * 7)")

	// violated waits for the permissions violation of the agent's publish on subject
	// (a JetStream API request is a publish too).
	violated := func(what, subject string) {
		t.Helper()
		select {
		case err := <-violations:
			if !strings.Contains(err.Error(), `"`+subject+`"`) {
				t.Errorf("%s: the violation names another subject: %v", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s: no permissions violation for %s", what, subject)
		}
	}
	// refused publishes: each is a permissions violation reported to the agent.
	refused := func(what, subject string, hdr nats.Header) {
		t.Helper()
		if err := anc.PublishMsg(&nats.Msg{Subject: subject, Header: hdr, Data: []byte(`{"forged":true}`)}); err != nil {
			t.Fatalf("%s: publish: %v", what, err)
		}
		if err := anc.Flush(); err != nil {
			t.Fatalf("%s: flush: %v", what, err)
		}
		violated(what, subject)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	events, err := wjs.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	// In the fleet's account the tenant's events carry its token.
	resultSubject := wire.EventSubject("agents."+res.ExecutionID, wire.EventFinalResult)
	before := testenv.StoredMsg(t, events, resultSubject)
	refused("forge the execution's result", wire.EventSubject(res.ExecutionID, wire.EventFinalResult), nats.Header{wire.HeaderContentType: {wire.ContentTypeJSON}})
	after, err := events.GetLastMsgForSubject(ctx, resultSubject)
	if err != nil || after.Sequence != before.Sequence {
		t.Errorf("the execution's final_result changed: seq %d, then %v (err %v)", before.Sequence, after, err)
	}

	heard := make(chan *nats.Msg, 1)
	sub, err := wnc.ChanSubscribe("jazzmine.internal.running.x", heard)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := wnc.Flush(); err != nil {
		t.Fatal(err)
	}
	refused("ask who runs an execution", "jazzmine.internal.running.x", nil)

	workers, err := wjs.KeyValue(ctx, worker.BucketWorkers)
	if err != nil {
		t.Fatal(err)
	}
	ajs, err := jetstream.New(anc)
	if err != nil {
		t.Fatal(err)
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }
	sctx, scancel := short()
	if _, err := ajs.KeyValue(sctx, worker.BucketWorkers); err == nil {
		t.Error("the agent opened the workers' liveness bucket")
	}
	scancel()
	violated("open the workers' liveness bucket", "$JS.API.STREAM.INFO.KV_"+worker.BucketWorkers)
	refused("delete a worker's liveness key", "$KV."+worker.BucketWorkers+"."+wid, nats.Header{"KV-Operation": {"DEL"}})
	if _, err := workers.Get(ctx, wid); err != nil {
		t.Errorf("the worker's liveness key: %v", err)
	}
	// A forged catalog entry would tell other agents' models what to call.
	refused("put a sandbox's catalog entry", "$KV."+wire.SandboxesBucket+".default", nil)

	sctx, scancel = short()
	if err := ajs.DeleteStream(sctx, wire.StreamExec); err == nil {
		t.Error("the agent deleted the jobs stream")
	}
	scancel()
	violated("delete the jobs stream", "$JS.API.STREAM.DELETE."+wire.StreamExec)
	if _, err := wjs.Stream(ctx, wire.StreamExec); err != nil {
		t.Errorf("the jobs stream: %v", err)
	}
	refused("delete the jobs stream by a plain request", "$JS.API.STREAM.DELETE."+wire.StreamExec, nil)

	sctx, scancel = short()
	if _, err := ajs.CreateOrUpdateConsumer(sctx, wire.StreamExec, jetstream.ConsumerConfig{Durable: "thief", FilterSubject: wire.ExecSubject("default")}); err == nil {
		t.Error("the agent made a consumer of the jobs stream")
	}
	scancel()
	violated("take jobs with a consumer of its own", "$JS.API.CONSUMER.CREATE."+wire.StreamExec+".thief."+wire.ExecSubject("default"))

	refused("forge a max-deliveries advisory",
		"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+wire.StreamExec+"."+wire.ConsumerName("default"), nil)
	refused("ack a job", "$JS.ACK."+wire.StreamExec+"."+wire.ConsumerName("default")+".1.1.1.1700000000000000000.0", nil)
	refused("nak a job", "$JS.ACK."+wire.StreamExec+"."+wire.ConsumerName("default")+".1.2.2.1700000000000000000.0", nil)

	// What the server publishes on the agent's behalf (its answer to a request, on
	// the reply subject the agent names) stays in the agent's account. Aimed at the
	// subject on which workers cancel a running execution (the agent's own, running
	// now, under either form of its key) and at the worker's liveness key, it reaches
	// neither. In a single account both land: the worker cancels the job, and the key
	// takes the answer as its value.
	liveness, err := workers.Watch(ctx, wid, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer liveness.Stop()
	target, err := c.Submit(ctx, wire.Job{Sandbox: "default", TimeoutSec: 60,
		Script: "print('up', flush=True)\nimport time\ntime.sleep(2)\nemit_result('not cancelled')"})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	for ev := range target.Events() {
		if ev.Type == wire.EventStdout {
			break // running
		}
	}
	for _, reply := range []string{"jazzmine.internal.running." + target.ID, "jazzmine.internal.running.agents." + target.ID,
		"jazzmine.internal.running.x", "$KV." + worker.BucketWorkers + "." + wid} {
		if err := anc.PublishRequest("$JS.API.CONSUMER.INFO."+wire.StreamEvents+".nosuch", reply, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	if res, err := target.Wait(ctx); err != nil || !res.Success || res.FinalData != "not cancelled" {
		t.Errorf("the job the redirected answers aimed at: %+v, %v; want it run to its result", res, err)
	}
	for drained := false; !drained; {
		select {
		case e := <-liveness.Updates():
			if _, err := time.Parse(time.RFC3339, string(e.Value())); err != nil || e.Operation() != jetstream.KeyValuePut {
				t.Errorf("the worker's liveness key got %s %.80q, not the worker's time", e.Operation(), e.Value())
			}
		default:
			drained = true
		}
	}

	// A cancel is the agent's to send (of an execution that ended: it changes nothing).
	if err := c.Cancel(ctx, res.ExecutionID); err != nil {
		t.Errorf("cancel as the agent: %v", err)
	}
	select {
	case m := <-heard:
		t.Errorf("a worker heard the agent on %s", m.Subject)
	default:
	}
	select {
	case err := <-violations:
		t.Errorf("a violation nothing asked for: %v", err)
	default:
	}

	run("emit_result('still serving')")
}

// connectAs connects to url with the nkey seed, as `worker serve --nkey` does: from a
// seed file.
func connectAs(t *testing.T, url string, seed []byte, onErr nats.ErrHandler) *nats.Conn {
	t.Helper()
	return testenv.ConnectSeed(t, url, testenv.WriteSeed(t, seed), onErr)
}

// startAuthWorker runs a worker of the example "default" sandbox on nc until the end
// of the test, and returns its id.
func startAuthWorker(t *testing.T, nc *nats.Conn) string {
	t.Helper()
	id := fmt.Sprintf("test-auth-%d", time.Now().UnixNano())
	testworker.Start(t, nc, testworker.Options{ID: id, Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	return id
}

// twoTenantServer starts a server with the tenants a and b, and one worker; it
// returns the worker's and the tenants' connections.
func twoTenantServer(t *testing.T, a, b string) (wnc, anc, bnc *nats.Conn) {
	t.Helper()
	return twoTenantServerWith(t, a, b, nil)
}

// twoTenantServerWith is twoTenantServer with tweak applied to the worker's config.
func twoTenantServerWith(t *testing.T, a, b string, tweak func(*worker.Config)) (wnc, anc, bnc *nats.Conn) {
	t.Helper()
	return twoTenantServerPool(t, a, b, sandboxpool.Sandbox{PoolSize: 1}, tweak)
}

// twoTenantServerPool is twoTenantServerWith with the sandbox's pool settings in sb.
func twoTenantServerPool(t *testing.T, a, b string, sb sandboxpool.Sandbox, tweak func(*worker.Config)) (wnc, anc, bnc *nats.Conn) {
	t.Helper()
	url, workerSeed, seeds := testenv.TenantsNATS(t, a, b)
	wnc = testenv.ConnectSeed(t, url, workerSeed, nil)
	testworker.Start(t, wnc, testworker.Options{ID: fmt.Sprintf("test-auth-%d", time.Now().UnixNano()), Sandbox: sb, Worker: tweak})
	return wnc, testenv.ConnectSeed(t, url, seeds[a], nil), testenv.ConnectSeed(t, url, seeds[b], nil)
}

// tenantClient is a Go client on nc, a tenant's connection.
func tenantClient(t *testing.T, nc *nats.Conn) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTwoTenantsCannotSeeOrCancelEachOther runs a fleet for two tenants, alpha and
// beta, from the configuration `worker nats-auth` renders. Beta, hostile, knows the
// id of alpha's running execution: it listens to every event it may, reads its
// events stream, cancels the id and asks for its events again. Beta sees nothing of alpha's, alpha's job runs
// to its result, and each tenant's cancel still reaches its own jobs.
func TestTwoTenantsCannotSeeOrCancelEachOther(t *testing.T) {
	_, anc, bnc := twoTenantServer(t, "alpha", "beta")
	alpha, beta := tenantClient(t, anc), tenantClient(t, bnc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Beta has run a job of its own (its events stream exists), and listens.
	own, err := beta.Run(ctx, wire.Job{Sandbox: "default", Script: "emit_result('beta')"})
	if err != nil || !own.Success {
		t.Fatalf("beta's job: %+v, %v", own, err)
	}
	heard := make(chan *nats.Msg, 256)
	sub, err := bnc.ChanSubscribe(wire.AllEventsWildcard, heard)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	e, err := alpha.Submit(ctx, wire.Job{Sandbox: "default", Script: "print('alpha-secret', flush=True)\nimport time\ntime.sleep(3)\nemit_result('alpha done')", TimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for ev := range e.Events() {
		if ev.Type == wire.EventStdout {
			break // running
		}
	}
	if err := beta.Cancel(ctx, e.ID); err != nil {
		t.Fatalf("beta's cancel: %v", err)
	}
	// Beta asks the fleet to carry its events, and reaches for the fleet's API under
	// the prefix its stream's source uses: its own consumer's reset is all there is.
	if m, err := bnc.Request(wire.SubjectSource, nil, 10*time.Second); err != nil || m.Header.Get(wire.HeaderError) != "" {
		t.Errorf("beta's source request: %v, %v", m, err)
	}
	for _, subject := range []string{
		wire.SourceAPIPrefix + ".CONSUMER.RESET.JAZZMINE_EVENTS." + wire.TenantEventsConsumer("alpha"),
		wire.SourceAPIPrefix + ".CONSUMER.CREATE.JAZZMINE_EVENTS",
		wire.SourceAPIPrefix + ".STREAM.INFO.JAZZMINE_EVENTS",
	} {
		if m, err := bnc.Request(subject, []byte(`{"seq":1}`), 2*time.Second); err == nil {
			t.Errorf("beta's request on %s was answered: %q", subject, m.Data)
		}
	}
	res, err := e.Wait(ctx)
	if err != nil || !res.Success || res.FinalData != "alpha done" {
		t.Errorf("alpha's execution after beta's cancel: %+v, %v; want its result", res, err)
	}
	// Beta may hear its own job's events: nothing else.
	for len(heard) > 0 {
		if m := <-heard; !strings.HasPrefix(m.Subject, strings.TrimSuffix(wire.EventsWildcard(own.ExecutionID), ">")) {
			t.Errorf("beta heard %s: %.80q", m.Subject, m.Data)
		}
	}
	bjs, err := jetstream.New(bnc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := bjs.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(wire.EventsWildcard(e.ID)))
	if err != nil || len(info.State.Subjects) != 0 {
		t.Errorf("beta's events stream holds alpha's events: %v, %v", info.State.Subjects, err)
	}

	// Each tenant's own cancel goes through.
	for name, c := range map[string]*client.Client{"alpha": alpha, "beta": beta} {
		e, err := c.Submit(ctx, wire.Job{Sandbox: "default", Script: "print('up', flush=True)\nimport time\ntime.sleep(60)", TimeoutSec: 120})
		if err != nil {
			t.Fatal(err)
		}
		for ev := range e.Events() {
			if ev.Type == wire.EventStdout {
				break
			}
		}
		if err := e.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		res, err := e.Wait(ctx)
		if err != nil || res.ErrorKind != wire.KindCancelled {
			t.Errorf("%s's cancel of its own job: %+v, %v; want it cancelled", name, res, err)
		}
		e.Close()
	}
}

// TestJobsNoWorkerCanTakeAreRefusedAtPublish: a tenant's agent publishes jobs for a
// sandbox nobody serves and on job subjects no consumer can ever match (a literal
// wildcard token, a character no sandbox name has). Stored, they would hold the
// jobs stream's room for good; through the tenant's import as in the fleet's
// account, the server finds no stream for them and refuses each publish at once,
// and the jobs beside them run.
func TestJobsNoWorkerCanTakeAreRefusedAtPublish(t *testing.T) {
	workerSeed, workerPub := testenv.UserKey(t)
	agentSeed, agentPub := testenv.UserKey(t)
	t.Setenv("JAZZMINE_WORKER_NKEY", workerPub)
	t.Setenv("JAZZMINE_AGENT_NKEY", agentPub)
	srv := testenv.AuthServer(t, "auth.conf")
	wnc := connectAs(t, srv.ClientURL(), workerSeed, nil)
	startAuthWorker(t, wnc)
	anc := connectAs(t, srv.ClientURL(), agentSeed, nil)
	c, err := client.New(client.Config{Conn: anc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A job that waits in the queue meanwhile: the one slot is busy.
	busy, err := c.Submit(ctx, wire.Job{Sandbox: "default", Script: "import time\ntime.sleep(3)\nemit_result('busy')"})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	queued, err := c.Submit(ctx, wire.Job{Sandbox: "default", Script: "emit_result('queued')"})
	if err != nil {
		t.Fatal(err)
	}
	defer queued.Close()
	if _, err := c.Submit(ctx, wire.Job{Sandbox: "nosuch", Script: "emit_result(1)"}); !errors.Is(err, client.ErrUnknownSandbox) {
		t.Errorf("a tenant's job for a sandbox nobody serves: %v; want ErrUnknownSandbox", err)
	}
	ajs, err := jetstream.New(anc)
	if err != nil {
		t.Fatal(err)
	}
	for i, subject := range []string{"jazzmine.exec.*", "jazzmine.exec.>", "jazzmine.exec.x!y"} {
		msg := nats.NewMsg(subject)
		msg.Header.Set(wire.HeaderMsgID, fmt.Sprintf("junk-%d", i))
		msg.Data = []byte(`{"script":"pass"}`)
		if _, err := ajs.PublishMsg(ctx, msg); !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Errorf("a job on %s: %v; want no stream response", subject, err)
		}
	}
	stream := fleetStream(t, wnc, wire.StreamExec)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	for s, n := range info.State.Subjects {
		if s != "jazzmine.exec.agents.default" {
			t.Errorf("the jobs stream holds %d messages on %s", n, s)
		}
	}
	for _, e := range []*client.Execution{busy, queued} {
		if res, err := e.Wait(ctx); err != nil || !res.Success {
			t.Errorf("a job beside the junk: %+v, %v", res, err)
		}
	}
}

// TestATenantCannotFillTheBacklogForAnother: alpha, hostile or careless, queues jobs
// until the fleet refuses them. The backlog's bound per tenant and sandbox
// (tenant_backlog) refuses alpha's excess alone: beta's jobs are still taken, and
// run. (Before it, one tenant that filled max_backlog had every other tenant's
// submit refused.)
func TestATenantCannotFillTheBacklogForAnother(t *testing.T) {
	_, anc, bnc := twoTenantServerWith(t, "alpha", "beta", func(c *worker.Config) { c.MaxBacklog, c.TenantBacklog = 8, 4 })
	alpha, err := client.New(client.Config{Conn: anc})
	if err != nil {
		t.Fatal(err)
	}
	beta, err := client.New(client.Config{Conn: bnc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var accepted []*client.Execution
	defer func() {
		for _, e := range accepted {
			e.Close()
		}
	}()
	for i := 0; ; i++ {
		script := "emit_result('alpha')"
		if i == 0 {
			script = "import time\ntime.sleep(5)\nemit_result('alpha')" // holds the one slot
		}
		e, err := alpha.Submit(ctx, wire.Job{Sandbox: "default", Script: script})
		if errors.Is(err, client.ErrBacklogFull) {
			t.Logf("alpha's job %d refused: %v", i+1, err)
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		accepted = append(accepted, e)
		if i == 50 {
			t.Fatal("alpha queued 50 jobs: nothing bounds a tenant's backlog")
		}
	}
	if len(accepted) > 5 {
		t.Errorf("alpha had %d jobs accepted, want at most its 4 queued and the running one", len(accepted))
	}
	res, err := beta.Run(ctx, wire.Job{Sandbox: "default", Script: "emit_result('beta')"})
	if err != nil || !res.Success {
		t.Fatalf("beta's job while alpha's backlog is full: %+v, %v", res, err)
	}
	for _, e := range accepted {
		if res, err := e.Wait(ctx); err != nil || !res.Success {
			t.Errorf("alpha's accepted job: %+v, %v", res, err)
		}
	}
}

// TestATenantsStorageIsBounded: an agent that makes its account's events stream
// itself, asking for more storage than its account has (to fill the servers' disks
// for everyone), is refused; the account's limits stand whatever the stream asks.
func TestATenantsStorageIsBounded(t *testing.T) {
	_, workerPub := testenv.UserKey(t)
	agentSeed, agentPub := testenv.UserKey(t)
	t.Setenv("JAZZMINE_WORKER_NKEY", workerPub)
	t.Setenv("JAZZMINE_AGENT_NKEY", agentPub)
	srv := testenv.AuthServer(t, "auth.conf")
	ajs, err := jetstream.New(connectAs(t, srv.ClientURL(), agentSeed, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = ajs.CreateStream(ctx, jetstream.StreamConfig{Name: wire.StreamEvents, Subjects: []string{wire.AllEventsWildcard}, MaxBytes: 3 << 30})
	if err == nil {
		t.Fatal("the agent made an events stream of 3 GiB, more than its account's 2 GB")
	}
	t.Logf("refused: %v", err)
	if _, err := ajs.CreateStream(ctx, jetstream.StreamConfig{Name: wire.StreamEvents, Subjects: []string{wire.AllEventsWildcard}, MaxBytes: 1 << 30}); err != nil {
		t.Fatalf("an events stream within the account's limits: %v", err)
	}
}

// TestATenantReadsItsOwnArtifactsAndNoOthers: each tenant's artifacts are in a bucket
// of its own in the fleet's account, which its agents read from the workers, a chunk
// a request on jazzmine.files. Alpha downloads its artifact whole. Beta, hostile and
// knowing where alpha's artifact is, asks for it with the client, with a chunk
// request of its own, on the subject the fleet's account sees, and through the
// fleet's JetStream API; alpha itself asks more of the fleet than a chunk: a direct
// get of a whole bucket in one request (which an import of the JetStream API would
// have let it make, reading up to a bucket's bytes into the server's memory each
// time), a consumer (whose deliver subject would make the fleet's account publish
// where alpha chose), a purge, a write. Each is refused or gets one chunk; both
// tenants' artifacts are still there.
func TestATenantReadsItsOwnArtifactsAndNoOthers(t *testing.T) {
	wnc, anc, bnc := twoTenantServer(t, "alpha", "beta")
	alpha, beta := tenantClient(t, anc), tenantClient(t, bnc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	secret := strings.Repeat("alpha's secret ", 40_000) // 600 KB: several chunks
	run := func(c *client.Client, who, text string, times int) *client.Artifact {
		t.Helper()
		res, err := c.Run(ctx, wire.Job{Sandbox: "default", Mode: wire.ModeInteractive,
			Script: fmt.Sprintf("import os\nos.makedirs('out')\nopen('out/report.txt', 'w').write(%q * %d)", text, times)})
		if err != nil || !res.Success || len(res.Artifacts) != 1 {
			t.Fatalf("%s's job: %+v, %v", who, res, err)
		}
		return &res.Artifacts[0]
	}
	art := run(alpha, "alpha", "alpha's secret ", 40_000)
	if art.Bucket != wire.TenantFilesBucket("alpha") {
		t.Errorf("alpha's artifact is in %s, want its own bucket %s", art.Bucket, wire.TenantFilesBucket("alpha"))
	}
	var got strings.Builder
	if err := alpha.Download(ctx, art, &got); err != nil || got.String() != secret {
		t.Fatalf("alpha's download of its artifact: %d bytes, %v; want the %d it wrote", got.Len(), err, len(secret))
	}
	// The catalog, whose bucket a tenant does not reach, comes from the workers.
	var listed []client.SandboxInfo
	var err error
	for deadline := time.Now().Add(30 * time.Second); len(listed) == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if listed, err = alpha.Sandboxes(ctx); err != nil {
			t.Fatalf("alpha's list of the sandboxes: %v", err)
		}
	}
	if len(listed) != 1 || listed[0].Sandbox != "default" || len(listed[0].Tools) == 0 {
		t.Errorf("alpha's list of the sandboxes: %+v; want the default sandbox with its tools", listed)
	}
	// A client of the fleet's account with the worker's identity (as `worker mcp` may
	// run) asks the workers as well, on jazzmine.sandboxes in the fleet's account.
	start := time.Now()
	if listed, err = tenantClient(t, wnc).Sandboxes(ctx); err != nil || len(listed) != 1 {
		t.Errorf("the fleet account's list of the sandboxes: %+v, %v", listed, err)
	}
	t.Logf("the fleet account's list of the sandboxes took %v", time.Since(start).Round(time.Millisecond))
	// Its next job reads it as an input, from its own bucket.
	next, err := alpha.Run(ctx, wire.Job{Sandbox: "default", Files: []wire.File{art.Input("report.txt")}, Script: "emit_result(len(open('report.txt').read()))"})
	if err != nil || !next.Success || next.FinalData != int64(len(secret)) {
		t.Errorf("alpha's next job with its artifact as an input: %+v, %v; want its %d bytes", next, err, len(secret))
	}
	own := run(beta, "beta", "beta's own", 1)
	got.Reset()
	if err := beta.Download(ctx, own, &got); err != nil || got.String() != "beta's own" {
		t.Errorf("beta's download of its own artifact: %q, %v", got.String(), err)
	}

	// Beta goes for alpha's artifact.
	got.Reset()
	if err := beta.Download(ctx, art, &got); err == nil || strings.Contains(got.String(), "secret") {
		t.Errorf("BROKEN: beta downloaded alpha's artifact: %d bytes, %v", got.Len(), err)
	} else {
		t.Logf("beta's download of alpha's artifact: %v", err)
	}
	req := func(object string) []byte {
		b, _ := json.Marshal(wire.ChunkRequest{Object: object})
		return b
	}
	// A name whose lookup is a line longer than the server takes closed the worker's
	// connection for good (a review's attack): refused, and the worker stays.
	if m, err := bnc.Request(wire.SubjectFiles, req(strings.Repeat("A", 3500)), 10*time.Second); err != nil || m.Header.Get(wire.HeaderError) == "" {
		t.Errorf("beta's chunk request with a 3,500-byte name: %v; want an error", err)
	}
	if m, err := bnc.Request(wire.SubjectFiles, req(art.Object), 10*time.Second); err != nil || len(m.Data) != 0 || m.Header.Get(wire.HeaderError) == "" {
		t.Errorf("BROKEN: beta's chunk request for alpha's object: %v; want an error, no bytes", err)
	} else {
		t.Logf("beta's chunk request for alpha's object: %s", m.Header.Get(wire.HeaderError))
	}
	meta := "$O." + art.Bucket + ".M.>"
	for subj, body := range map[string][]byte{
		wire.SubjectFiles + ".alpha":                        req(art.Object),
		"$JS.API.DIRECT.GET.OBJ_" + art.Bucket:              []byte(`{"seq":1}`),
		"$JS.API.DIRECT.GET.OBJ_" + art.Bucket + "." + meta: nil,
		"$JS.jazzmine.API.DIRECT.GET.OBJ_" + art.Bucket:     []byte(`{"seq":1}`),
		"$JS.jazzmine.API.STREAM.INFO.OBJ_" + art.Bucket:    nil,
		"$JS.API.STREAM.INFO.OBJ_" + wire.FilesBucket:       nil,
	} {
		if m, err := bnc.Request(subj, body, time.Second); err == nil && len(m.Data) > 0 && !strings.Contains(string(m.Data), `"error"`) {
			t.Errorf("BROKEN: beta's request on %s was answered: %.200q %v", subj, m.Data, m.Header)
		}
	}

	// Alpha asks more of the fleet than a chunk.
	m, err := anc.Request(wire.SubjectFiles, []byte(`{"object":"`+art.Object+`","from":0,"batch":100000000,"max_bytes":1099511627776}`), 10*time.Second)
	if err != nil || len(m.Data) == 0 || len(m.Data) > 128<<10 {
		t.Errorf("alpha's request for its whole object at once: %v; want one chunk of at most 128 KiB", err)
	}
	for subj, body := range map[string]string{
		"$JS.jazzmine.API.DIRECT.GET.OBJ_" + art.Bucket:                `{"seq":1,"batch":100000000,"max_bytes":1099511627776}`,
		"$JS.API.DIRECT.GET.OBJ_" + art.Bucket:                         `{"seq":1,"batch":100000000,"max_bytes":1099511627776}`,
		"$JS.jazzmine.API.CONSUMER.CREATE.OBJ_" + art.Bucket + ".evil": `{"stream_name":"OBJ_` + art.Bucket + `","config":{"name":"evil","deliver_subject":"jazzmine.internal.x"}}`,
		"$JS.API.CONSUMER.CREATE.OBJ_" + art.Bucket:                    `{"stream_name":"OBJ_` + art.Bucket + `","config":{"deliver_subject":"jazzmine.internal.x"}}`,
		"$JS.API.STREAM.PURGE.OBJ_" + art.Bucket:                       `{}`,
		"$JS.API.STREAM.MSG.DELETE.OBJ_" + art.Bucket:                  `{"seq":1}`,
		"$O." + art.Bucket + ".C.forged":                               `forged`,
		"$JS.API.STREAM.INFO.OBJ_" + wire.TenantFilesBucket("beta"):    ``,
	} {
		if m, err := anc.Request(subj, []byte(body), time.Second); err == nil && !strings.Contains(string(m.Data), `"error"`) {
			t.Errorf("BROKEN: alpha's request on %s was answered: %.200q", subj, m.Data)
		}
	}
	// A burst of alpha's own chunk requests, their answers unread, takes its rate: its
	// download right after still completes (the client asks again while the workers
	// say busy: client TestATenantsDownloadAsksChunkAfterChunk).
	for range 2000 {
		if err := anc.PublishRequest(wire.SubjectFiles, "nobody.reads.this", req(art.Object)); err != nil {
			t.Fatal(err)
		}
	}
	got.Reset()
	start = time.Now()
	err = alpha.Download(ctx, art, &got)
	t.Logf("alpha's download right after 2,000 chunk requests of its own: %v, %v", time.Since(start).Round(time.Millisecond), err)
	if err != nil || got.String() != secret {
		t.Errorf("alpha's download right after its own burst: %d bytes, %v", got.Len(), err)
	}
	for who, c := range map[string]*client.Client{"alpha": alpha, "beta": beta} {
		a, want := art, secret
		if who == "beta" {
			a, want = own, "beta's own"
		}
		got.Reset()
		if err := c.Download(ctx, a, &got); err != nil || got.String() != want {
			t.Errorf("%s's artifact after the attempts: %d bytes, %v", who, got.Len(), err)
		}
	}
}

// TestTenantsHaveSessionsOfTheirOwn runs two tenants' sessions under the configuration
// `worker nats-auth` renders. Alpha's session keeps its state between calls, through
// the Go client as it is. Beta, hostile, knows alpha's session id: its calls under
// that id run in a session of its own, which sees nothing of alpha's, and closing it
// leaves alpha's open; a call it publishes on the subject alpha's calls have in the
// fleet's account goes nowhere; calls on subjects that name no session are removed
// from the sessions stream rather than hold its room. Each tenant's calls are stored
// under its own token.
func TestTenantsHaveSessionsOfTheirOwn(t *testing.T) {
	wnc, anc, bnc := twoTenantServerPool(t, "alpha", "beta", sandboxpool.Sandbox{PoolSize: 1, MaxOverflow: 2}, nil)
	alpha, beta := tenantClient(t, anc), tenantClient(t, bnc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	call := func(s *client.Session, who, script string) *client.Result {
		t.Helper()
		res, err := s.Run(ctx, wire.Job{Mode: wire.ModeInteractive, Script: script})
		if err != nil {
			t.Fatalf("%s's call: %v", who, err)
		}
		return res
	}
	as := alpha.NewSession("default")
	if res := call(as, "alpha", "secret = 'alpha'\nopen('secret.txt', 'w').write(secret)"); !res.Success {
		t.Fatalf("alpha's first call: %+v", res)
	}
	if res := call(as, "alpha", "emit_result(secret)"); !res.Success || res.FinalData != "alpha" {
		t.Fatalf("alpha's second call: %+v; want the first call's state", res)
	}

	bs := beta.NewSession("default")
	bs.ID = as.ID
	probe := "import os\nemit_result(['secret' in globals(), os.path.exists('secret.txt')])"
	if res := call(bs, "beta", probe); !res.Success || fmt.Sprint(res.FinalData) != "[false false]" {
		t.Errorf("BROKEN: beta's call under alpha's session id: %+v; want a session of its own that sees nothing", res)
	}
	if err := bs.Close(ctx); err != nil {
		t.Errorf("beta's close of its session: %v", err)
	}
	// Beta names alpha's session as the fleet's account sees it: in beta's account
	// that subject is no import, and beta may not publish it.
	bjs, err := jetstream.New(bnc)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := json.Marshal(wire.Job{ExecutionID: client.NewExecutionID(), Sandbox: "default", SessionID: as.ID, Script: "secret = 'beta'"})
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	if _, err := bjs.PublishMsg(pctx, &nats.Msg{Subject: wire.TenantSessionSubject("alpha", "default", as.ID), Data: forged, Header: nats.Header{wire.HeaderContentType: {wire.ContentTypeJSON}}}); err == nil {
		t.Errorf("BROKEN: beta's call on alpha's subject in the fleet's account was stored")
	}
	pcancel()
	if res := call(as, "alpha", "emit_result(secret)"); !res.Success || res.FinalData != "alpha" {
		t.Errorf("alpha's session after beta's attempts: %+v; want its own state", res)
	}

	// Subjects that name no session: a literal '*' for the sandbox or the session.
	stray := []string{"jazzmine.session.*.x", "jazzmine.session.default.*"}
	for _, subject := range stray {
		if err := bnc.PublishMsg(&nats.Msg{Subject: subject, Data: forged, Header: nats.Header{wire.HeaderMsgID: {client.NewExecutionID()}}}); err != nil {
			t.Fatal(err)
		}
	}
	sessions := fleetStream(t, wnc, wire.StreamSessions)
	var held map[string]uint64
	testenv.WaitFor(t, 30*time.Second, "the calls on subjects that name no session to leave the sessions stream", func() bool {
		info, err := sessions.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			return false
		}
		held = info.State.Subjects
		for subject := range held {
			if strings.Contains(subject, "*") {
				return false
			}
		}
		return true
	})
	for subject := range held {
		if !strings.HasPrefix(subject, "jazzmine.session.alpha.default.") {
			t.Errorf("the sessions stream holds %s", subject)
		}
	}
	if err := as.Close(ctx); err != nil {
		t.Errorf("alpha's close: %v", err)
	}
	if res := call(as, "alpha", "emit_result(secret)"); res.Success || res.ErrorKind != wire.KindSessionLost {
		t.Errorf("alpha's call after its close: %+v; want session_lost", res)
	}
}

// TestSessionCallsNoWorkerCanTakeDoNotHoldTheStream: beta publishes session calls no
// opener can take (a literal '*' for the sandbox or the session, a sandbox nobody
// serves), each on a subject of its own, so that no per-session bound holds them,
// and they would fill the sessions stream for every tenant until its max age (a
// review's attacks). Some while no worker runs; then floods, each led by duplicates
// of one id. The sessions stream takes the subjects of the served sandboxes only: the
// server refuses them at publish, but for a literal '*' session of a served sandbox,
// one subject, which the opener deletes. The stream holds none of them, and alpha's
// session, on a stream of 1,000 calls, runs.
func TestSessionCallsNoWorkerCanTakeDoNotHoldTheStream(t *testing.T) {
	url, workerSeed, seeds := testenv.TenantsNATS(t, "alpha", "beta")
	wnc := testenv.ConnectSeed(t, url, workerSeed, nil)
	bounded := func(c *worker.Config) { c.MaxBacklog = 1000 }
	first, _ := testworker.Start(t, wnc, testworker.Options{ID: fmt.Sprintf("test-stray-1-%d", time.Now().UnixNano()), Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: bounded})
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := first.Shutdown(sctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	scancel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bnc := testenv.ConnectSeed(t, url, seeds["beta"], nil)
	bjs, err := jetstream.New(bnc)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(wire.Job{ExecutionID: "x", Sandbox: "default", SessionID: "x", Script: "1"})
	for _, subject := range []string{"jazzmine.session.*.x", "jazzmine.session.nosuch.x"} {
		if _, err := bjs.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: body, Header: nats.Header{wire.HeaderMsgID: {client.NewExecutionID()}}}); !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Errorf("publish %s while no worker runs: %v; want no stream response", subject, err)
		}
	}
	// A literal '*' for the session matches the served sandbox's subjects: stored (one
	// subject a tenant and sandbox, bounded by tenant_backlog), and deleted by the
	// first opener that sees it.
	if _, err := bjs.PublishMsg(ctx, &nats.Msg{Subject: "jazzmine.session.default.*", Data: body, Header: nats.Header{wire.HeaderMsgID: {client.NewExecutionID()}}}); err != nil {
		t.Fatalf("publish a call on a literal session '*' while no worker runs: %v", err)
	}
	testworker.Start(t, wnc, testworker.Options{ID: fmt.Sprintf("test-stray-2-%d", time.Now().UnixNano()), Sandbox: sandboxpool.Sandbox{PoolSize: 1}, Worker: bounded})
	sessions := fleetStream(t, wnc, wire.StreamSessions)
	held := func() int {
		info, err := sessions.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		return len(info.State.Subjects)
	}
	testenv.WaitFor(t, 30*time.Second, "the call published while no worker ran to leave the sessions stream", func() bool { return held() == 0 })

	for _, pattern := range []string{"jazzmine.session.*.w%d-%d", "jazzmine.session.nosuch%d.s%d"} {
		pad := client.NewExecutionID() // after its first, every pad is a duplicate
		for wave := range 4 {
			for range 300 {
				if err := bnc.PublishMsg(&nats.Msg{Subject: fmt.Sprintf(pattern, 99, 99), Data: body, Header: nats.Header{wire.HeaderMsgID: {pad}}}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 400 {
				if err := bnc.PublishMsg(&nats.Msg{Subject: fmt.Sprintf(pattern, wave, i), Data: body, Header: nats.Header{wire.HeaderMsgID: {client.NewExecutionID()}}}); err != nil {
					t.Fatal(err)
				}
			}
			if err := bnc.FlushTimeout(10 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := held(); n != 0 {
		t.Errorf("the sessions stream holds calls of %d subjects of the floods", n)
	}
	s := tenantClient(t, testenv.ConnectSeed(t, url, seeds["alpha"], nil)).NewSession("default")
	if res, err := s.Run(ctx, wire.Job{Mode: wire.ModeInteractive, Script: "emit_result(1)"}); err != nil || !res.Success {
		t.Errorf("alpha's session call after beta's floods: %+v, %v", res, err)
	}
}

// fleetStream is the stream with the name of the account of wnc (a worker's
// connection: the fleet's account).
func fleetStream(t *testing.T, wnc *nats.Conn, name string) jetstream.Stream {
	t.Helper()
	wjs, err := jetstream.New(wnc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := wjs.Stream(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}
