package client

import (
	"context"
	"fmt"
	"time"
)

// resume replaces the execution's events consumer, which failed for good (it
// could not recreate itself within consumerResetAttempts), with a new one that
// starts after the last event read: no event is lost or delivered twice. It
// tries again, each time a little later, until it has one, the execution is
// closed, or the events stream is gone. cause is the failure, for the log.
//
// The consumer it replaces is not deleted: it was lost with its server, or
// cannot be reached, and a delete would wait for the same; the server removes
// it after consumerInactiveThreshold.
func (e *Execution) resume(cause error) error {
	delay := resumeMinDelay
	for {
		e.c.log.Debug("jazzmine client: opening a new events consumer", "execution_id", e.ID, "after_seq", e.after, "cause", cause)
		ctx, cancel := context.WithTimeout(context.Background(), resumeTimeout)
		cons, iter, err := e.c.openEvents(ctx, e.ID, e.after)
		cancel()
		if err == nil {
			e.mu.Lock()
			select {
			case <-e.closing: // Close came first: it stopped the old iterator only
				e.mu.Unlock()
				iter.Stop()
				e.c.deleteConsumer(cons)
				return e.closedError()
			default:
			}
			old := e.iter
			e.cons, e.iter = cons, iter
			e.mu.Unlock()
			old.Stop()
			return nil
		}
		if code, _ := apiErrorCode(err); code == codeStreamNotFound {
			return fmt.Errorf("read the events of execution %q: %w", e.ID, err)
		}
		cause = err
		select {
		case <-e.closing:
			return e.closedError()
		case <-time.After(delay):
		}
		delay = min(2*delay, resumeMaxDelay)
	}
}
