package sandboxpool_test

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// docker is the local engine (see testenv.Docker).
func docker(t testing.TB) *client.Client { return testenv.Docker(t) }

// containersOf lists the containers, running or not, labelled with the worker id.
func containersOf(t testing.TB, workerID string) []string {
	t.Helper()
	res, err := docker(t).ContainerList(context.Background(), client.ContainerListOptions{
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

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
