package client_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// testTimeout bounds every wait of a test; it is a safety net, not a
// measure: tests wait on signals.
const testTimeout = 20 * time.Second

const sandbox = "default"

// startServer starts an in-process NATS server with JetStream on loopback,
// storing in dir (a fresh temporary directory when empty) and listening on
// port (any free port when -1). The server is shut down at the end of the
// test.
func startServer(t *testing.T, dir string, port int) *server.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		t.Fatalf("new NATS server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(testTimeout) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// restartServer shuts srv down and starts a server on the same port and
// store directory, so that connections reconnect and streams come back.
func restartServer(t *testing.T, srv *server.Server, dir string) *server.Server {
	t.Helper()
	port := srv.Addr().(*net.TCPAddr).Port
	srv.Shutdown()
	srv.WaitForShutdown()
	return startServer(t, dir, port)
}

// startPlainServer starts an in-process NATS server without JetStream.
func startPlainServer(t *testing.T) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatalf("new NATS server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(testTimeout) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// connect connects to s; the connection is closed at the end of the test.
func connect(t *testing.T, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect to NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func newJetStream(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return js
}

// execStreamConfig is the jobs stream as a worker creates it.
func execStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       wire.StreamExec,
		Subjects:   []string{wire.ExecWildcard},
		Retention:  jetstream.WorkQueuePolicy,
		Duplicates: 2 * time.Minute,
	}
}

// eventsStreamConfig is the events stream as a worker creates it.
func eventsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       wire.StreamEvents,
		Subjects:   []string{wire.AllEventsWildcard},
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     time.Hour,
		Duplicates: 2 * time.Minute,
	}
}

func createStream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	if _, err := js.CreateStream(ctx(t), cfg); err != nil {
		t.Fatalf("create stream %s: %v", cfg.Name, err)
	}
}

// env is a NATS server with the two streams a worker creates, a client, and
// a fake worker on a connection of its own.
type env struct {
	srv    *server.Server
	js     jetstream.JetStream // the fake worker's
	nc     *nats.Conn          // the fake worker's
	client *client.Client
	cnc    *nats.Conn // the client's
	worker *fakeWorker
}

// newEnv starts a server with both streams and returns a client configured
// with cfg (Conn is filled in).
func newEnv(t *testing.T, cfg client.Config) *env {
	t.Helper()
	return newEnvOn(t, startServer(t, "", -1), cfg)
}

// newEnvOn is newEnv on srv, with opts for both connections.
func newEnvOn(t *testing.T, srv *server.Server, cfg client.Config, opts ...nats.Option) *env {
	t.Helper()
	wnc := connect(t, srv, opts...)
	js := newJetStream(t, wnc)
	createStream(t, js, execStreamConfig())
	createStream(t, js, eventsStreamConfig())
	cfg.Conn = connect(t, srv, opts...)
	c, err := client.New(cfg)
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	return &env{srv: srv, js: js, nc: wnc, client: c, cnc: cfg.Conn, worker: newFakeWorker(t, js)}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return c
}

// fakeWorker does what a worker does with a job, step by step under the
// test's control: pull one job, decode it by its content type, publish
// events in the job's encoding, ack.
type fakeWorker struct {
	t    *testing.T
	js   jetstream.JetStream
	cons jetstream.Consumer
}

func newFakeWorker(t *testing.T, js jetstream.JetStream) *fakeWorker {
	t.Helper()
	cons, err := js.CreateOrUpdateConsumer(ctx(t), wire.StreamExec, jetstream.ConsumerConfig{
		Durable:       wire.ConsumerName(sandbox),
		FilterSubject: wire.ExecSubject(sandbox),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       time.Minute,
	})
	if err != nil {
		t.Fatalf("create jobs consumer: %v", err)
	}
	return &fakeWorker{t: t, js: js, cons: cons}
}

// delivery is a job the fake worker pulled.
type delivery struct {
	w           *fakeWorker
	msg         jetstream.Msg
	job         *wire.Job
	contentType string
	attempt     int
	seq         uint64
}

