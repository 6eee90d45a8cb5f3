package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

func TestWaitReturnsTheResultOfScriptDone(t *testing.T) {
	tests := []struct {
		name        string
		contentType string
	}{
		{"a msgpack execution's events make its result", wire.ContentTypeMsgpack},
		{"a JSON execution's events make its result", wire.ContentTypeJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, client.Config{ContentType: tt.contentType})
			e := submit(t, env.client, wire.Job{ExecutionID: "exec-1", Sandbox: sandbox, Script: "pass", Metadata: map[string]string{"k": "v"}})
			d := env.worker.take()
			final := map[string]any{"answer": int64(42), "ratio": 0.5}
			d.emit(
				wire.Event{Type: wire.EventStarted, Sandbox: sandbox, ContainerID: "abc123"},
				wire.Event{Type: wire.EventLog, Level: "info", Message: "loading"},
				wire.Event{Type: wire.EventStdout, Text: "one "},
				wire.Event{Type: wire.EventIntermediate, Label: "step", Data: []any{int64(1), "two"}},
				wire.Event{Type: wire.EventStderr, Text: "warning\n"},
				wire.Event{Type: wire.EventStdout, Text: "two\n"},
				wire.Event{Type: wire.EventFinalResult, Data: final},
				wire.Event{Type: wire.EventScriptDone, Success: true, DurationMS: 12, OutputBytes: 34, FinalData: final},
			)
			d.ack()

			res, err := e.Wait(ctx(t))
			if err != nil {
				t.Fatalf("Wait: %v", err)
			}
			want := &client.Result{
				ExecutionID:   "exec-1",
				Attempt:       1,
				WorkerID:      "worker-1",
				Success:       true,
				FinalData:     final,
				Intermediates: []client.Intermediate{{Label: "step", Data: []any{int64(1), "two"}}},
				Logs:          []client.Log{{Time: res.Logs[0].Time, Level: "info", Message: "loading"}},
				Stdout:        "one two\n",
				Stderr:        "warning\n",
				DurationMS:    12,
				OutputBytes:   34,
			}
			if !reflect.DeepEqual(res, want) {
				t.Errorf("Wait =\n%+v\nwant\n%+v", res, want)
			}
			if res.Logs[0].Time.IsZero() {
				t.Error("the log's time is zero")
			}
			if again, err := e.Wait(ctx(t)); err != nil || again != res {
				t.Errorf("Wait again = %p, %v; want the same result at once", again, err)
			}
		})
	}
}

func TestWaitReportsAFailedScriptAsAResult(t *testing.T) {
	env := newEnv(t, client.Config{})
	e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "1/0"})
	d := env.worker.take()
	d.emit(
		wire.Event{Type: wire.EventStderr, Text: "oops"},
		wire.Event{Type: wire.EventError, Kind: wire.KindScript, Error: "ZeroDivisionError: division by zero", Traceback: "Traceback ..."},
		wire.Event{Type: wire.EventScriptDone, Error: "ZeroDivisionError: division by zero", DurationMS: 3},
	)
	d.ack()
	res, err := e.Wait(ctx(t))
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if res.Success || res.ErrorKind != wire.KindScript || res.Error != "ZeroDivisionError: division by zero" || res.Traceback != "Traceback ..." || res.Stderr != "oops" {
		t.Errorf("Wait = %+v, want the script's failure", res)
	}
}

func TestEventsArriveAllAndInOrder(t *testing.T) {
	for _, ct := range []string{wire.ContentTypeMsgpack, wire.ContentTypeJSON} {
		t.Run("a burst of "+ct+" events is seen whole and in order", func(t *testing.T) {
			env := newEnv(t, client.Config{ContentType: ct})
			e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
			d := env.worker.take()

			// Published without waiting for acks, as fast as the
			// connection takes them.
			const n = 2000
			var acks []jetstream.PubAckFuture
			for i := range n {
				msg := d.eventMsg(wire.Event{Type: wire.EventStdout, Text: fmt.Sprintf("%d\n", i)})
				f, err := env.js.PublishMsgAsync(msg)
				if err != nil {
					t.Fatal(err)
				}
				acks = append(acks, f)
			}
			d.emit(wire.Event{Type: wire.EventScriptDone, Success: true})
			for _, f := range acks {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					t.Fatalf("publish: %v", err)
				}
			}
			d.ack()

			evs := collect(t, e)
			if len(evs) != n+1 {
				t.Fatalf("got %d events, want %d", len(evs), n+1)
			}
			var want bytes.Buffer
			for i, ev := range evs {
				if ev.Seq != uint64(i+1) {
					t.Fatalf("event %d has seq %d, want %d", i, ev.Seq, i+1)
				}
				if i < n {
					fmt.Fprintf(&want, "%d\n", i)
				}
			}
			if last := evs[n]; last.Type != wire.EventScriptDone {
				t.Errorf("the last event is %s, want script_done", last.Type)
			}
			res, err := e.Wait(ctx(t))
			if err != nil {
				t.Fatalf("Wait after Events: %v", err)
			}
			if res.Stdout != want.String() {
				t.Errorf("Stdout is %d bytes, want %d", len(res.Stdout), want.Len())
			}
		})
	}
}

