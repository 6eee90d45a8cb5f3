package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSFloor is the least a durable job needs from NATS, with nats.go alone and no
// container: a plain publish into a work-queue stream with file storage (acked by
// the stream), a pull consumer's fetch on another connection, and one core message
// back to the publisher's subscription. The consumer acks what it fetched after it
// answered, as a worker acks a job after its events.
type NATSFloor struct {
	agent *nats.Conn
	js    jetstream.JetStream
	back  chan *nats.Msg
	n     int
}

// NewNATSFloor makes the floor's stream and consumer on the server at url, and
// starts the consumer's pull loop; all of it goes at cleanup.
func NewNATSFloor(tb testing.TB, url string) *NATSFloor {
	tb.Helper()
	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect(url, nats.Name(name))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(nc.Close)
		return nc
	}
	agent, worker := connect("floor agent"), connect("floor worker")
	ctx := context.Background()
	wjs, err := jetstream.New(worker)
	if err != nil {
		tb.Fatal(err)
	}
	stream, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOOR_JOBS", Subjects: []string{"floor.jobs"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = wjs.DeleteStream(context.Background(), "FLOOR_JOBS") })
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "floor", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		tb.Fatal(err)
	}
	serveEach(tb, ctx, cons, func(_ context.Context, msg jetstream.Msg) {
		_ = worker.Publish(msg.Headers().Get("Reply-To"), msg.Data())
		_ = msg.Ack()
	})
	ajs, err := jetstream.New(agent)
	if err != nil {
		tb.Fatal(err)
	}
	back := make(chan *nats.Msg, 1)
	sub, err := agent.ChanSubscribe("floor.back.*", back)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = sub.Unsubscribe() })
	return &NATSFloor{agent: agent, js: ajs, back: back}
}

// RoundTrip sends one job-sized message through the stream and returns how long it
// took for the answer to come back.
func (f *NATSFloor) RoundTrip(tb testing.TB) time.Duration {
	f.n++
	reply := fmt.Sprintf("floor.back.%d", f.n)
	msg := &nats.Msg{Subject: "floor.jobs", Data: []byte(`{"execution_id":"floor","sandbox":"default","script":"emit_result(1)"}`),
		Header: nats.Header{"Reply-To": {reply}, "Nats-Msg-Id": {reply}}}
	t0 := time.Now()
	if _, err := f.js.PublishMsg(context.Background(), msg); err != nil {
		tb.Fatal(err)
	}
	select {
	case <-f.back:
	case <-time.After(10 * time.Second):
		tb.Fatal("NATS floor: no answer in 10 s")
	}
	return time.Since(t0)
}

// PipeFloor is one line to a forked Python child over a pipe and back: the host's
// python3 forks once, and the child echoes each line it reads.
type PipeFloor struct {
	w io.Writer
	r *bufio.Reader
}

// pipeEcho forks a child that echoes lines from stdin to stdout, unbuffered; the
// parent waits for it.
const pipeEcho = `import os
pid = os.fork()
if pid == 0:
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(0)
        os.write(1, chunk)
os.waitpid(pid, 0)
`

// NewPipeFloor starts the python3 process and its child; they end at cleanup.
func NewPipeFloor(tb testing.TB) *PipeFloor {
	tb.Helper()
	cmd := exec.Command("python3", "-u", "-c", pipeEcho)
	w, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	r, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = w.Close(); _ = cmd.Wait() })
	return &PipeFloor{w: w, r: bufio.NewReader(r)}
}

// RoundTrip sends one protocol-sized line and returns how long it took to come back.
func (f *PipeFloor) RoundTrip(tb testing.TB) time.Duration {
	t0 := time.Now()
	if _, err := f.w.Write([]byte("{\"type\":\"execute\",\"script\":\"emit_result(1)\"}\n")); err != nil {
		tb.Fatal(err)
	}
	if _, err := f.r.ReadBytes('\n'); err != nil {
		tb.Fatal(err)
	}
	return time.Since(t0)
}

