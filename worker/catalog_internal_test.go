package worker

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

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
	data, err := c.list()
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
