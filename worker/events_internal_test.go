package worker

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// stallingJS refuses the first sends the way nats.go does when too many acks are
// outstanding, then sends as usual.
type stallingJS struct {
	jetstream.JetStream
	refusals atomic.Int32
}

func (s *stallingJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if s.refusals.Add(-1) >= 0 {
		return nil, jetstream.ErrTooManyStalledMsgs
	}
	return s.JetStream.PublishMsgAsync(m, opts...)
}

// eventsStream makes the events stream on an in-process server and returns a
// publisher for execution "x" whose sends the first refusals times are refused.
func eventsStream(t *testing.T, refusals int32, maxData int) (*publisher, jetstream.Stream) {
	t.Helper()
	_, nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: wire.StreamEvents, Subjects: []string{"jazzmine.events.>"}})
	if err != nil {
		t.Fatal(err)
	}
	fake := &stallingJS{JetStream: js}
	fake.refusals.Store(refusals)
	return &publisher{js: fake, ref: execRef{id: "x"}, attempt: 1, ct: wire.ContentTypeJSON, maxData: maxData}, stream
}

// stored returns the events of "x" in the stream, in order.
func stored(t *testing.T, stream jetstream.Stream) []*wire.Event {
	t.Helper()
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var evs []*wire.Event
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Data) > 1<<20 {
			t.Errorf("event %d is %d bytes", seq, len(m.Data))
		}
		ev, err := wire.DecodeEvent(wire.ContentTypeJSON, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestASendRefusedForNowIsSentLaterNotRunAgain: a send that nats.go refuses for now
// (too many acks outstanding, the reconnect buffer full) neither fails the execution
// (which would run the script again) nor loses or reorders an event.
func TestASendRefusedForNowIsSentLaterNotRunAgain(t *testing.T) {
	p, stream := eventsStream(t, 3, 1<<20)
	for _, ev := range []*wire.Event{{Type: wire.EventStarted}, {Type: wire.EventStdout, Text: "hi"}, {Type: wire.EventScriptDone, Success: true}} {
		if err := p.publish(ev); err != nil {
			t.Fatalf("publish %s: %v", ev.Type, err)
		}
	}
	if err := p.store(t.Context().Done(), slog.Default()); err != nil {
		t.Fatalf("store: %v", err)
	}
	var got []string
	for _, ev := range stored(t, stream) {
		got = append(got, ev.Type)
	}
	if strings.Join(got, ",") != "started,stdout,script_done" {
		t.Errorf("stored %v, want every event once, in order", got)
	}
}

// TestAnEventTooLargeForTheServerIsCutAndSaysSo: no event is larger than the server
// takes. A result that is becomes an output_limit error and a failed script_done; an
// intermediate, a warning; a long log is cut short, saying so.
func TestAnEventTooLargeForTheServerIsCutAndSaysSo(t *testing.T) {
	p, stream := eventsStream(t, 0, 4096)
	big := strings.Repeat("x", 10_000)
	for _, ev := range []*wire.Event{
		{Type: wire.EventIntermediate, Label: "table", Data: big},
		{Type: wire.EventLog, Level: "info", Message: big},
		{Type: wire.EventFinalResult, Data: big},
		{Type: wire.EventScriptDone, Success: true, FinalData: big},
	} {
		if err := p.publish(ev); err != nil {
			t.Fatalf("publish %s: %v", ev.Type, err)
		}
	}
	if err := p.store(t.Context().Done(), slog.Default()); err != nil {
		t.Fatalf("store: %v", err)
	}
	evs := stored(t, stream)
	if len(evs) != 4 {
		t.Fatalf("stored %d events, want 4", len(evs))
	}
	if ev := evs[0]; ev.Type != wire.EventLog || !strings.Contains(ev.Message, `intermediate "table" not sent`) {
		t.Errorf("intermediate became %+v", ev)
	}
	if ev := evs[1]; ev.Type != wire.EventLog || len(ev.Message) > 4096 || !strings.Contains(ev.Message, "[cut: ") {
		t.Errorf("log became %s %d bytes", ev.Type, len(ev.Message))
	}
	if ev := evs[2]; ev.Type != wire.EventError || ev.Kind != wire.KindOutputLimit || !strings.Contains(ev.Error, "the result is") {
		t.Errorf("result became %+v", ev)
	}
	if ev := evs[3]; ev.Type != wire.EventScriptDone || ev.Success || ev.FinalData != nil || ev.Error != evs[2].Error {
		t.Errorf("script_done %+v, want a failure that says why", ev)
	}
}

// TestAnEventThatCannotBeCutOnceIsCutAgainNotRunAgain: a display whose text forms
// are too large keeps its image and says so; an error whose traceback JSON escapes six
// bytes for one is cut until it fits, and so is a log's level; metadata that leaves no
// room goes. Before, each
// failed to publish "even cut", and the job ran again (a review sent a 2 MB display).
func TestAnEventThatCannotBeCutOnceIsCutAgainNotRunAgain(t *testing.T) {
	p, stream := eventsStream(t, 0, 4096)
	html := `{"text/html":"` + strings.Repeat("x", 10_000) + `"}`
	for _, ev := range []*wire.Event{
		{Type: wire.EventDisplay, Data: json.RawMessage(html), Path: "display/1.png", Object: "obj", Size: 3},
		{Type: wire.EventError, Kind: wire.KindScript, Error: "boom", Traceback: strings.Repeat("\x01", 10_000)},
		{Type: wire.EventLog, Level: strings.Repeat("l", 10_000), Message: "hi"}, // emit_log's level is the script's
	} {
		if err := p.publish(ev); err != nil {
			t.Fatalf("publish %s: %v", ev.Type, err)
		}
	}
	p.metadata = map[string]string{"big": strings.Repeat("m", 5000)}
	if err := p.publish(&wire.Event{Type: wire.EventScriptDone, Error: "boom"}); err != nil {
		t.Fatalf("publish script_done with metadata too large: %v", err)
	}
	if err := p.store(t.Context().Done(), slog.Default()); err != nil {
		t.Fatalf("store: %v", err)
	}
	evs := stored(t, stream)
	if len(evs) != 4 {
		t.Fatalf("stored %d events, want 4", len(evs))
	}
	if ev := evs[0]; ev.Type != wire.EventDisplay || ev.Object != "obj" || ev.Path != "display/1.png" ||
		!strings.HasPrefix(ev.Data.(map[string]any)["text/plain"].(string), "[display not sent: it is ") {
		t.Errorf("display became %+v", ev)
	}
	if ev := evs[1]; ev.Type != wire.EventError || ev.Kind != wire.KindScript || ev.Error != "boom" || !strings.Contains(ev.Traceback, "[cut: ") {
		t.Errorf("error became %s %s %q, traceback of %d bytes", ev.Type, ev.Kind, ev.Error, len(ev.Traceback))
	}
	if ev := evs[2]; ev.Type != wire.EventLog || ev.Message != "hi" || !strings.Contains(ev.Level, "[cut: ") {
		t.Errorf("log became %s %q, level of %d bytes", ev.Type, ev.Message, len(ev.Level))
	}
	if ev := evs[3]; ev.Type != wire.EventScriptDone || ev.Error != "boom" || ev.Metadata != nil {
		t.Errorf("script_done became %+v", ev)
	}
}

// TestAnEventCarriesTheTraceparentAndWhatFitsOfTheRest: a job's tracestate and
// baggage may be as large as W3C allows (32 members of 512 bytes); events carry its
// traceparent and what fits in eventTraceRoom, so that eventHeaderRoom holds. Before,
// every event copied 24 KB of them, a result near the limit could not be published,
// and the job ran again (a review's attack).
func TestAnEventCarriesTheTraceparentAndWhatFitsOfTheRest(t *testing.T) {
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	var members, items []string
	for i := range 32 {
		members = append(members, fmt.Sprintf("k%03d%s=%s", i, strings.Repeat("a", 252), strings.Repeat("v", 256)))
	}
	for i := range 60 {
		items = append(items, fmt.Sprintf("b%02d=%s", i, strings.Repeat("x", 125)))
	}
	parent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, tc := range []struct {
		name       string
		tracestate string
		baggage    string
		want       []string
	}{
		{"small", "vendor=value", "user=1", []string{"baggage", "traceparent", "tracestate"}},
		{"as large as allowed", strings.Join(members, ","), strings.Join(items, ","), []string{"traceparent"}},
		{"a large baggage", "vendor=value", strings.Join(items, ","), []string{"traceparent", "tracestate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := prop.Extract(t.Context(), wire.HeaderCarrier{"traceparent": {parent}, "tracestate": {tc.tracestate}, "baggage": {tc.baggage}})
			p := &publisher{}
			p.traceFrom(ctx, prop)
			size := 0
			for k, vs := range p.trace {
				for _, v := range vs {
					size += len(k) + len(v) + 4
				}
			}
			if got := slices.Sorted(maps.Keys(p.trace)); !slices.Equal(got, tc.want) || size > eventTraceRoom || p.trace.Get("traceparent") != parent {
				t.Errorf("events carry %v (%d bytes), want %v within %d and the traceparent", got, size, tc.want, eventTraceRoom)
			}
		})
	}
}

// TestTheStreamKeepsAnExecutionToOneEnd: a second attempt's script_done, and this
// attempt's sent again after its ack was lost, find one there already: the stream
// keeps one, and neither publisher counts it a failure (which would run the job again).
func TestTheStreamKeepsAnExecutionToOneEnd(t *testing.T) {
	first, stream := eventsStream(t, 0, 1<<20)
	second := &publisher{js: first.js, ref: execRef{id: "x"}, attempt: 2, ct: wire.ContentTypeJSON, maxData: 1 << 20}
	for _, p := range []*publisher{first, second} {
		if err := p.publish(&wire.Event{Type: wire.EventScriptDone, Success: true}); err != nil {
			t.Fatal(err)
		}
		if err := p.store(t.Context().Done(), slog.Default()); err != nil {
			t.Fatalf("attempt %d: %v", p.attempt, err)
		}
	}
	first.seq-- // the same event again, as after a lost ack
	if err := first.publish(&wire.Event{Type: wire.EventScriptDone, Success: true}); err != nil {
		t.Fatal(err)
	}
	if err := first.store(t.Context().Done(), slog.Default()); err != nil {
		t.Fatalf("sent again: %v", err)
	}
	evs := stored(t, stream)
	if len(evs) != 1 || evs[0].Attempt != 1 {
		t.Errorf("stored %d script_done events (%+v), want the first attempt's alone", len(evs), evs)
	}
}