// JobPatternFloor is a job's whole NATS pattern with nats.go alone and no container,
// as the worker and an agent make it: the agent subscribes to the execution's events
// and publishes the job into a work-queue stream (file storage, acked); the worker's
// pull fetches it, looks up its cancel in a key-value bucket (none), publishes three
// events into an events stream (started, final_result, script_done; each acked), and
// acks the job; the agent's subscription gets the script_done. It measures what the
// Go side of a job costs at the least, with the same messages.
type JobPatternFloor struct {
	js   jetstream.JetStream
	nc   *nats.Conn
	done chan struct{}
	n    int
}

// NewJobPatternFloor makes the floor's streams, bucket and consumer on the server at
// url and starts the worker's pull loop; all of it goes at cleanup.
func NewJobPatternFloor(tb testing.TB, url string) *JobPatternFloor {
	tb.Helper()
	ctx := context.Background()
	conn := func(name string) (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(url, nats.Name(name))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			tb.Fatal(err)
		}
		return nc, js
	}
	agentNC, agentJS := conn("pattern agent")
	_, wjs := conn("pattern worker")
	jobs, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: "PATTERN_JOBS", Subjects: []string{"pattern.jobs"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := wjs.CreateStream(ctx, jetstream.StreamConfig{Name: "PATTERN_EVENTS", Subjects: []string{"pattern.events.>"}, Storage: jetstream.FileStorage}); err != nil {
		tb.Fatal(err)
	}
	cancels, err := wjs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pattern_cancels"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for _, s := range []string{"PATTERN_JOBS", "PATTERN_EVENTS", "KV_pattern_cancels"} {
			_ = wjs.DeleteStream(context.Background(), s)
		}
	})
	cons, err := jobs.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "pattern", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		tb.Fatal(err)
	}
	serveEach(tb, ctx, cons, func(ctx context.Context, msg jetstream.Msg) {
		id := msg.Headers().Get("Nats-Msg-Id")
		_, _ = cancels.Get(ctx, id) // none: the job runs
		for _, typ := range []string{"started", "final_result", "script_done"} {
			_, _ = wjs.Publish(ctx, "pattern.events."+id+"."+typ, []byte(`{"execution_id":"`+id+`","type":"`+typ+`","seq":1}`))
		}
		_ = msg.Ack()
	})
	return &JobPatternFloor{js: agentJS, nc: agentNC, done: make(chan struct{}, 1)}
}

// RoundTrip runs one job's pattern and returns how long the agent waited for its
// script_done.
func (f *JobPatternFloor) RoundTrip(tb testing.TB) time.Duration {
	f.n++
	id := fmt.Sprintf("p%d", f.n)
	sub, err := f.nc.Subscribe("pattern.events."+id+".script_done", func(*nats.Msg) { f.done <- struct{}{} })
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	t0 := time.Now()
	msg := &nats.Msg{Subject: "pattern.jobs", Data: []byte(`{"execution_id":"` + id + `","sandbox":"default","script":"emit_result(1)"}`),
		Header: nats.Header{"Nats-Msg-Id": {id}}}
	if _, err := f.js.PublishMsg(context.Background(), msg); err != nil {
		tb.Fatal(err)
	}
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		tb.Fatal("job pattern floor: no script_done in 10 s")
	}
	return time.Since(t0)
}

// serveEach hands each message of cons, fetched one at a time, to handle until the end
// of the test: the worker's side of a floor.
func serveEach(tb testing.TB, ctx context.Context, cons jetstream.Consumer, handle func(context.Context, jetstream.Msg)) {
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for pctx.Err() == nil {
			batch, err := cons.Fetch(1, jetstream.FetchContext(pctx))
			if err != nil {
				continue
			}
			for msg := range batch.Messages() {
				handle(pctx, msg)
			}
		}
	}()
	tb.Cleanup(func() { stop(); <-done })
}
