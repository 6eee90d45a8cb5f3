package worker

import (
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/wire"
)

// A tenant that floods the fleet with replay requests for made-up executions must
// not slow down the handler that serves every tenant's: the replayer notes only what
// the background queued (a tenant's queue holds backgroundQueue), so what it keeps,
// and what a request costs, stays bounded however many arrive. Before, each request
// was noted before the queue dropped it and the notes were scanned at every request
// once they were more than backgroundQueue: 80,000 requests took the handler seconds.
func TestAReplayFloodIsNotedOnlyAsFarAsItIsQueued(t *testing.T) {
	bg := newBackground(slog.New(slog.NewTextHandler(io.Discard, nil))) // not started: what is queued stays queued
	t.Cleanup(bg.close)
	r := newReplayer(nil, nil, bg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ask := func(tenant, id string) {
		r.see(&nats.Msg{Subject: wire.SubjectPrefixReplay + "." + tenant + "." + id})
	}
	queued := func(tenant string) int {
		bg.mu.Lock()
		defer bg.mu.Unlock()
		return len(bg.queues[tenant])
	}

	// Far more than the queue holds, and few enough to be asked within replayEvery
	// even under the race detector on a busy machine (80,000 took 2 s in a CI run,
	// and the first notes had expired).
	for i := range 5_000 {
		ask("alice", fmt.Sprintf("made-up-%d", i))
	}
	if got := queued("alice"); got != backgroundQueue {
		t.Fatalf("alice's flood queued %d replays, want her queue's %d", got, backgroundQueue)
	}
	if len(r.recent) != backgroundQueue || len(r.order) != backgroundQueue {
		t.Fatalf("the replayer noted %d executions (%d in order) for alice's flood; want only the %d queued", len(r.recent), len(r.order), backgroundQueue)
	}

	ask("bob", "his-job")
	ask("bob", "his-job")
	if got := queued("bob"); got != 1 {
		t.Fatalf("bob's request twice within %v during alice's flood: %d replays queued, want 1", replayEvery, got)
	}

	// A second later the notes have expired, oldest first, and bob may ask again.
	r.mu.Lock()
	for i := range r.order {
		r.order[i].at = r.order[i].at.Add(-replayEvery)
	}
	r.mu.Unlock()
	ask("bob", "his-job")
	if got := queued("bob"); got != 2 {
		t.Fatalf("bob's request after %v: %d replays queued, want 2", replayEvery, got)
	}
	if len(r.recent) != 1 || len(r.order) != 1 {
		t.Fatalf("after expiry the replayer holds %d notes (%d in order), want bob's new one", len(r.recent), len(r.order))
	}
}
