package worker

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
)

func newBackgroundWorker() *Worker {
	return &Worker{bg: newBackground(slog.New(slog.NewTextHandler(io.Discard, nil)))}
}

func TestBackgroundWorkRunsAtMostItsLimitAtOnceAndDropsNothing(t *testing.T) {
	w := newBackgroundWorker()
	const tasks = 3 * backgroundLimit
	var running, most, ran atomic.Int64
	release := make(chan struct{})
	handlerDone := make(chan struct{})
	go func() { // one subscription's handler, one message after the other
		defer close(handlerDone)
		for range tasks {
			w.goBackground(&nats.Msg{Subject: "jazzmine.cancel.x"}, func(context.Context) {
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				<-release
				running.Add(-1)
				ran.Add(1)
			})
		}
	}()
	// Nothing ends until the handler waits for a slot, or has started every task.
	for held := false; !held; runtime.Gosched() {
		w.bg.mu.Lock()
		full := w.bg.full
		w.bg.mu.Unlock()
		select {
		case <-handlerDone:
			held = running.Load() == tasks
		default:
			held = full && running.Load() == backgroundLimit
		}
	}
	close(release)
	<-handlerDone
	w.bg.close()
	if got := ran.Load(); got != tasks {
		t.Errorf("%d of %d tasks ran", got, tasks)
	}
	if got := most.Load(); got > backgroundLimit {
		t.Errorf("%d tasks ran at once, want at most %d", got, backgroundLimit)
	}
}

func TestAHandlerWaitingForBackgroundWorkIsReleasedAtShutdown(t *testing.T) {
	w := newBackgroundWorker()
	hold := make(chan struct{})
	var started sync.WaitGroup
	for range backgroundLimit {
		started.Add(1)
		w.goBackground(&nats.Msg{Subject: "jazzmine.cancel.x"}, func(context.Context) { started.Done(); <-hold })
	}
	started.Wait()
	var extraRan atomic.Bool
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		w.goBackground(&nats.Msg{Subject: "jazzmine.cancel.y"}, func(context.Context) { extraRan.Store(true) })
	}()
	for full := false; !full; { // the handler waits for a slot
		w.bg.mu.Lock()
		full = w.bg.full
		w.bg.mu.Unlock()
		runtime.Gosched()
	}
	w.bg.mu.Lock()
	w.bg.closed = true
	close(w.bg.stop)
	w.bg.mu.Unlock()
	<-waiting // returns although every slot is still held
	close(hold)
	w.bg.wg.Wait()
	if extraRan.Load() {
		t.Error("a task started after shutdown")
	}
}
