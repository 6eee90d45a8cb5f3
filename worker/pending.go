package worker

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// gates hold back the pull loops of the sandboxes that are not served yet (see
// Sandbox.Pending): a sandbox's gate opens once, when Serve names it. They also hold
// why this worker cannot serve a sandbox (Unavailable), which the catalog puts. They
// exist from New on: Serve and Unavailable may come before Start.
type gates struct {
	mu     sync.Mutex // guards open and failed
	open   map[string]chan struct{}
	failed map[string]string // why, by sandbox, for the sandboxes this worker cannot serve
	// changed is buffered: a failure or a recovery has the catalog put its entries.
	changed chan struct{}
}

func newGates(sandboxes []Sandbox) *gates {
	g := &gates{open: map[string]chan struct{}{}, failed: map[string]string{}, changed: make(chan struct{}, 1)}
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

// fail records why this worker cannot serve the sandbox: the first line of why only
// (a build's log stays in the worker's log), which tenants read in the catalog.
func (g *gates) fail(sandbox, why string) {
	why, _, _ = strings.Cut(why, "\n")
	g.mu.Lock()
	g.failed[sandbox] = why
	g.mu.Unlock()
	g.nudge()
}

// recover forgets that the sandbox failed: it serves now.
func (g *gates) recover(sandbox string) {
	g.mu.Lock()
	delete(g.failed, sandbox)
	g.mu.Unlock()
	g.nudge()
}

// failure says why this worker cannot serve the sandbox, if it cannot.
func (g *gates) failure(sandbox string) (why string, failed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	why, failed = g.failed[sandbox]
	return why, failed
}

// nudge has the catalog put its entries at once.
func (g *gates) nudge() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
}