func TestAttempts(t *testing.T) {
	env := newEnv(t, client.Config{})

	t.Run("a second attempt starts a fresh result", func(t *testing.T) {
		e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
		first := env.worker.take()
		first.emit(
			wire.Event{Type: wire.EventStarted},
			wire.Event{Type: wire.EventStdout, Text: "first attempt\n"},
			wire.Event{Type: wire.EventIntermediate, Label: "half", Data: "done"},
		)
		first.nak() // the worker died: no script_done

		second := env.worker.take()
		if second.attempt != 2 {
			t.Fatalf("the second delivery is attempt %d, want 2", second.attempt)
		}
		second.emit(
			wire.Event{Type: wire.EventStarted},
			wire.Event{Type: wire.EventStdout, Text: "second attempt\n"},
			wire.Event{Type: wire.EventScriptDone, Success: true, FinalData: "ok"},
		)
		second.ack()

		evs := collect(t, e)
		var got []string
		for _, ev := range evs {
			got = append(got, fmt.Sprintf("%d.%d %s", ev.Attempt, ev.Seq, ev.Type))
		}
		want := []string{"1.1 started", "1.2 stdout", "1.3 intermediate", "2.1 started", "2.2 stdout", "2.3 script_done"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("events = %v, want %v", got, want)
		}
		res, err := e.Wait(ctx(t))
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if res.Attempt != 2 || res.WorkerID != "worker-2" || res.Stdout != "second attempt\n" || len(res.Intermediates) != 0 || res.FinalData != "ok" {
			t.Errorf("Wait = %+v, want attempt 2's result alone", res)
		}
	})

	t.Run("a script_done of an earlier attempt ends the execution with that attempt's result", func(t *testing.T) {
		e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
		first := env.worker.take()
		first.emit(wire.Event{Type: wire.EventStdout, Text: "slow\n"})
		first.nak() // taken for dead, but only slow
		second := env.worker.take()
		second.emit(wire.Event{Type: wire.EventStdout, Text: "fast\n"})
		first.emit(wire.Event{Type: wire.EventScriptDone, Success: true})
		second.ack()

		res, err := e.Wait(ctx(t))
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if res.Attempt != 1 || res.Stdout != "slow\n" {
			t.Errorf("Wait = %+v, want attempt 1's result", res)
		}
	})
}

func TestEventsThenWait(t *testing.T) {
	env := newEnv(t, client.Config{})
	e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
	if e.Events() != e.Events() {
		t.Error("Events returns a different channel each call")
	}
	env.worker.take().run("x")
	evs := collect(t, e)
	if len(evs) != 4 {
		t.Errorf("got %d events, want 4", len(evs))
	}
	res, err := e.Wait(ctx(t))
	if err != nil || !res.Success || res.FinalData != "x" {
		t.Errorf("Wait after reading every event = %+v, %v; want the result", res, err)
	}
}

func TestWaitEndsWithItsContextAndCanBeCalledAgain(t *testing.T) {
	env := newEnv(t, client.Config{})
	e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
	c, cancel := context.WithCancel(ctx(t))
	cancel()
	if _, err := e.Wait(c); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context: %v, want context.Canceled", err)
	}
	env.worker.take().run("late")
	res, err := e.Wait(ctx(t))
	if err != nil || res.FinalData != "late" {
		t.Errorf("Wait again = %+v, %v; want the result", res, err)
	}
}

