package worker_test

import (
	"context"
	"flag"
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

// startWorker runs a worker with its own pool of the example sandbox image against nc.
// poolSize and overflow size the pool (slots = their sum); tweak adjusts the worker's
// config. Everything is shut down at the end of the test, and no container may be
// left.
func startWorker(t testing.TB, nc *nats.Conn, poolSize, overflow int, tweak func(*worker.Config)) *worker.Worker {
	t.Helper()
	return startWorkerWith(t, nc, poolSize, overflow, benchMaxUses, tweak)
}

// startWorkerWith is startWorker with the containers' MaxUses (0: the default).
func startWorkerWith(t testing.TB, nc *nats.Conn, poolSize, overflow, maxUses int, tweak func(*worker.Config)) *worker.Worker {
	t.Helper()
	w, _ := startWorkerPool(t, nc, sandboxpool.Sandbox{PoolSize: poolSize, MaxOverflow: overflow, MaxUses: maxUses}, nil, tweak)
	return w
}

// startWorkerPool is startWorkerWith with the sandbox's pool settings in sb (its name
// and image are filled in) and a tweak of the pool's config too; it returns the pool.
func startWorkerPool(t testing.TB, nc *nats.Conn, sb sandboxpool.Sandbox, poolTweak func(*sandboxpool.Config), tweak func(*worker.Config)) (*worker.Worker, *sandboxpool.Pool) {
	t.Helper()
	return testworker.Start(t, nc, testworker.Options{Sandbox: sb, Pool: poolTweak, Worker: tweak})
}

// bucket returns the fleet's key-value bucket name, which the worker has made.
func bucket(t testing.TB, nc *nats.Conn, name string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// agent publishes jobs and reads events the way any NATS client can.
type agent struct {
	t  testing.TB
	nc *nats.Conn
	js jetstream.JetStream
}

func newAgent(t testing.TB, nc *nats.Conn) *agent {
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &agent{t: t, nc: nc, js: js}
}

// publish sends raw bytes as a job with the given headers.
func (a *agent) publish(subject string, data []byte, headers map[string]string) error {
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	for k, v := range headers {
		msg.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.js.PublishMsg(ctx, msg)
	return err
}

// submit publishes job in the content type.
func (a *agent) submit(ct string, job wire.Job) {
	a.t.Helper()
	data, err := wire.EncodeJob(ct, &job)
	if err != nil {
		a.t.Fatal(err)
	}
	if err := a.publish(wire.ExecSubject(job.Sandbox), data, map[string]string{wire.HeaderMsgID: job.ExecutionID, wire.HeaderContentType: ct}); err != nil {
		a.t.Fatalf("publish job %s: %v", job.ExecutionID, err)
	}
}

// events reads the execution's events from the events stream until a script_done,
// or fails the test after the timeout.
func (a *agent) events(id string, timeout time.Duration) []*wire.Event {
	a.t.Helper()
	evs, err := a.tryEvents(id, timeout)
	if err != nil {
		a.t.Fatalf("events of %s: %v (got %s)", id, err, describe(evs))
	}
	return evs
}

func (a *agent) tryEvents(id string, timeout time.Duration) ([]*wire.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cons, err := a.js.OrderedConsumer(ctx, wire.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{wire.EventsWildcard(id)}})
	if err != nil {
		return nil, err
	}
	var evs []*wire.Event
	for {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return evs, err
		}
		ev, err := wire.DecodeEvent(msg.Headers().Get(wire.HeaderContentType), msg.Data())
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
		if ev.Type == wire.EventScriptDone {
			return evs, nil
		}
	}
}

// allEvents reads every event of the execution that is in the stream now.
func (a *agent) allEvents(id string) []*wire.Event {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := a.js.OrderedConsumer(ctx, wire.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{wire.EventsWildcard(id)}})
	if err != nil {
		a.t.Fatal(err)
	}
	var evs []*wire.Event
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(300 * time.Millisecond))
		if err != nil {
			return evs
		}
		ev, err := wire.DecodeEvent(msg.Headers().Get(wire.HeaderContentType), msg.Data())
		if err != nil {
			a.t.Fatal(err)
		}
		evs = append(evs, ev)
	}
}

// oneAttemptOneEnd checks that the stream holds exactly one script_done of the
// execution, and no event of an attempt but the first: the job ran once.
func (a *agent) oneAttemptOneEnd(id string) {
	a.t.Helper()
	all := a.allEvents(id)
	if n := count(all, wire.EventScriptDone); n != 1 {
		a.t.Errorf("%d script_done events: %s", n, describe(all))
	}
	for _, ev := range all {
		if ev.Attempt != 1 {
			a.t.Errorf("a %s event of attempt %d: the job ran again", ev.Type, ev.Attempt)
		}
	}
}

func last(evs []*wire.Event) *wire.Event { return evs[len(evs)-1] }

func find(evs []*wire.Event, typ string) *wire.Event {
	for _, ev := range evs {
		if ev.Type == typ {
			return ev
		}
	}
	return nil
}

func count(evs []*wire.Event, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func describe(evs []*wire.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "[%s #%d a%d %s%s%s] ", ev.Type, ev.Seq, ev.Attempt, ev.Kind, ev.Error, ev.Text)
	}
	return b.String()
}

var idMu sync.Mutex
var idN int

func newID(prefix string) string {
	idMu.Lock()
	defer idMu.Unlock()
	idN++
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1_000_000, idN)
}

func jetstreamSubjects(filter string) jetstream.StreamInfoOpt {
	return jetstream.WithSubjectFilter(filter)
}

// benchMaxUses is the pool's MaxUses in these tests, the default unless the
// benchmarks' -maxuses flag changes it to show what container recycling costs.
var benchMaxUses = sandboxpool.DefaultMaxUses

func init() {
	flag.IntVar(&benchMaxUses, "maxuses", sandboxpool.DefaultMaxUses, "MaxUses of the test pools")
}

// burst sends n requests on subject with body at once, as a tenant's flood, their
// answers to an inbox of its own; calls during while they are answered; and returns
// how many of the n answers said busy and how many carried data.
func burst(t *testing.T, nc *nats.Conn, subject string, body []byte, n int, during func()) (busy, data int) {
	t.Helper()
	answers := make(chan *nats.Msg, n)
	inbox := nats.NewInbox()
	sub, err := nc.ChanSubscribe(inbox, answers)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for range n {
		if err := nc.PublishRequest(subject, inbox, body); err != nil {
			t.Fatal(err)
		}
	}
	during()
	for deadline := time.After(30 * time.Second); busy+data < n; {
		select {
		case m := <-answers:
			if m.Header.Get(wire.HeaderError) == wire.Busy {
				busy++
			} else if len(m.Data) > 0 {
				data++
			}
		case <-deadline:
			t.Fatalf("%d busy and %d other answers of a burst of %d on %s", busy, data, n, subject)
		}
	}
	return busy, data
}

// catalogWhen waits until the catalog, by sandbox name, meets cond, and returns it.
func catalogWhen(t testing.TB, c *client.Client, what string, cond func(map[string]client.SandboxInfo) bool) map[string]client.SandboxInfo {
	t.Helper()
	var cat map[string]client.SandboxInfo
	testenv.WaitFor(t, time.Minute, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		list, err := c.Sandboxes(ctx)
		if err != nil {
			return false
		}
		cat = map[string]client.SandboxInfo{}
		for _, sb := range list {
			cat[sb.Sandbox] = sb
		}
		return cond(cat)
	})
	return cat
}