// take pulls the next job, failing the test when none comes.
func (w *fakeWorker) take() *delivery {
	w.t.Helper()
	msg, err := w.cons.Next(jetstream.FetchMaxWait(testTimeout))
	if err != nil {
		w.t.Fatalf("fake worker: pull a job: %v", err)
	}
	ct := msg.Headers().Get(wire.HeaderContentType)
	job, err := wire.DecodeJob(ct, msg.Data())
	if err != nil {
		w.t.Fatalf("fake worker: decode job: %v", err)
	}
	sb, err := wire.SandboxFromExecSubject(msg.Subject())
	if err != nil {
		w.t.Fatalf("fake worker: %v", err)
	}
	if err := job.Validate(sb, 0); err != nil {
		w.t.Fatalf("fake worker: %v", err)
	}
	md, err := msg.Metadata()
	if err != nil {
		w.t.Fatalf("fake worker: metadata: %v", err)
	}
	return &delivery{w: w, msg: msg, job: job, contentType: ct, attempt: int(md.NumDelivered)}
}

// event returns ev stamped as the worker stamps it: execution id, the next
// seq of the attempt, attempt, worker id, time, metadata.
func (d *delivery) event(ev wire.Event) *wire.Event {
	d.seq++
	ev.ExecutionID = d.job.ExecutionID
	ev.Seq = d.seq
	ev.Attempt = d.attempt
	ev.WorkerID = "worker-" + strconv.Itoa(d.attempt)
	ev.Time = time.Now().UTC()
	ev.Metadata = d.job.Metadata
	return &ev
}

// eventMsg encodes ev in the job's encoding as a message on its subject.
func (d *delivery) eventMsg(ev wire.Event) *nats.Msg {
	d.w.t.Helper()
	e := d.event(ev)
	b, err := wire.EncodeEvent(d.contentType, e)
	if err != nil {
		d.w.t.Fatalf("fake worker: %v", err)
	}
	msg := nats.NewMsg(wire.EventSubject(e.ExecutionID, e.Type))
	msg.Data = b
	msg.Header.Set(wire.HeaderMsgID, wire.EventMsgID(e.ExecutionID, e.Attempt, e.Seq))
	ct, err := wire.ParseContentType(d.contentType)
	if err != nil {
		d.w.t.Fatalf("fake worker: %v", err)
	}
	msg.Header.Set(wire.HeaderContentType, ct)
	return msg
}

// emit publishes events, one after the other.
func (d *delivery) emit(evs ...wire.Event) {
	d.w.t.Helper()
	for _, ev := range evs {
		if _, err := d.w.js.PublishMsg(ctx(d.w.t), d.eventMsg(ev)); err != nil {
			d.w.t.Fatalf("fake worker: publish event: %v", err)
		}
	}
}

func (d *delivery) ack() {
	d.w.t.Helper()
	if err := d.msg.DoubleAck(ctx(d.w.t)); err != nil {
		d.w.t.Fatalf("fake worker: ack: %v", err)
	}
}

// nak gives the job back for another delivery at once, as if the worker had
// died and its ack wait had run out.
func (d *delivery) nak() {
	d.w.t.Helper()
	if err := d.msg.Nak(); err != nil {
		d.w.t.Fatalf("fake worker: nak: %v", err)
	}
}

// run runs a whole successful execution: started, some output, a result,
// script_done, ack.
func (d *delivery) run(finalData any) {
	d.w.t.Helper()
	d.emit(
		wire.Event{Type: wire.EventStarted, Sandbox: d.job.Sandbox, ContainerID: "abc123"},
		wire.Event{Type: wire.EventStdout, Text: "hello\n"},
		wire.Event{Type: wire.EventFinalResult, Data: finalData},
		wire.Event{Type: wire.EventScriptDone, Success: true, DurationMS: 12, OutputBytes: 34, FinalData: finalData},
	)
	d.ack()
}

// streamState returns the messages and consumers of a stream.
func streamState(t *testing.T, js jetstream.JetStream, name string) (msgs uint64, consumers int) {
	t.Helper()
	s, err := js.Stream(ctx(t), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatalf("stream %s info: %v", name, err)
	}
	return info.State.Msgs, info.State.Consumers
}

// submit submits job, failing the test on error, and closes the execution at
// the end of the test.
func submit(t *testing.T, c *client.Client, job wire.Job) *client.Execution {
	t.Helper()
	e, err := c.Submit(ctx(t), job)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	t.Cleanup(e.Close)
	return e
}

// collect reads the execution's events until the channel is closed.
func collect(t *testing.T, e *client.Execution) []*wire.Event {
	t.Helper()
	var evs []*wire.Event
	timeout := time.After(testTimeout)
	for {
		select {
		case ev, ok := <-e.Events():
			if !ok {
				return evs
			}
			evs = append(evs, ev)
		case <-timeout:
			t.Fatalf("events of %s: the channel was not closed; got %d events", e.ID, len(evs))
		}
	}
}
