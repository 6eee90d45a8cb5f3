package worker

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func newTestBackground(t *testing.T) *background {
	b := newBackground(slog.New(slog.NewTextHandler(io.Discard, nil)))
	b.begin()
	t.Cleanup(b.close)
	return b
}

// waitUntil polls cond until it holds, or fails the test after a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

func TestBackgroundWorkRunsAtMostItsLimitAtOnceAndDropsNothingWithinItsQueue(t *testing.T) {
	b := newTestBackground(t)
	const tasks = 3 * backgroundLimit
	var running, most, ran atomic.Int64
	release := make(chan struct{})
	for range tasks { // one subscription's handler, one message after the other
		b.run("", &nats.Msg{Subject: "jazzmine.cancel.x"}, func(context.Context) {
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			running.Add(-1)
			ran.Add(1)
		})
	}
	waitUntil(t, "every slot to be busy", func() bool { return running.Load() == backgroundLimit })
	close(release)
	waitUntil(t, "every task to run", func() bool { return ran.Load() == tasks })
	if got := most.Load(); got > backgroundLimit {
		t.Errorf("%d tasks ran at once, want at most %d", got, backgroundLimit)
	}
}

// TestAFloodingTenantLosesItsOwnExcessAndHoldsUpNoOther: tenant a fills every slot
// and its queue, and sends more; tenant b's one task runs after at most one more of
// a's, and a's excess beyond its queue is dropped.
func TestAFloodingTenantLosesItsOwnExcessAndHoldsUpNoOther(t *testing.T) {
	b := newTestBackground(t)
	tokens := make(chan struct{})
	var aStarted, aRan atomic.Int64
	var bRanAfter atomic.Int64
	bRanAfter.Store(-1)
	msg := &nats.Msg{Subject: "jazzmine.cancel.a.x"}
	const sent = backgroundLimit + backgroundQueue + 50
	for range sent {
		b.run("a", msg, func(context.Context) { aStarted.Add(1); <-tokens; aRan.Add(1) })
	}
	b.run("b", &nats.Msg{Subject: "jazzmine.cancel.b.y"}, func(context.Context) { bRanAfter.Store(aRan.Load()) })
	for range 2 {
		tokens <- struct{}{}
	}
	waitUntil(t, "b's task to run", func() bool { return bRanAfter.Load() >= 0 })
	if n := bRanAfter.Load(); n > 2 {
		t.Errorf("b's task ran after %d of a's, want at most 2", n)
	}
	close(tokens) // every task of a's may end now
	// Its queue's worth at least runs (a task a slot took but has not started yet is
	// neither queued nor started: the drain below alone could miss it).
	waitUntil(t, "a's queued tasks to run", func() bool { return aRan.Load() >= backgroundQueue })
	waitUntil(t, "a's queue to drain", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queues["a"]) == 0 && aRan.Load() == aStarted.Load()
	})
	// What ran: the queue's worth, and what the slots took while a sent.
	if n := aRan.Load(); n < backgroundQueue || n > backgroundLimit+backgroundQueue {
		t.Errorf("%d of a's %d tasks ran, want its queue's %d and at most its slots' %d more", n, sent, backgroundQueue, backgroundLimit)
	}
}

func TestBackgroundWorkNotStartedAtShutdownIsDropped(t *testing.T) {
	b := newTestBackground(t)
	hold := make(chan struct{})
	var started atomic.Int64
	for range backgroundLimit {
		b.run("", &nats.Msg{Subject: "jazzmine.cancel.x"}, func(context.Context) { started.Add(1); <-hold })
	}
	waitUntil(t, "every slot to be busy", func() bool { return started.Load() == backgroundLimit })
	var lateRan atomic.Bool
	b.run("", &nats.Msg{Subject: "jazzmine.cancel.y"}, func(context.Context) { lateRan.Store(true) })
	closed := make(chan struct{})
	go func() { b.close(); close(closed) }()
	waitUntil(t, "shutdown to begin", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.closed })
	close(hold)
	<-closed
	b.run("", &nats.Msg{Subject: "jazzmine.cancel.z"}, func(context.Context) { lateRan.Store(true) })
	if lateRan.Load() {
		t.Error("a task queued behind the busy slots ran after shutdown began")
	}
}
