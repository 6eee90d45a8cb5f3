package sandboxpool_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/sandboxpool"
)

var (
	dockerOnce sync.Once
	dockerCli  *client.Client
	dockerErr  error
)

// docker returns a client for the local engine. Without one the test is skipped, or
// fails when JAZZMINE_REQUIRE_DOCKER=1 (as in CI).
func docker(t testing.TB) *client.Client {
	t.Helper()
	dockerOnce.Do(func() {
		dockerCli, dockerErr = client.New(client.FromEnv, client.WithAPIVersionNegotiation())
		if dockerErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, dockerErr = dockerCli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
		}
	})
	if dockerErr != nil {
		if os.Getenv("JAZZMINE_REQUIRE_DOCKER") == "1" {
			t.Fatalf("Docker is required (JAZZMINE_REQUIRE_DOCKER=1) but unreachable: %v", dockerErr)
		}
		t.Skipf("no Docker engine: %v", dockerErr)
	}
	return dockerCli
}

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
