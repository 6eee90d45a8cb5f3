package worker_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestTheWorkerPutsItsSandboxesInTheCatalog: once its containers are ready, an agent
// finds the worker's sandbox in the catalog with what its harness loaded (the example
// tools, their signatures and docstrings), what the config says of it and its limits.
func TestTheWorkerPutsItsSandboxesInTheCatalog(t *testing.T) {
	_, nc := testenv.NATS(t)
	w, _ := testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	var got []client.SandboxInfo
	testenv.WaitFor(t, time.Minute, "the sandbox in the catalog", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got, err = c.Sandboxes(ctx)
		return err == nil && len(got) == 1
	})
	sb := got[0]
	if sb.Sandbox != "default" || sb.WorkerID != w.ID() || sb.Python == "" || sb.Updated.IsZero() {
		t.Errorf("entry = %+v", sb)
	}
	if sb.Description != testenv.ExampleConfig(t).Sandboxes["default"].Description || sb.Description == "" {
		t.Errorf("description %q, want the example config's", sb.Description)
	}
	if sb.TimeoutSec != worker.DefaultExecutionTimeout.Seconds() || sb.MemoryMB != 512 || sb.CPUs != 1 || len(sb.AllowedHosts) != 0 {
		t.Errorf("timeout %v, memory %d MiB, %v CPUs, hosts %v: want the defaults and no network", sb.TimeoutSec, sb.MemoryMB, sb.CPUs, sb.AllowedHosts)
	}
	want := wire.ToolSpec{Name: "word_count", Signature: "(text: str) -> int", Doc: "Returns the number of words in text."}
	if !slices.Contains(sb.Tools, want) {
		t.Errorf("tools %+v lack %+v", sb.Tools, want)
	}
}
