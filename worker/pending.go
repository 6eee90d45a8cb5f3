package worker

import (
	"context"
	"fmt"
	"sync"
)

// gates hold back the pull loops of the sandboxes that are not served yet (see
// Sandbox.Pending): a sandbox's gate opens once, when Serve names it.
type gates struct {
	mu   sync.Mutex // guards open
	open map[string]chan struct{}
}

func newGates(sandboxes []Sandbox) *gates {
	g := &gates{open: map[string]chan struct{}{}}
	for _, sb := range sandboxes {
		ch := make(chan struct{})
		if !sb.Pending {
			close(ch)
		}
		g.open[sb.Name] = ch
	}
	return g
}

// wait waits until the sandbox serves; false when ctx ended first.
func (g *gates) wait(ctx context.Context, sandbox string) bool {
	g.mu.Lock()
	ch := g.open[sandbox]
	g.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// serving reports whether the sandbox's gate is open.
func (g *gates) serving(sandbox string) bool {
	g.mu.Lock()
	ch := g.open[sandbox]
	g.mu.Unlock()
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// serve opens the sandbox's gate; it is an error for a sandbox the worker does not
// know.
func (g *gates) serve(sandbox string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch, ok := g.open[sandbox]
	if !ok {
		return fmt.Errorf("worker: no sandbox %q in the worker's config", sandbox)
	}
	select {
	case <-ch:
	default:
		close(ch)
	}
	return nil
}

// Serve starts taking the jobs and session calls of a pending sandbox (see
// Sandbox.Pending), which the pool now has. Serving a sandbox that serves already
// does nothing.
func (w *Worker) Serve(sandbox string) error {
	if err := w.gates.serve(sandbox); err != nil {
		return err
	}
	w.catalog.recover(sandbox)
	w.log.Info("sandbox serving", "sandbox", sandbox)
	return nil
}

// Unavailable reports a pending sandbox that this worker cannot serve (yet): its
// image could not be built, or the pool could not take it. Its jobs and sessions
// stay in their streams for a worker that serves it, and the catalog says why (the
// first line of reason), unless another worker serves it (see catalog.putUnserved),
// until Serve names it.
func (w *Worker) Unavailable(sandbox string, reason error) {
	w.catalog.fail(sandbox, reason.Error())
}
