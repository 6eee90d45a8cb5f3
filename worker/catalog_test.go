package worker_test

import (
	"context"
	"encoding/json"
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
	sb := catalogWhen(t, c, "the sandbox in the catalog", func(cat map[string]client.SandboxInfo) bool { return len(cat) == 1 })["default"]
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

// TestATenantAsksTheWorkersForTheCatalog: a tenant's account does not reach the
// catalog bucket; its request on jazzmine.sandboxes (jazzmine.sandboxes.<tenant> in
// the fleet's account) gets the same entries from a worker as JSON. A burst of 200
// requests is answered busy past the tenant's rate, and another tenant's request
// meanwhile is not.
func TestATenantAsksTheWorkersForTheCatalog(t *testing.T) {
	_, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	var got []wire.SandboxInfo
	testenv.WaitFor(t, time.Minute, "the sandbox in the tenant's answer", func() bool {
		m, err := nc.Request(wire.SubjectSandboxes+".t1", nil, 5*time.Second)
		if err != nil || m.Header.Get(wire.HeaderError) != "" {
			return false
		}
		if ct := m.Header.Get(wire.HeaderContentType); ct != wire.ContentTypeJSON {
			t.Fatalf("the answer's Content-Type is %q", ct)
		}
		return json.Unmarshal(m.Data, &got) == nil && len(got) == 1
	})
	if got[0].Sandbox != "default" || len(got[0].Tools) == 0 || got[0].Tools[0].Doc == "" {
		t.Errorf("the tenant's catalog: %+v; want the default sandbox, its tools and their docstrings", got)
	}
	// The worker's view follows the bucket: an entry deleted there leaves the answer.
	if err := bucket(t, nc, wire.SandboxesBucket).Delete(context.Background(), "default"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the deleted entry out of the tenant's answer", func() bool {
		m, err := nc.Request(wire.SubjectSandboxes+".t3", nil, 5*time.Second)
		return err == nil && string(m.Data) == "[]"
	})
	busy, _ := burst(t, nc, wire.SubjectSandboxes+".t1", nil, 200, func() {
		if m, err := nc.Request(wire.SubjectSandboxes+".t2", nil, 10*time.Second); err != nil || m.Header.Get(wire.HeaderError) != "" {
			t.Errorf("another tenant's request during the burst: %v, %q", err, m.Header.Get(wire.HeaderError))
		}
	})
	if busy < 100 {
		t.Errorf("%d of a burst of 200 catalog requests were answered busy; want all past the tenant's rate (4 a second)", busy)
	}
}

// TestTheFleetAsksTheWorkersForTheCatalogAsATenantDoes: the catalog has one read
// path. A client of the fleet's own account asks the workers as a tenant's does, and
// gets every entry of the bucket, sorted by name: a fleet-only sandbox too, which a
// tenant's answer leaves out; an entry that is no sandbox's description is left out of
// both.
func TestTheFleetAsksTheWorkersForTheCatalogAsATenantDoes(t *testing.T) {
	_, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	kv := bucket(t, nc, wire.SandboxesBucket)
	for key, value := range map[string]string{
		"zeta":      `{"sandbox":"zeta","tools":[],"timeout_sec":30,"worker_id":"w1","updated":"2026-01-01T00:00:00Z"}`,
		"alpha":     `{"sandbox":"alpha","description":"d","tools":[{"name":"add","signature":"(a: int) -> int","doc":"Adds.","async":true}],"timeout_sec":10,"worker_id":"w2","updated":"2026-01-01T00:00:00Z"}`,
		"fleetonly": `{"sandbox":"fleetonly","tools":[],"fleet_only":true,"worker_id":"w3","updated":"2026-01-01T00:00:00Z"}`,
		"broken":    `not json`,
	} {
		if _, err := kv.PutString(t.Context(), key, value); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	names := func(infos []client.SandboxInfo) []string {
		var out []string
		for _, info := range infos {
			out = append(out, info.Sandbox)
		}
		return out
	}
	want := []string{"alpha", "default", "fleetonly", "zeta"}
	cat := catalogWhen(t, c, "the fleet's answer", func(cat map[string]client.SandboxInfo) bool { return len(cat) == len(want) })
	if a := cat["alpha"]; a.Description != "d" || a.TimeoutSec != 10 || len(a.Tools) != 1 || a.Tools[0] != (wire.ToolSpec{Name: "add", Signature: "(a: int) -> int", Doc: "Adds.", Async: true}) {
		t.Errorf("alpha = %+v", a)
	}
	listed, err := c.Sandboxes(t.Context())
	if err != nil || !slices.Equal(names(listed), want) {
		t.Errorf("the fleet's catalog: %v, %v; want %v", names(listed), err, want)
	}
	m, err := nc.Request(wire.SubjectSandboxes+".t1", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tenant []client.SandboxInfo
	if err := json.Unmarshal(m.Data, &tenant); err != nil || !slices.Equal(names(tenant), []string{"alpha", "default", "zeta"}) {
		t.Errorf("a tenant's catalog: %v, %v; want it without the fleet-only sandbox", names(tenant), err)
	}
}

// TestAStartingWorkerAnswersNoEmptyCatalog: the fleet's account asks the workers for
// the catalog. A worker subscribes to jazzmine.sandboxes before its catalog's watch
// has brought the bucket's entries: a review's requests in that window got an empty
// list, as if the fleet served nothing (4 of 14,224 while 4 workers started). A
// starting worker answers busy, and the client asks again.
func TestAStartingWorkerAnswersNoEmptyCatalog(t *testing.T) {
	_, nc := testenv.NATS(t)
	testworker.Start(t, nc, testworker.Options{ID: newID("cat"), Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	c := newSessionClient(t, nc)
	testenv.WaitFor(t, 30*time.Second, "the catalog to list default", func() bool {
		got, err := c.Sandboxes(t.Context())
		return err == nil && len(got) > 0
	})
	stop := make(chan struct{})
	empty, total := 0, 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			m, err := nc.Request(wire.SubjectSandboxes, nil, 2*time.Second)
			if err != nil {
				continue
			}
			total++
			if string(m.Data) == "[]" {
				empty++
			}
		}
	}()
	for range 4 {
		testworker.Start(t, nc, testworker.Options{ID: newID("late"), NoPool: true, Sandbox: sandboxpool.Sandbox{PoolSize: 1}})
	}
	time.Sleep(time.Second)
	close(stop)
	<-done
	t.Logf("%d of %d answers", empty, total)
	if empty > 0 {
		t.Errorf("%d of %d answers of jazzmine.sandboxes were an empty catalog while workers started", empty, total)
	}
}
