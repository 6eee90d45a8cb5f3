package nats_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestAnAgentMaySubmitCancelAndReadButNothingElse runs a server with auth.conf, a
// worker with the worker identity and an agent with the agent identity. The agent's
// job runs; then the agent plays a hostile client: forging an event, asking who runs
// an execution, deleting a worker's liveness key, deleting the jobs stream, forging a
// max-deliveries advisory, acking a job, taking jobs with a consumer of its own. Each
// is refused by the server and changes nothing, and the fleet serves the next job.
func TestAnAgentMaySubmitCancelAndReadButNothingElse(t *testing.T) {
	workerSeed, workerPub := userKey(t)
	agentSeed, agentPub := userKey(t)
	t.Setenv("JAZZMINE_WORKER_NKEY", workerPub)
	t.Setenv("JAZZMINE_AGENT_NKEY", agentPub)
	opts, err := server.ProcessConfigFile("auth.conf")
	if err != nil {
		t.Fatalf("process auth.conf: %v", err)
	}
	opts.Host, opts.Port = "127.0.0.1", server.RANDOM_PORT
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}

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
	resultSubject := wire.EventSubject(res.ExecutionID, wire.EventFinalResult)
	before, err := events.GetLastMsgForSubject(ctx, resultSubject)
	if err != nil {
		t.Fatal(err)
	}
	refused("forge the execution's result", resultSubject, nats.Header{wire.HeaderContentType: {wire.ContentTypeJSON}})
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

// userKey returns a new user nkey's seed and public key.
func userKey(t *testing.T) (seed []byte, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	if seed, err = kp.Seed(); err != nil {
		t.Fatal(err)
	}
	if pub, err = kp.PublicKey(); err != nil {
		t.Fatal(err)
	}
	return seed, pub
}

// connectAs connects to url with the nkey seed, as `worker serve --nkey` does: from a
// seed file.
func connectAs(t *testing.T, url string, seed []byte, onErr nats.ErrHandler) *nats.Conn {
	t.Helper()
	file := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(file, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	nkey, err := nats.NkeyOptionFromSeed(file)
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nkey}
	if onErr != nil {
		opts = append(opts, nats.ErrorHandler(onErr))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect with nkey: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// startAuthWorker runs a worker of the example "default" sandbox on nc until the end
// of the test, and returns its id.
func startAuthWorker(t *testing.T, nc *nats.Conn) string {
	t.Helper()
	id := fmt.Sprintf("test-auth-%d", time.Now().UnixNano())
	testworker.Start(t, nc, testworker.Options{ID: id, Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	return id
}
