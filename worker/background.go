package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Background work: what a worker does for a message of one of its subscriptions
// beyond answering it at once, the coordination of a cancel and the answer to a job
// for a sandbox no worker serves.
const (
	// backgroundLimit caps the background tasks a worker runs at once.
	backgroundLimit = 32
	// backgroundTimeout bounds one background task.
	backgroundTimeout = 10 * time.Second
)

// background runs the worker's background tasks, at most backgroundLimit at once.
type background struct {
	log *slog.Logger

	mu      sync.Mutex // guards closed, full and dropped
	closed  bool       // no more tasks may start
	full    bool       // a message waits for a slot; logged once
	dropped map[*nats.Subscription]int

	slots chan struct{} // a token per task running
	stop  chan struct{} // closed with closed
	wg    sync.WaitGroup
}

func newBackground(log *slog.Logger) *background {
	return &background{log: log, dropped: map[*nats.Subscription]int{}, slots: make(chan struct{}, backgroundLimit), stop: make(chan struct{})}
}

// goBackground runs f as a background task: see background.run.
func (w *Worker) goBackground(m *nats.Msg, f func(ctx context.Context)) { w.bg.run(m, f) }

// run runs f on its own goroutine with a bounded context, unless the worker is
// shutting down; close waits for it. It is called by the handler of the NATS
// subscription that received m. At most backgroundLimit tasks run at once: beyond
// them the handler waits until one ends (or the worker shuts down), so the messages
// after m wait in the subscription's buffer, which nats.go bounds (its pending
// limits, by default 512 Ki messages or 64 MiB). Nothing is dropped here: a cancel
// or an unknown sandbox's job left out would go unanswered. What the client drops
// beyond its limits (a slow consumer) is logged, with the count, at the next task.
func (b *background) run(m *nats.Msg, f func(ctx context.Context)) {
	select {
	case b.slots <- struct{}{}:
		b.mu.Lock()
		b.full = false
		b.mu.Unlock()
	default:
		b.mu.Lock()
		first := !b.full
		b.full = true
		b.mu.Unlock()
		if first {
			b.log.Warn("background work at its limit: messages wait for a task to end", "limit", backgroundLimit, "subject", m.Subject)
		}
		select {
		case b.slots <- struct{}{}:
		case <-b.stop:
			return
		}
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.slots
		return
	}
	b.wg.Add(1)
	dropped := b.droppedLocked(m.Sub)
	b.mu.Unlock()
	if dropped > 0 {
		b.log.Error("messages dropped by the NATS client while background work was at its limit (slow consumer)", "subject", m.Sub.Subject, "dropped", dropped)
	}
	go func() {
		defer func() { <-b.slots; b.wg.Done() }()
		ctx, cancel := context.WithTimeout(context.Background(), backgroundTimeout)
		defer cancel()
		f(ctx)
	}()
}

// droppedLocked returns how many messages the client dropped for sub since the last
// call.
func (b *background) droppedLocked(sub *nats.Subscription) int {
	if sub == nil {
		return 0
	}
	n, err := sub.Dropped()
	if err != nil || n <= b.dropped[sub] {
		return 0
	}
	d := n - b.dropped[sub]
	b.dropped[sub] = n
	return d
}

// close releases handlers waiting for a slot and waits for the tasks under way. It
// is safe to call more than once.
func (b *background) close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.stop)
	}
	b.mu.Unlock()
	b.wg.Wait()
}
