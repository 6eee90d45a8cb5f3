package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/wire"
)

// events is the worker's side of the events stream: it makes the publisher of each
// attempt, and tells whether an execution has its end.
type events struct {
	js       jetstream.JetStream
	nc       *nats.Conn       // whose server's max payload bounds an event
	stream   jetstream.Stream // StreamEvents
	workerID string
}

// publisher returns the publisher of one attempt of ref's execution, in encoding ct,
// whose events carry metadata. Attempt 0 is no delivery's: the cancel of a queued job.
func (e *events) publisher(ref execRef, attempt int, ct string, metadata map[string]string) *publisher {
	return &publisher{js: e.js, workerID: e.workerID, ref: ref, attempt: attempt, ct: ct, metadata: metadata,
		maxData: int(e.nc.MaxPayload()) - eventHeaderRoom}
}

// ended reports whether the stream holds a script_done of the execution with key. An
// error is the stream's, other than its having none.
func (e *events) ended(ctx context.Context, key string) (bool, error) {
	_, err := e.stream.GetLastMsgForSubject(ctx, wire.EventSubject(key, wire.EventScriptDone))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	return err == nil, err
}

// publishContext bounds the wait for the acks of an execution's events.
func publishContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), DefaultEventPublishLimit)
}

// publisher publishes the events of one attempt of one execution, numbered from 1, in
// the job's encoding, without waiting for each ack; wait collects the acks.
type publisher struct {
	js       jetstream.JetStream
	workerID string
	ref      execRef // the execution: its id goes in the events, its key in subjects
	attempt  int
	ct       string
	metadata map[string]string

	seq     uint64
	trace   wire.HeaderCarrier // trace context put on every event
	pending []jetstream.PubAckFuture
	// held are events a passing failure to send (too many acks outstanding, the
	// reconnect buffer full) kept back, in order: sent before anything else.
	held   []*nats.Msg
	err    error // the first publish error
	unsent bool  // an event was never sent: sending the pending ones again cannot make up for it

	// maxData is the largest encoded event the server takes (its max payload, less
	// room for the headers); lost says why the result was not sent, if it was too
	// large, and makes the script_done a failure.
	maxData int
	lost    string
}

// eventHeaderRoom is what an event's headers (message id, content type, trace
// context) may take of the server's max payload.
const eventHeaderRoom = 4 << 10

// eventTraceRoom is what an event's trace headers may take of eventHeaderRoom. A job's
// tracestate and baggage may be far larger (W3C allows 32 tracestate members of 512
// bytes); an event carries the traceparent, then each other header that still fits.
const eventTraceRoom = 2 << 10

// publish sends ev after filling the fields every event carries. An event whose
// payload cannot be encoded (a number JSON cannot carry, say) is replaced by an error
// event that says so.
func (p *publisher) publish(ev *wire.Event) error {
	if p.err != nil {
		return p.err
	}
	p.seq++
	ev.ExecutionID, ev.Seq, ev.Attempt, ev.WorkerID, ev.Time, ev.Metadata = p.ref.id, p.seq, p.attempt, p.workerID, time.Now().UTC(), p.metadata
	if ev.Type == wire.EventScriptDone && p.lost != "" {
		ev.Success, ev.Error, ev.FinalData = false, p.lost, nil
	}
	data, err := wire.EncodeEvent(p.ct, ev)
	if err != nil && ev.Type == wire.EventScriptDone {
		// An execution always ends with its script_done: one whose result cannot be
		// encoded ends failed, saying why, without the result.
		ev.Success, ev.FinalData = false, nil
		ev.Error = fmt.Sprintf("the result could not be encoded: %v", err)
		data, err = wire.EncodeEvent(p.ct, ev)
	} else if err != nil {
		ev = p.replace(ev, wire.EventError, fmt.Sprintf("the %s event could not be encoded: %v", ev.Type, err))
		data, err = wire.EncodeEvent(p.ct, ev)
	}
	if err == nil && p.maxData > 0 && len(data) > p.maxData {
		ev, data, err = p.fit(ev, len(data))
	}
	if err != nil {
		p.err, p.unsent = fmt.Errorf("encode event: %w", err), true
		return p.err
	}
	msg := &nats.Msg{Subject: wire.EventSubject(p.ref.key(), ev.Type), Data: data, Header: nats.Header{}}
	msg.Header.Set(wire.HeaderMsgID, wire.EventMsgID(p.ref.key(), p.attempt, p.seq))
	msg.Header.Set(wire.HeaderContentType, p.ct)
	if ev.Type == wire.EventScriptDone {
		// The stream itself keeps an execution to one end: it refuses a script_done on
		// a subject that has one (see endExists).
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	}
	for k, v := range p.trace {
		msg.Header[k] = v
	}
	p.held = append(p.held, msg)
	if err := p.send(); err != nil {
		p.err, p.unsent = fmt.Errorf("publish %s event of %s: %w", ev.Type, p.ref, err), true
		return p.err
	}
	return nil
}

