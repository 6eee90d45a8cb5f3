package worker

import (
	"context"
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

// goBackground runs f on its own goroutine with a bounded context, unless the worker
// is shutting down; Shutdown waits for it. It is called by the handler of the NATS
// subscription that received m. At most backgroundLimit tasks run at once: beyond
// them the handler waits until one ends (or the worker shuts down), so the messages
// after m wait in the subscription's buffer, which nats.go bounds (its pending
// limits, by default 512 Ki messages or 64 MiB). Nothing is dropped here: a cancel
// or an unknown sandbox's job left out would go unanswered. What the client drops
// beyond its limits (a slow consumer) is logged, with the count, at the next task.
func (w *Worker) goBackground(m *nats.Msg, f func(ctx context.Context)) {
	select {
	case w.bgSlots <- struct{}{}:
		w.mu.Lock()
		w.bgFull = false
		w.mu.Unlock()
	default:
		w.mu.Lock()
		first := !w.bgFull
		w.bgFull = true
		w.mu.Unlock()
		if first {
			w.log.Warn("background work at its limit: messages wait for a task to end", "limit", backgroundLimit, "subject", m.Subject)
		}
		select {
		case w.bgSlots <- struct{}{}:
		case <-w.bgStop:
			return
		}
	}
	w.mu.Lock()
	if w.bgClosed {
		w.mu.Unlock()
		<-w.bgSlots
		return
	}
	w.background.Add(1)
	dropped := w.droppedLocked(m.Sub)
	w.mu.Unlock()
	if dropped > 0 {
		w.log.Error("messages dropped by the NATS client while background work was at its limit (slow consumer)", "subject", m.Sub.Subject, "dropped", dropped)
	}
	go func() {
		defer func() { <-w.bgSlots; w.background.Done() }()
		ctx, cancel := context.WithTimeout(context.Background(), backgroundTimeout)
		defer cancel()
		f(ctx)
	}()
}

// droppedLocked returns how many messages the client dropped for sub since the last
// call.
func (w *Worker) droppedLocked(sub *nats.Subscription) int {
	if sub == nil {
		return 0
	}
	n, err := sub.Dropped()
	if err != nil || n <= w.bgDropped[sub] {
		return 0
	}
	d := n - w.bgDropped[sub]
	w.bgDropped[sub] = n
	return d
}

// closeBackground releases handlers waiting for a slot and waits for the background
// work under way. It is safe to call more than once.
func (w *Worker) closeBackground() {
	w.mu.Lock()
	if !w.bgClosed {
		w.bgClosed = true
		close(w.bgStop)
	}
	w.mu.Unlock()
	w.background.Wait()
}
