package worker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// TestATenantsCatalogAnswerFitsAMessage: the answer to a tenant lists the watched
// entries by name, leaves out one put longer ago than the bucket's TTL (no update
// says an entry expired) and one that serves the fleet's own account only, and past maxCatalogAnswer leaves out the docstrings, not
// the sandboxes, without touching the view.
func TestATenantsCatalogAnswerFitsAMessage(t *testing.T) {
	doc := strings.Repeat("d", 1<<20)
	c := &catalog{view: map[string]catalogEntry{}}
	for i, name := range []string{"zeta", "alpha", "mid", "beta", "gone"} {
		put := time.Now()
		if name == "gone" {
			put = put.Add(-SandboxesTTL - time.Minute)
		}
		c.view[name] = catalogEntry{put: put, info: wire.SandboxInfo{Sandbox: name, Tools: []wire.ToolSpec{{Name: "f", Doc: doc[:i*(250<<10)]}}}}
	}
	c.view["fleetonly"] = catalogEntry{put: time.Now(), info: wire.SandboxInfo{Sandbox: "fleetonly", FleetOnly: true, Tools: []wire.ToolSpec{{Name: "f"}}}}
	data, err := c.list(false)
	if err != nil {
		t.Fatal(err)
	}
	var got []wire.SandboxInfo
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, info := range got {
		names = append(names, info.Sandbox)
		if info.Tools[0].Doc != "" {
			t.Errorf("sandbox %s kept a docstring of %d bytes in an answer past %d bytes", info.Sandbox, len(info.Tools[0].Doc), maxCatalogAnswer)
		}
	}
	if strings.Join(names, " ") != "alpha beta mid zeta" || len(data) > maxCatalogAnswer {
		t.Errorf("the answer lists %v in %d bytes; want alpha beta mid zeta, without the expired one nor the fleet's own, within %d", names, len(data), maxCatalogAnswer)
	}
	if c.view["beta"].info.Tools[0].Doc == "" {
		t.Error("making the answer cut the docstrings of the view")
	}
}

// TestTheCatalogSaysASandboxIsBuildingOrFailedUntilItServes puts the entries of a
// worker whose sandbox is pending, then fails, then serves with no container yet,
// in a real bucket: the entry says building, then the failure's first line, then
// goes (the next ready container puts the sandbox's); an entry that a serving
// worker put lately is never replaced by one that says building.
func TestTheCatalogSaysASandboxIsBuildingOrFailedUntilItServes(t *testing.T) {
	_, nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: wire.SandboxesBucket, TTL: SandboxesTTL})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := sandboxpool.New(sandboxpool.Config{WorkerID: "me", Docker: testenv.Docker(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Close(context.Background()) })
	sandboxes := []Sandbox{{Name: "later", Slots: 1, Pending: true}, {Name: "taken", Slots: 1, Pending: true}}
	g := newGates(sandboxes)
	c := &catalog{kv: kv, pool: pool, gates: g, sandboxes: sandboxes, workerID: "me", timeout: 30 * time.Second,
		log: slog.New(slog.DiscardHandler), toolErrors: map[string]string{}}
	served, _ := json.Marshal(wire.SandboxInfo{Sandbox: "taken", WorkerID: "other", Tools: []wire.ToolSpec{{Name: "f"}}})
	if _, err := kv.Put(t.Context(), "taken", served); err != nil {
		t.Fatal(err)
	}
	get := func(name string) (wire.SandboxInfo, bool) {
		entry, err := kv.Get(t.Context(), name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return wire.SandboxInfo{}, false
		}
		if err != nil {
			t.Fatal(err)
		}
		var info wire.SandboxInfo
		if err := json.Unmarshal(entry.Value(), &info); err != nil {
			t.Fatal(err)
		}
		return info, true
	}
	putAll := func() {
		if err := c.putAll(t.Context()); err != nil {
			t.Fatal(err)
		}
	}

	putAll()
	if info, ok := get("later"); !ok || !info.Building || info.Error != "" || info.WorkerID != "me" {
		t.Errorf("a pending sandbox's entry = %+v (%v), want it building, by this worker", info, ok)
	}
	if info, _ := get("taken"); info.WorkerID != "other" || info.Building {
		t.Errorf("the entry a serving worker put lately was replaced: %+v", info)
	}

	g.fail("later", "base image \"x\" not found\nlast 3 lines of the build log: ...")
	putAll()
	if info, _ := get("later"); info.Building || info.Error != `base image "x" not found` {
		t.Errorf("a failed sandbox's entry = %+v, want the failure's first line, not building", info)
	}

	if err := g.serve("later"); err != nil {
		t.Fatal(err)
	}
	g.recover("later")
	putAll()
	if info, ok := get("later"); ok {
		t.Errorf("a served sandbox with no container yet kept the entry that said it failed: %+v", info)
	}
}
