package client_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// TestSandboxesReadsTheCatalog: the sandboxes come sorted by name as the workers put
// them; an entry that is not a SandboxInfo is left out; no bucket is ErrNoStream, an
// empty one no sandbox.
func TestSandboxesReadsTheCatalog(t *testing.T) {
	e := newEnv(t, client.Config{})
	if _, err := e.client.Sandboxes(ctx(t)); !errors.Is(err, client.ErrNoStream) {
		t.Fatalf("Sandboxes without the bucket: %v, want ErrNoStream", err)
	}
	kv, err := e.js.CreateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: wire.SandboxesBucket})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.client.Sandboxes(ctx(t)); err != nil || len(got) != 0 {
		t.Fatalf("Sandboxes of an empty catalog: %v, %v", got, err)
	}
	for key, value := range map[string]string{
		"zeta":   `{"sandbox":"zeta","tools":[],"timeout_sec":30,"worker_id":"w1","updated":"2026-01-01T00:00:00Z"}`,
		"alpha":  `{"sandbox":"alpha","description":"d","tools":[{"name":"add","signature":"(a: int) -> int","doc":"Adds.","async":true}],"timeout_sec":10,"worker_id":"w2","updated":"2026-01-01T00:00:00Z"}`,
		"broken": `not json`,
	} {
		if _, err := kv.PutString(ctx(t), key, value); err != nil {
			t.Fatal(err)
		}
	}
	got, err := e.client.Sandboxes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Sandbox != "alpha" || got[1].Sandbox != "zeta" {
		t.Fatalf("Sandboxes = %+v, want alpha and zeta", got)
	}
	want := wire.ToolSpec{Name: "add", Signature: "(a: int) -> int", Doc: "Adds.", Async: true}
	if a := got[0]; a.Description != "d" || a.TimeoutSec != 10 || len(a.Tools) != 1 || a.Tools[0] != want {
		t.Errorf("alpha = %+v", a)
	}
}
