package nats_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// TestAReplayFloodDeniesNoOtherTenantItsReplays: alice publishes replay requests
// for distinct made-up ids as fast as she can. The worker's replay handler serves
// every tenant on one subscription: if a request cost it more as the flood grew
// (as when it noted every id and scanned the notes at each request), bob's requests,
// queued behind alice's, would be answered late or dropped by the NATS client (slow
// consumer). Each of bob's requests during the flood must be answered within 5 s.
func TestAReplayFloodDeniesNoOtherTenantItsReplays(t *testing.T) {
	_, alice, bob := twoTenantServer(t, "alice", "bob")
	cb, err := client.New(client.Config{Conn: bob})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := cb.Run(ctx, wire.Job{Sandbox: "default", Script: "emit_result('bob')"})
	if err != nil || !res.Success {
		t.Fatalf("bob's job: %+v %v", res, err)
	}
	sub, err := bob.SubscribeSync(wire.EventsWildcard(res.ExecutionID))
	if err != nil {
		t.Fatal(err)
	}
	bob.Flush()
	// ask asks for bob's replay and returns how long until its first event (0: none
	// within the wait).
	ask := func(wait time.Duration) time.Duration {
		for { // drain
			if _, err := sub.NextMsg(10 * time.Millisecond); err != nil {
				break
			}
		}
		start := time.Now()
		_ = bob.Publish(wire.ReplaySubject(res.ExecutionID), nil)
		bob.Flush()
		if _, err := sub.NextMsg(wait); err != nil {
			return 0
		}
		return time.Since(start)
	}
	time.Sleep(1100 * time.Millisecond)
	if d := ask(5 * time.Second); d == 0 {
		t.Fatal("bob's replay without a flood delivered nothing")
	} else {
		t.Logf("without a flood, bob's replay answered in %v", d)
	}

	var sent atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = alice.Publish(wire.ReplaySubject(fmt.Sprintf("f%d", i)), nil)
			sent.Add(1)
			if i%1000 == 0 {
				alice.Flush()
			}
		}
	}()
	time.Sleep(3 * time.Second)
	answered, tries := 0, 6
	for range tries {
		time.Sleep(1100 * time.Millisecond)
		d := ask(5 * time.Second)
		if d != 0 {
			answered++
		}
		t.Logf("during alice's flood (%d requests sent so far), bob's replay: %v (0 = nothing within 5 s)", sent.Load(), d)
	}
	close(stop)
	<-done
	if answered < tries {
		t.Errorf("during another tenant's flood of replay requests, %d of bob's %d replay requests got no answer within 5 s", tries-answered, tries)
	}
}
