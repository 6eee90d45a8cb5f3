package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/wire"
)

// TestSandboxesWithNoWorkerIsErrNoStream: the catalog comes from the workers (the
// worker's tests read it through them); where no worker runs, Sandboxes says so at
// once, with ErrNoStream, and an answer with an error is an error.
func TestSandboxesWithNoWorkerIsErrNoStream(t *testing.T) {
	e := newEnv(t, client.Config{})
	start := time.Now()
	if _, err := e.client.Sandboxes(ctx(t)); !errors.Is(err, client.ErrNoStream) {
		t.Fatalf("Sandboxes with no worker: %v, want ErrNoStream", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Sandboxes with no worker took %v; want the server's no-responders at once", took)
	}
	sub, err := e.nc.Subscribe(wire.SubjectSandboxes, func(m *nats.Msg) {
		_ = m.RespondMsg(&nats.Msg{Header: nats.Header{wire.HeaderError: {"the sandbox catalog: too large"}}})
	})
	if err := errors.Join(err, e.nc.Flush()); err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if got, err := e.client.Sandboxes(ctx(t)); err == nil || err.Error() != "the sandbox catalog: too large" {
		t.Errorf("Sandboxes answered with an error: %+v, %v", got, err)
	}
}
