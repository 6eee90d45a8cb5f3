package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/sandboxpool"
)

// ContainersOf lists the short ids of the containers, running or not, labelled with
// the worker id.
func ContainersOf(t testing.TB, workerID string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Docker(t).ContainerList(ctx, client.ContainerListOptions{
		All: true, Filters: client.Filters{}.Add("label", sandboxpool.LabelWorker+"="+workerID),
	})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	var ids []string
	for _, c := range res.Items {
		ids = append(ids, c.ID[:12])
	}
	return ids
}

// RemoveContainersOf removes the worker's containers: those of a worker killed before
// anyone reaped them, when a test failed early.
func RemoveContainersOf(t testing.TB, workerID string) {
	for _, id := range ContainersOf(t, workerID) {
		_, _ = Docker(t).ContainerRemove(context.Background(), id, client.ContainerRemoveOptions{Force: true})
	}
}

// WaitFor polls cond until it holds, and fails the test if it does not within the
// given time; what names the wait in the failure.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StoredMsg returns the last message of subject in stream, waiting up to 30 s
// for the stream to store it: an agent sees an event on its subscription as
// the worker publishes it, and the stream stores it a moment later (after its
// replicas agree, in a cluster).
func StoredMsg(t testing.TB, stream jetstream.Stream, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	var msg *jetstream.RawStreamMsg
	WaitFor(t, 30*time.Second, subject+" in the stream", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		msg, err = stream.GetLastMsgForSubject(ctx, subject)
		return err == nil
	})
	return msg
}
