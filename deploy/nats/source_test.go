package nats_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	natsdeploy "github.com/jazzmine/worker/deploy/nats"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// TestATenantGetsTheEventsItsStreamMissed: a tenant's events stream took the events
// from the fleet's account unacknowledged, and lost what was sent while it could not
// store (it elected a leader after its server died: the fault test saw a job whose
// script_done the fleet held and its agent never got). It now sources them from the
// fleet's stream, at least once. Here the tenant's stream refuses new messages while
// the job ends (DiscardNew at its current count), so the job's result reaches only
// the fleet's stream; once the tenant's stream takes messages again, the agent,
// reading it, must get its result, with nobody asking for anything again.
func TestATenantGetsTheEventsItsStreamMissed(t *testing.T) {
	workerSeed, workerPub := testenv.UserKey(t)
	agentSeed, agentPub := testenv.UserKey(t)
	srv := authServer(t, []string{workerPub}, []natsdeploy.Tenant{{Name: "agents", Key: agentPub}}, nil)
	wnc := connectAs(t, srv.ClientURL(), workerSeed, nil)
	startAuthWorker(t, wnc)
	fleet, err := jetstream.New(wnc)
	if err != nil {
		t.Fatal(err)
	}
	anc := connectAs(t, srv.ClientURL(), agentSeed, nil)
	c, err := client.New(client.Config{Conn: anc, LiveWindow: -1}) // the stream from the start
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: "emit_result(1)"}); err != nil || !res.Success {
		t.Fatalf("a first job: %+v, %v", res, err) // the tenant's stream exists
	}
	ajs, err := jetstream.New(anc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := ajs.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	open := stream.CachedInfo().Config

	e, err := c.Submit(ctx, wire.Job{Sandbox: "default", Script: "print('up', flush=True)\nimport time\ntime.sleep(1)\nemit_result('the end')", TimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for ev := range e.Events() {
		if ev.Type == wire.EventStdout {
			break // running, and its stdout stored: the rest is not
		}
	}
	full := open
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	full.MaxMsgs, full.Discard = int64(info.State.Msgs), jetstream.DiscardNew
	if _, err := ajs.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	events, err := fleet.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the fleet's stream to hold the script_done", func() bool {
		_, err := events.GetLastMsgForSubject(ctx, wire.EventSubject("agents."+e.ID, wire.EventScriptDone))
		return err == nil
	})
	held, err := stream.Info(ctx, jetstream.WithSubjectFilter(wire.EventsWildcard(e.ID)))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := held.State.Subjects[wire.EventSubject(e.ID, wire.EventScriptDone)]; ok {
		t.Fatal("the tenant's stream stored the script_done though it was full: the test proves nothing")
	}
	if _, err := ajs.UpdateStream(ctx, open); err != nil {
		t.Fatal(err)
	}

	res, err := e.Wait(ctx)
	if err != nil || !res.Success || res.FinalData != "the end" || res.Stdout != "up\n" {
		t.Fatalf("the execution: %+v, %v; want its result, once its stream took the events again", res, err)
	}
	// The fleet's stream has one consumer of the tenant's events: the tenant's
	// stream's source, which the workers made.
	cons, err := events.PushConsumer(ctx, wire.TenantEventsConsumer("agents"))
	if err != nil {
		t.Fatalf("the tenant's events consumer in the fleet's account: %v", err)
	}
	if cfg := cons.CachedInfo().Config; cfg.DeliverSubject != wire.TenantEventsSubject("agents") || cfg.FilterSubject != "jazzmine.events.agents.>" {
		t.Errorf("the tenant's events consumer delivers %s of %s; want %s of the tenant's events only", cfg.DeliverSubject, cfg.FilterSubject, wire.TenantEventsSubject("agents"))
	}
}