func TestClose(t *testing.T) {
	env := newEnv(t, client.Config{})
	stream := newEnv(t, client.Config{LiveWindow: -1}) // the stream from the start

	t.Run("Close is idempotent and stops the reader and the subscription", func(t *testing.T) {
		warm := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
		warm.Close()
		env.worker.take().ack()

		before := goleak.IgnoreCurrent()
		subs := env.cnc.NumSubscriptions()
		e, err := env.client.Submit(ctx(t), wire.Job{Sandbox: sandbox, Script: "pass"})
		if err != nil {
			t.Fatal(err)
		}
		if n := env.cnc.NumSubscriptions(); n != subs+1 {
			t.Errorf("%d subscriptions while the execution is open, want %d", n, subs+1)
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(e.Close)
		}
		wg.Wait()
		e.Close()
		if _, ok := <-e.Events(); ok {
			t.Error("Events delivered an event after Close")
		}
		if _, err := e.Wait(ctx(t)); !errors.Is(err, client.ErrClosed) {
			t.Errorf("Wait after Close: %v, want ErrClosed", err)
		}
		if n := env.cnc.NumSubscriptions(); n != subs {
			t.Errorf("%d subscriptions after Close, want %d", n, subs)
		}
		env.worker.take().ack()
		goleak.VerifyNone(t, before)
	})

	t.Run("Close on the stream path is idempotent, stops the reader and deletes the consumer", func(t *testing.T) {
		env := stream
		// A first execution makes the connection start its own
		// goroutines (the request subscription), which live as long
		// as it does.
		warm := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
		warm.Close()
		env.worker.take().ack()

		before := goleak.IgnoreCurrent()
		e, err := env.client.Submit(ctx(t), wire.Job{Sandbox: sandbox, Script: "pass"})
		if err != nil {
			t.Fatal(err)
		}
		if _, consumers := streamState(t, env.js, wire.StreamEvents); consumers != 1 {
			t.Errorf("the events stream has %d consumers while the execution is open, want 1", consumers)
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(e.Close)
		}
		wg.Wait()
		e.Close()
		if _, ok := <-e.Events(); ok {
			t.Error("Events delivered an event after Close")
		}
		if _, err := e.Wait(ctx(t)); !errors.Is(err, client.ErrClosed) {
			t.Errorf("Wait after Close: %v, want ErrClosed", err)
		}
		if _, consumers := streamState(t, env.js, wire.StreamEvents); consumers != 0 {
			t.Errorf("the events stream has %d consumers after Close, want none", consumers)
		}
		env.worker.take().ack()
		goleak.VerifyNone(t, before)
	})

	t.Run("Close after the result keeps it", func(t *testing.T) {
		e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
		env.worker.take().run("kept")
		if _, err := e.Wait(ctx(t)); err != nil {
			t.Fatal(err)
		}
		e.Close()
		res, err := e.Wait(ctx(t))
		if err != nil || res.FinalData != "kept" {
			t.Errorf("Wait after Close = %+v, %v; want the result", res, err)
		}
	})

	t.Run("an execution that ends deletes its consumer without Close", func(t *testing.T) {
		env := stream
		e, err := env.client.Submit(ctx(t), wire.Job{Sandbox: sandbox, Script: "pass"})
		if err != nil {
			t.Fatal(err)
		}
		env.worker.take().run(nil)
		collect(t, e)
		e.Close() // waits for the reader, which deletes the consumer
		if _, consumers := streamState(t, env.js, wire.StreamEvents); consumers != 0 {
			t.Errorf("the events stream has %d consumers, want none", consumers)
		}
	})
}

