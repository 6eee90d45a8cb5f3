package worker

import (
	"context"
	"errors"
	"sync"
)

// execution is a job running on this worker.
type execution struct {
	cancel  context.CancelCauseFunc
	claimed bool // a cancel request reached it here; guarded by registry.mu
}

// errCancelRequested and errShuttingDown are the causes of a running job's cancel.
var (
	errCancelRequested = errors.New("cancel requested")
	errShuttingDown    = errors.New("worker shutting down")
)

// registry is the executions running on this worker, by key (<tenant>.<id>): the
// processor registers each job it runs, the cancel protocol finds them there, and
// the worker's shutdown cancels them all.
type registry struct {
	mu      sync.Mutex // guards running and each execution's claimed
	running map[string]*execution
}

func newRegistry() *registry {
	return &registry{running: map[string]*execution{}}
}

// register records ex under key. It returns false, recording nothing, when an
// execution runs under key already.
func (r *registry) register(key string, ex *execution) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.running[key]; ok {
		return false
	}
	r.running[key] = ex
	return true
}

// unregister removes ex, if it is still the execution under key.
func (r *registry) unregister(key string, ex *execution) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[key] == ex {
		delete(r.running, key)
	}
}

// claim marks the execution under key as reached by a cancel request and returns
// it, or nil when none runs here.
func (r *registry) claim(key string) *execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	ex := r.running[key]
	if ex != nil {
		ex.claimed = true
	}
	return ex
}

// claimed reports whether a cancel request reached ex here.
func (r *registry) claimed(ex *execution) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ex.claimed
}

// cancelAll cancels every running execution with cause.
func (r *registry) cancelAll(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ex := range r.running {
		ex.cancel(cause)
	}
}
