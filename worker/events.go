package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/wire"
)

// publisher publishes the events of one attempt of one execution, numbered from 1, in
// the job's encoding, without waiting for each ack; wait collects the acks.
type publisher struct {
	js       jetstream.JetStream
	workerID string
	id       string
	attempt  int
	ct       string
	metadata map[string]string

	seq     uint64
	trace   wire.HeaderCarrier // trace context put on every event
	pending []jetstream.PubAckFuture
	err     error // the first publish error
	unsent  bool  // an event was never sent: sending the pending ones again cannot make up for it
}

func (w *Worker) newPublisher(id string, attempt int, ct string, metadata map[string]string) *publisher {
	return &publisher{js: w.js, workerID: w.cfg.WorkerID, id: id, attempt: attempt, ct: ct, metadata: metadata}
}

// publish sends ev after filling the fields every event carries. An event whose
// payload cannot be encoded (a number JSON cannot carry, say) is replaced by an error
// event that says so.
func (p *publisher) publish(ev *wire.Event) error {
	if p.err != nil {
		return p.err
	}
	p.seq++
	ev.ExecutionID, ev.Seq, ev.Attempt, ev.WorkerID, ev.Time, ev.Metadata = p.id, p.seq, p.attempt, p.workerID, time.Now().UTC(), p.metadata
	data, err := wire.EncodeEvent(p.ct, ev)
	if err != nil {
		ev = &wire.Event{ExecutionID: p.id, Type: wire.EventError, Seq: p.seq, Attempt: p.attempt, WorkerID: p.workerID, Time: ev.Time, Metadata: p.metadata,
			Kind: wire.KindScript, Error: fmt.Sprintf("the %s event could not be encoded: %v", ev.Type, err)}
		if data, err = wire.EncodeEvent(p.ct, ev); err != nil {
			p.err, p.unsent = fmt.Errorf("encode event: %w", err), true
			return p.err
		}
	}
	msg := &nats.Msg{Subject: wire.EventSubject(p.id, ev.Type), Data: data, Header: nats.Header{}}
	msg.Header.Set(wire.HeaderMsgID, wire.EventMsgID(p.id, p.attempt, p.seq))
	msg.Header.Set(wire.HeaderContentType, p.ct)
	for k, v := range p.trace {
		msg.Header[k] = v
	}
	f, err := p.js.PublishMsgAsync(msg)
	if err != nil {
		p.err, p.unsent = fmt.Errorf("publish %s event of %s: %w", ev.Type, p.id, err), true
		return p.err
	}
	p.pending = append(p.pending, f)
	return nil
}

// traceFrom makes every event carry the trace context of ctx.
func (p *publisher) traceFrom(ctx context.Context, prop propagation.TextMapPropagator) {
	c := wire.HeaderCarrier{}
	prop.Inject(ctx, c)
	if len(c) > 0 {
		p.trace = c
	}
}

// wait returns once the stream has acknowledged every event published so far, or
// the first failure.
func (p *publisher) wait(ctx context.Context) error {
	if p.err != nil {
		return p.err
	}
	for _, f := range p.pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			p.err = fmt.Errorf("event of %s not stored: %w", p.id, err)
			return p.err
		case <-ctx.Done():
			p.err = fmt.Errorf("wait for event acks of %s: %w", p.id, ctx.Err())
			return p.err
		}
	}
	p.pending = p.pending[:0]
	return nil
}

// terminal publishes an error and the script_done that ends the attempt, and waits for
// their acks.
func (p *publisher) terminal(kind, msg string) error {
	_ = p.publish(&wire.Event{Type: wire.EventError, Kind: kind, Error: msg})
	_ = p.publish(&wire.Event{Type: wire.EventScriptDone, Success: false, Error: msg})
	ctx, cancel := context.WithTimeout(context.Background(), DefaultEventPublishLimit)
	defer cancel()
	return p.wait(ctx)
}

// fromHarness turns a harness event into the event published for it; the harness's
// own script_done is not published (the worker publishes one from the Result).
func fromHarness(ev harness.Event) (*wire.Event, bool) {
	out := &wire.Event{Type: ev.Type}
	switch ev.Type {
	case harness.EventIntermediate:
		out.Label, out.Data = ev.Label, rawOrNil(ev.Data)
	case harness.EventFinalResult:
		out.Data = rawOrNil(ev.Data)
	case harness.EventLog:
		out.Level, out.Message = ev.Level, ev.Message
	case harness.EventStdout, harness.EventStderr:
		out.Text = ev.Text
	case harness.EventError:
		out.Error, out.Traceback, out.Kind = ev.Error, ev.Traceback, ev.Kind
	default:
		return nil, false
	}
	return out, true
}

// scriptDone is the event that ends an attempt that ran.
func scriptDone(res *harness.Result) *wire.Event {
	return &wire.Event{
		Type:        wire.EventScriptDone,
		Success:     res.Success,
		DurationMS:  res.DurationMS,
		OutputBytes: res.OutputBytes,
		Error:       res.Error,
		FinalData:   rawOrNil(res.FinalData),
	}
}

func rawOrNil(b []byte) any {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}