// send publishes the held events, in order, until one fails. A failure that passes by
// itself (Transient) keeps the rest held, for the next event or
// store to send: the script is not run again for it. Any other is returned.
func (p *publisher) send() error {
	for len(p.held) > 0 {
		f, err := p.js.PublishMsgAsync(p.held[0])
		if err != nil {
			if Transient(err) {
				return nil
			}
			return err
		}
		p.pending = append(p.pending, f)
		p.held[0] = nil
		p.held = p.held[1:]
	}
	return nil
}

// replace returns an event of type typ that stands for ev, with what ev would have
// said in msg: an error (of kind script) or a warning log.
func (p *publisher) replace(ev *wire.Event, typ, msg string) *wire.Event {
	out := &wire.Event{ExecutionID: ev.ExecutionID, Type: typ, Seq: ev.Seq, Attempt: ev.Attempt, WorkerID: ev.WorkerID, Time: ev.Time, Metadata: ev.Metadata}
	if typ == wire.EventError {
		out.Kind, out.Error = wire.KindScript, msg
	} else {
		out.Level, out.Message = "warning", msg
	}
	return out
}

// fit makes an event of size bytes that the server would refuse (over its max
// payload) into one it takes, and says what was cut: a result too large is an
// output_limit error (and the script_done a failure), an intermediate is a warning, a
// display keeps its image and a note for its text forms, the text of other events is
// cut short, shorter each round while it does not fit (JSON may escape a byte as six),
// and the metadata goes last. A too-large event would otherwise fail to publish, and
// the job run again.
func (p *publisher) fit(ev *wire.Event, size int) (*wire.Event, []byte, error) {
	why := fmt.Sprintf("%d bytes, more than the %d an event may hold", size, p.maxData)
	switch ev.Type {
	case wire.EventFinalResult:
		p.lost = "the result is " + why + ": return less, or write it to a file"
		ev = p.replace(ev, wire.EventError, p.lost)
		ev.Kind = wire.KindOutputLimit
	case wire.EventIntermediate:
		ev = p.replace(ev, wire.EventLog, fmt.Sprintf("intermediate %q not sent: it is %s", ev.Label, why))
	case wire.EventDisplay, wire.EventExecuteResult:
		ev.Data = map[string]any{"text/plain": "[" + ev.Type + " not sent: it is " + why + "]"}
	case wire.EventScriptDone:
		ev.FinalData = nil // the final_result event carried it
	}
	texts := []*string{&ev.Text, &ev.Message, &ev.Error, &ev.Traceback, &ev.Level, &ev.Label} // the script's strings
	whole := make([]string, len(texts))
	for i, s := range texts {
		whole[i] = *s
	}
	for n := p.maxData / 4; ; n /= 4 {
		for i, s := range texts {
			*s = cut(whole[i], n)
		}
		if n < 1<<10 {
			ev.Metadata = nil
		}
		data, err := wire.EncodeEvent(p.ct, ev)
		if err != nil || len(data) <= p.maxData {
			return ev, data, err
		}
		if n == 0 {
			return ev, nil, fmt.Errorf("the %s event is %d bytes even cut, more than %d", ev.Type, len(data), p.maxData)
		}
	}
}

