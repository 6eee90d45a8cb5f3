package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The delays between two tries to store an execution's events.
const (
	storeMinDelay = 250 * time.Millisecond
	storeMaxDelay = 5 * time.Second
)

// storeEvents waits until the events stream has stored every event p published.
// While the stream cannot store them for now (the server that led it was lost and a
// new leader is being elected, or the worker's connection is failing over), it sends
// the same messages again, whose Nats-Msg-Id makes the stream keep each one once, and
// waits again, a little longer each time, until they are stored, a failure that is
// not of that kind, or the end of the worker's grace period at shutdown. Meanwhile
// the job's heartbeat keeps it this worker's. Without this, a failover of a few
// seconds used up every delivery of the jobs it caught (each ran again, and failed
// to store its events again) and left them without any event.
func (w *Worker) storeEvents(p *publisher, log *slog.Logger) error {
	delay := storeMinDelay
	for {
		ctx, cancel := w.publishContext()
		err := p.wait(ctx)
		cancel()
		if err == nil || p.unsent || !Transient(err) {
			return err
		}
		log.Warn("events not stored yet; sending them again", "execution_id", p.ref, "events", len(p.pending), "in", delay, "err", err)
		select {
		case <-time.After(delay):
		case <-w.jobs.Done():
			return err
		}
		delay = min(2*delay, storeMaxDelay)
		ctx, cancel = w.publishContext()
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