func TestAnEventThatCannotBeDecodedIsSkipped(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	env := newEnv(t, client.Config{Logger: logger})
	e := submit(t, env.client, wire.Job{ExecutionID: "exec-1", Sandbox: sandbox, Script: "pass"})
	d := env.worker.take()

	bad := nats.NewMsg(wire.EventSubject("exec-1", wire.EventStdout))
	bad.Data = []byte("{not json")
	bad.Header.Set(wire.HeaderContentType, wire.ContentTypeJSON)
	if _, err := env.js.PublishMsg(ctx(t), bad); err != nil {
		t.Fatal(err)
	}
	d.run("fine")

	evs := collect(t, e)
	if len(evs) != 4 {
		t.Errorf("got %d events, want the 4 good ones", len(evs))
	}
	res, err := e.Wait(ctx(t))
	if err != nil || res.FinalData != "fine" {
		t.Errorf("Wait = %+v, %v; want the result", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !bytes.Contains(logs.Bytes(), []byte("cannot be decoded")) || !bytes.Contains(logs.Bytes(), []byte("jazzmine.events.exec-1.stdout")) {
		t.Errorf("the skipped event was not logged with its subject; logs:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestEventsSurviveAServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv := startServer(t, dir, -1)
	reconnected := make(chan struct{}, 2)
	env := newEnvOn(t, srv, client.Config{},
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
	d := env.worker.take()
	d.emit(wire.Event{Type: wire.EventStarted}, wire.Event{Type: wire.EventStdout, Text: "before\n"})
	for range 2 {
		select {
		case <-e.Events():
		case <-ctx(t).Done():
			t.Fatal("no event before the restart")
		}
	}

	restartServer(t, srv, dir)
	for range 2 { // the client's connection and the worker's
		select {
		case <-reconnected:
		case <-ctx(t).Done():
			t.Fatal("the connections did not reconnect")
		}
	}
	d.emit(wire.Event{Type: wire.EventStdout, Text: "after\n"}, wire.Event{Type: wire.EventScriptDone, Success: true})

	res, err := e.Wait(ctx(t))
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if res.Stdout != "before\nafter\n" || !res.Success {
		t.Errorf("Wait = %+v, want every event once", res)
	}
}

// TestFastPathHandsOverToTheStream checks the two paths of an execution's
// events (see Execution): whatever made the execution leave the fast path,
// every event arrives once and in order.
func TestFastPathHandsOverToTheStream(t *testing.T) {
	texts := func(evs []*wire.Event) string {
		var b strings.Builder
		for _, ev := range evs {
			fmt.Fprintf(&b, "%d:%s%s ", ev.Seq, ev.Type, strings.TrimSpace(ev.Text))
		}
		return b.String()
	}

	t.Run("events published before the subscription are read from the stream", func(t *testing.T) {
		env := newEnv(t, client.Config{})
		// The first events of the execution are in the stream before the agent
		// subscribes (as for a job that a worker took before): the fast path sees
		// seq 3 first, misses 1 and 2, and hands over.
		early := &delivery{w: env.worker, job: &wire.Job{ExecutionID: "exec-early", Sandbox: sandbox}, contentType: wire.ContentTypeMsgpack, attempt: 1}
		early.emit(wire.Event{Type: wire.EventStarted}, wire.Event{Type: wire.EventStdout, Text: "one"})
		e := submit(t, env.client, wire.Job{ExecutionID: "exec-early", Sandbox: sandbox, Script: "pass"})
		d := env.worker.take()
		d.seq = early.seq
		d.emit(wire.Event{Type: wire.EventStdout, Text: "two"}, wire.Event{Type: wire.EventScriptDone, Success: true})
		d.ack()
		if got, want := texts(collect(t, e)), "1:started 2:stdoutone 3:stdouttwo 4:script_done "; got != want {
			t.Errorf("events %q, want %q", got, want)
		}
		if res, err := e.Wait(ctx(t)); err != nil || res.Stdout != "onetwo" {
			t.Errorf("Wait = %+v, %v; want stdout onetwo", res, err)
		}
	})

	t.Run("an execution longer than the live window goes on from the stream", func(t *testing.T) {
		env := newEnv(t, client.Config{LiveWindow: 100 * time.Millisecond})
		e := submit(t, env.client, wire.Job{Sandbox: sandbox, Script: "pass"})
		d := env.worker.take()
		d.emit(wire.Event{Type: wire.EventStarted}, wire.Event{Type: wire.EventStdout, Text: "early"})
		var first []*wire.Event
		for range 2 {
			select {
			case ev := <-e.Events():
				first = append(first, ev)
			case <-ctx(t).Done():
				t.Fatal("no event on the fast path")
			}
		}
		// Only a consumer on the events stream shows that the execution moved.
		deadline := time.Now().Add(testTimeout)
		for {
			if _, consumers := streamState(t, env.js, wire.StreamEvents); consumers == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the execution never moved to the events stream")
			}
			time.Sleep(10 * time.Millisecond)
		}
		d.emit(wire.Event{Type: wire.EventStdout, Text: "late"}, wire.Event{Type: wire.EventScriptDone, Success: true})
		d.ack()
		if got, want := texts(append(first, collect(t, e)...)), "1:started 2:stdoutearly 3:stdoutlate 4:script_done "; got != want {
			t.Errorf("events %q, want %q", got, want)
		}
	})
}