// cut shortens s to at most n bytes (on a rune boundary) and says so.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	end := n
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + fmt.Sprintf(" [cut: %d of %d bytes]", end, len(s))
}

// traceFrom makes every event carry the trace context of ctx, within eventTraceRoom:
// the traceparent, then each other header, by name, that still fits.
func (p *publisher) traceFrom(ctx context.Context, prop propagation.TextMapPropagator) {
	c := wire.HeaderCarrier{}
	prop.Inject(ctx, c)
	others := slices.DeleteFunc(slices.Sorted(maps.Keys(c)), func(k string) bool { return k == "traceparent" })
	kept, room := wire.HeaderCarrier{}, eventTraceRoom
	for _, k := range append([]string{"traceparent"}, others...) {
		size := len(k) + 4 // "k: v\r\n"
		for _, v := range c[k] {
			size += len(v)
		}
		if len(c[k]) > 0 && size <= room {
			kept[k], room = c[k], room-size
		}
	}
	if len(kept) > 0 {
		p.trace = kept
	}
}

// wait returns once the stream has acknowledged every event published so far, or
// the first failure.
func (p *publisher) wait(ctx context.Context) error {
	if p.err != nil {
		return p.err
	}
	if err := p.send(); err != nil {
		p.err, p.unsent = fmt.Errorf("publish the events of %s: %w", p.ref, err), true
		return p.err
	}
	if len(p.held) > 0 {
		p.err = fmt.Errorf("events of %s not sent yet: %w", p.ref, jetstream.ErrTooManyStalledMsgs)
		return p.err
	}
	for _, f := range p.pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if endExists(err) {
				continue // this execution has its script_done: another attempt's, or this one sent again
			}
			p.err = fmt.Errorf("event of %s not stored: %w", p.ref, err)
			return p.err
		case <-ctx.Done():
			p.err = fmt.Errorf("wait for event acks of %s: %w", p.ref, ctx.Err())
			return p.err
		}
	}
	p.pending = p.pending[:0]
	return nil
}