// TestATenantsAgentsStartingTogetherAllSubmit: a tenant's agents start at once,
// before the account's events stream exists, and each client asks the workers to
// carry its events (a tenant's 1 a second on a worker, 4 at once). A review found 8
// of 16 first Submits failing: the ask, answered busy and asked again, used the whole
// budget of the stream's creation. The ask has a budget of its own, a worker answers
// at once for a consumer it made lately, and every Submit goes through.
func TestATenantsAgentsStartingTogetherAllSubmit(t *testing.T) {
	_, anc, _ := twoTenantServer(t, "alpha", "beta")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 16
	errs := make(chan error, n)
	for range n {
		c := tenantClient(t, anc)
		go func() {
			e, err := c.Submit(ctx, wire.Job{Sandbox: "default", Script: "pass"})
			if err == nil {
				e.Close()
			}
			errs <- err
		}()
	}
	failed := 0
	for range n {
		if err := <-errs; err != nil {
			failed++
			t.Logf("Submit: %v", err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d first Submits of a tenant's agents started together failed", failed, n)
	}
}

// TestAnUnrestrictedTenantUserReachesNoOtherTenantsEvents: the agents' permissions
// refuse jazzmine.fleet.> before any import is looked at; here alpha's user has none,
// so only the imports stand between it and beta's consumer and the fleet's API. Every
// request on another's reset, flow control or source, and on the fleet's API under
// the prefix, goes unanswered, and alpha hears nothing of beta's. A flood of
// flow-control requests, never answered, leaves no reply mappings in the fleet's
// account past about a second (the server's default is two minutes: a review's
// flood of 200,000 held 68 MB of an in-process server's heap).
func TestAnUnrestrictedTenantUserReachesNoOtherTenantsEvents(t *testing.T) {
	workerSeed, workerPub := testenv.UserKey(t)
	alphaSeed, alphaPub := testenv.UserKey(t)
	betaSeed, betaPub := testenv.UserKey(t)
	srv := authServer(t, []string{workerPub}, []natsdeploy.Tenant{{Name: "alpha", Key: alphaPub}, {Name: "beta", Key: betaPub}}, func(conf string) string {
		agent := "{ nkey: " + alphaPub + ", permissions: $AGENT }"
		if !strings.Contains(conf, agent) {
			t.Fatalf("no %q in the auth config", agent)
		}
		return strings.Replace(conf, agent, "{ nkey: "+alphaPub+" }", 1)
	})
	startAuthWorker(t, connectAs(t, srv.ClientURL(), workerSeed, nil))
	anc, bnc := connectAs(t, srv.ClientURL(), alphaSeed, nil), connectAs(t, srv.ClientURL(), betaSeed, nil)
	heard := make(chan *nats.Msg, 256)
	sub, err := anc.ChanSubscribe(">", heard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for name, nc := range map[string]*nats.Conn{"alpha": anc, "beta": bnc} {
		if res, err := tenantClient(t, nc).Run(ctx, wire.Job{Sandbox: "default", Script: "print('secret of " + name + "')"}); err != nil || !res.Success {
			t.Fatalf("%s's job: %+v, %v", name, res, err)
		}
	}
	for _, subject := range []string{
		wire.SourceAPIPrefix + ".CONSUMER.RESET.JAZZMINE_EVENTS." + wire.TenantEventsConsumer("beta"),
		wire.SourceAPIPrefix + ".CONSUMER.CREATE.JAZZMINE_EVENTS",
		wire.SourceAPIPrefix + ".CONSUMER.INFO.JAZZMINE_EVENTS." + wire.SourceConsumer,
		wire.SourceAPIPrefix + ".STREAM.INFO.JAZZMINE_EVENTS",
		"$JS.API.CONSUMER.RESET.JAZZMINE_EVENTS." + wire.TenantEventsConsumer("beta"),
		"$JS.FC.JAZZMINE_EVENTS." + wire.TenantEventsConsumer("beta") + ".abcd",
		wire.SubjectSource + ".beta",
	} {
		if m, err := anc.Request(subject, []byte(`{"seq":1}`), time.Second); err == nil {
			t.Errorf("alpha's request on %s was answered: %.200q", subject, m.Data)
		}
	}
	time.Sleep(time.Second) // what may come late
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	for len(heard) > 0 {
		m := <-heard
		if string(m.Data) == `{"seq":1}` {
			continue // its own requests, heard by its own subscription
		}
		if strings.Contains(m.Subject, "beta") || strings.Contains(string(m.Data), "secret of beta") {
			t.Errorf("alpha heard %s: %.100q", m.Subject, m.Data)
		}
	}
	// A flood of flow-control requests, which nothing answers, holds the fleet's reply
	// mappings for the export's response threshold, a second.
	fleet, err := srv.LookupAccount("FLEET")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20_000 {
		if err := anc.PublishRequest("$JS.FC.JAZZMINE_EVENTS."+wire.TenantEventsConsumer("alpha")+".x", fmt.Sprintf("_INBOX.flood.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Logf("the fleet's account holds %d reply mappings after the flood", fleet.NumPendingAllResponses())
	testenv.WaitFor(t, 10*time.Second, "the flood's reply mappings to expire", func() bool { return fleet.NumPendingAllResponses() < 100 })
}

// authServer starts a server with the auth config rendered for workers and tenants,
// changed by tweak first where it is not nil.
func authServer(t *testing.T, workers []string, tenants []natsdeploy.Tenant, tweak func(string) string) *server.Server {
	t.Helper()
	conf, err := natsdeploy.AuthConfig(workers, tenants)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		conf = tweak(conf)
	}
	file := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return testenv.AuthServer(t, file)
}