// endExists reports whether err is the stream refusing a script_done because the
// execution has one already (the expected last sequence of its subject was 0). A
// replicated stream answers 10164 where a single server answers 10071.
func endExists(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// terminal publishes an error and the script_done that ends the attempt, and waits for
// their acks.
func (p *publisher) terminal(kind, msg string) error {
	_ = p.publish(&wire.Event{Type: wire.EventError, Kind: kind, Error: msg})
	_ = p.publish(&wire.Event{Type: wire.EventScriptDone, Success: false, Error: msg})
	ctx, cancel := publishContext()
	defer cancel()
	return p.wait(ctx)
}

// fromHarness turns a harness event into the event published for it; the harness's
// own script_done is not published (the worker publishes one from the Result).
func fromHarness(ev harness.Event) (*wire.Event, bool) {
	out := &wire.Event{Type: ev.Type}
	switch ev.Type {
	case wire.EventIntermediate:
		out.Label, out.Data = ev.Label, dataOf(ev.Data, ev.Nonfinite)
	case wire.EventFinalResult:
		out.Data = dataOf(ev.Data, ev.Nonfinite)
	case wire.EventLog:
		out.Level, out.Message = ev.Level, ev.Message
	case wire.EventStdout, wire.EventStderr:
		out.Text = ev.Text
	case wire.EventError:
		out.Error, out.Traceback, out.Kind, out.Hint = ev.Error, ev.Traceback, ev.Kind, ev.Hint
	case wire.EventDisplay:
		out.Data = rawOrNil(ev.Data) // the text forms; files.put adds the image
	case wire.EventExecuteResult:
		out.Data, out.ExecutionCount = rawOrNil(ev.Data), ev.ExecutionCount
	case wire.EventArtifact: // files.put fills it in
	default:
		return nil, false
	}
	return out, true
}

// scriptDone is the event that ends an attempt that ran.
func scriptDone(res *harness.Result) *wire.Event {
	return &wire.Event{
		Type:            wire.EventScriptDone,
		Success:         res.Success,
		DurationMS:      res.DurationMS,
		OutputBytes:     res.OutputBytes,
		Error:           res.Error,
		FinalData:       dataOf(res.FinalData, res.FinalNonfinite),
		CPUMS:           res.CPUMS,
		PeakMemoryBytes: res.PeakMemoryBytes,
	}
}

func rawOrNil(b []byte) any {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}

// dataOf is the data of a harness event: its raw JSON, with the NaNs and infinities
// its places name put back (raw JSON that does not decode stays raw, and fails to
// encode as any such does: see publish).
func dataOf(b []byte, places wire.Nonfinites) any {
	if b == nil || len(places) == 0 {
		return rawOrNil(b)
	}
	v, err := wire.WithNonfinite(b, places)
	if err != nil {
		return json.RawMessage(b)
	}
	return v
}

// The delays between two tries to store an execution's events.
const (
	storeMinDelay = 250 * time.Millisecond
	storeMaxDelay = 5 * time.Second
)

// store waits until the events stream has stored every event p published. While
// the stream cannot store them for now (the server that led it was lost and a new
// leader is being elected, or the worker's connection is failing over), it sends the
// same messages again, whose Nats-Msg-Id makes the stream keep each one once, and
// waits again, a little longer each time, until they are stored, a failure that is
// not of that kind, or stop closes (the end of the worker's grace period at
// shutdown). Meanwhile the job's heartbeat keeps it this worker's. Without this, a failover of a few
// seconds used up every delivery of the jobs it caught (each ran again, and failed
// to store its events again) and left them without any event.
func (p *publisher) store(stop <-chan struct{}, log *slog.Logger) error {
	delay := storeMinDelay
	for {
		ctx, cancel := publishContext()
		err := p.wait(ctx)
		cancel()
		if err == nil || p.unsent || !Transient(err) {
			return err
		}
		log.Warn("events not stored yet; sending them again", "execution_id", p.ref, "events", len(p.pending), "in", delay, "err", err)
		select {
		case <-time.After(delay):
		case <-stop:
			return err
		}
		delay = min(2*delay, storeMaxDelay)
		ctx, cancel = publishContext()
		p.republish(ctx)
		cancel()
	}
}

// republish sends every event whose ack is pending again (those the stream stored
// are dropped as duplicates; a stream that was lost and recreated gets them back), as new messages (the old one's
// reply subject belongs to the old ack), one at a time and in order: each waits for
// the stream to store the one before, so that a stream coming back midway does not
// store a later event before an earlier one. It stops at the first failure, which
// wait then reports; the rest stays pending for the next try.
func (p *publisher) republish(ctx context.Context) {
	sent := p.pending
	p.pending, p.err = nil, nil
	for i, f := range sent {
		old := f.Msg()
		_, err := p.js.PublishMsg(ctx, &nats.Msg{Subject: old.Subject, Header: old.Header, Data: old.Data})
		if err != nil && !endExists(err) {
			p.pending = sent[i:] // for the next try
			p.err = fmt.Errorf("event of %s not stored: %w", p.ref, err)
			return
		}
	}
}

// Transient reports whether err is JetStream unable to serve for now, a failure
// that passes by itself: a request or an ack that timed out or found no responder, a
// 503 (no meta leader yet, a stream's group electing its leader), or a publish the
// client held back (too many acks outstanding, the reconnect buffer full). The worker
// sends events again for it; cmd/worker tries its start again for it.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrTooManyStalledMsgs),
		errors.Is(err, nats.ErrReconnectBufExceeded):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == http.StatusServiceUnavailable
	}
	return false
}
