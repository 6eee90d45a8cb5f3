// Package fakeengine is a Docker engine in memory whose containers run a fake
// harness answering in microseconds: the pool's logic tests and the fleet's scale
// simulation run the real pool and worker against it with no container. It is test
// support only, never a production path.
package fakeengine

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/sandboxpool"
)

// Engine is a Docker Engine in memory for the pool's logic tests. Its containers run
// a fake harness: a goroutine that speaks the protocol of DESIGN.md section 5 over
// the attached stream, framed as Docker frames it (stream 1 the protocol, stream 2
// stderr), so the pool runs its own spawn, attach before start, ready handshake,
// resets, health checks and removals against it. Only the harness's rules are fake:
// what it does with an execute is chosen by the script (see fakeHarness.execute).
type Engine struct {
	// start, if set, says what the nth start (from 1) does; nil starts every
	// container at once, and its harness says ready.
	Start func(n int) StartPlan
	// CreateDelay is how long each create takes.
	CreateDelay time.Duration

	mu         sync.Mutex // guards the fields below and every fakeCtr's oom
	ctrs       map[string]*fakeCtr
	creates    int
	users      []string      // the User of each create, in order
	starts     []time.Time   // when each start began
	removed    []string      // ids, in the order they were removed
	removeGate chan struct{} // when set, removals wait for it to close (or their ctx)
}

var _ sandboxpool.Docker = (*Engine)(nil)

// StartPlan is what one ContainerStart does.
type StartPlan struct {
	Delay  time.Duration // the start takes this long, or until its ctx ends
	Err    error         // then it fails with this
	Silent bool          // the harness never says ready
	Stderr string        // the harness writes this to stderr and exits before ready
}

// fakeCtr is one container: the two ends of its attached stream.
type fakeCtr struct {
	id      string
	labels  map[string]string
	created time.Time
	host    net.Conn // the pool's end
	inside  net.Conn // the harness's end
	oom     bool     // Docker killed it for memory
	stopped sync.Once
}

// stop ends the container's process: its stream ends.
func (c *fakeCtr) stop() { c.stopped.Do(func() { c.inside.Close() }) }

func notFound(id string) error {
	return fmt.Errorf("no such container %s: %w", id, errdefs.ErrNotFound)
}

// ContainerCreate creates a container, after CreateDelay. Like the Engine, it
// finishes a create whose caller gave up: the call returns at once with the
// caller's ctx error, and the container appears when the delay is over.
func (e *Engine) ContainerCreate(ctx context.Context, o client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	done := make(chan string, 1)
	go func() {
		time.Sleep(e.CreateDelay)
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.ctrs == nil {
			e.ctrs = map[string]*fakeCtr{}
		}
		e.creates++
		e.users = append(e.users, o.Config.User)
		id := fmt.Sprintf("c%011d%052d", e.creates, 0)
		host, inside := net.Pipe()
		e.ctrs[id] = &fakeCtr{id: id, labels: o.Config.Labels, created: time.Now(), host: host, inside: inside}
		done <- id
	}()
	select {
	case id := <-done:
		return client.ContainerCreateResult{ID: id}, nil
	case <-ctx.Done():
		return client.ContainerCreateResult{}, ctx.Err()
	}
}

func (e *Engine) ctr(id string) *fakeCtr {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ctrs[id]
}

func (e *Engine) ContainerAttach(_ context.Context, id string, _ client.ContainerAttachOptions) (client.ContainerAttachResult, error) {
	c := e.ctr(id)
	if c == nil {
		return client.ContainerAttachResult{}, notFound(id)
	}
	return client.ContainerAttachResult{HijackedResponse: client.HijackedResponse{Conn: c.host, Reader: bufio.NewReader(c.host)}}, nil
}

func (e *Engine) ContainerStart(ctx context.Context, id string, _ client.ContainerStartOptions) (client.ContainerStartResult, error) {
	e.mu.Lock()
	c := e.ctrs[id]
	e.starts = append(e.starts, time.Now())
	n := len(e.starts)
	e.mu.Unlock()
	if c == nil {
		return client.ContainerStartResult{}, notFound(id)
	}
	var plan StartPlan
	if e.Start != nil {
		plan = e.Start(n)
	}
	if plan.Delay > 0 {
		select {
		case <-time.After(plan.Delay):
		case <-ctx.Done():
			return client.ContainerStartResult{}, ctx.Err()
		}
	}
	if plan.Err != nil {
		return client.ContainerStartResult{}, plan.Err
	}
	go (&fakeHarness{e: e, c: c}).serve(plan)
	return client.ContainerStartResult{}, nil
}

func (e *Engine) ContainerInspect(_ context.Context, id string, _ client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.ctrs[id]
	if c == nil {
		return client.ContainerInspectResult{}, notFound(id)
	}
	return client.ContainerInspectResult{Container: container.InspectResponse{ID: id, State: &container.State{OOMKilled: c.oom}}}, nil
}

func (e *Engine) ContainerRemove(ctx context.Context, id string, _ client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	e.mu.Lock()
	gate := e.removeGate
	e.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return client.ContainerRemoveResult{}, ctx.Err()
		}
	}
	e.mu.Lock()
	c := e.ctrs[id]
	delete(e.ctrs, id)
	if c != nil {
		e.removed = append(e.removed, id)
	}
	e.mu.Unlock()
	if c == nil {
		return client.ContainerRemoveResult{}, notFound(id)
	}
	c.stop()
	return client.ContainerRemoveResult{}, nil
}

// ContainerList lists every container; of its filters it knows only "label", as
// key=value or key.
func (e *Engine) ContainerList(_ context.Context, o client.ContainerListOptions) (client.ContainerListResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var res client.ContainerListResult
	for _, c := range e.ctrs {
		match := true
		for label := range o.Filters["label"] {
			k, v, hasValue := strings.Cut(label, "=")
			got, ok := c.labels[k]
			match = match && ok && (!hasValue || got == v)
		}
		if match {
			res.Items = append(res.Items, container.Summary{ID: c.id, Labels: c.labels, Created: c.created.Unix()})
		}
	}
	return res, nil
}

// HoldRemovals makes every removal wait (an Engine that does not answer) until the
// returned channel is closed.
func (e *Engine) HoldRemovals() chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.removeGate = make(chan struct{})
	return e.removeGate
}

// Kill ends a container's process, as `docker kill` does: its stream ends, and the
// container stays until it is removed.
func (e *Engine) Kill(shortID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, c := range e.ctrs {
		if strings.HasPrefix(id, shortID) {
			c.stop()
		}
	}
}

// Live lists the short ids of the containers not removed.
func (e *Engine) Live() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for id := range e.ctrs {
		ids = append(ids, id[:12])
	}
	slices.Sort(ids)
	return ids
}

// WasRemoved reports whether the container of the short id was removed.
func (e *Engine) WasRemoved(shortID string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.ContainsFunc(e.removed, func(id string) bool { return strings.HasPrefix(id, shortID) })
}

// CreateCount is how many containers were created.
func (e *Engine) CreateCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.creates
}

// StartTimes are when each start began.
func (e *Engine) StartTimes() []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.starts)
}

// fakeHarness answers the protocol for one container: ready, then a pong for each
// ping and a reset_done for each reset, each with its request's nonce, and for an
// execute what its script says (see execute). A session's call is answered as any
// execute: the real harness, too, ends it with a reset_done (which resets nothing).
type fakeHarness struct {
	e    *Engine
	c    *fakeCtr
	mute bool // answers nothing any more
}

func (h *fakeHarness) serve(plan StartPlan) {
	if plan.Stderr != "" {
		h.frame(2, []byte(plan.Stderr))
		h.c.stop()
		return
	}
	if !plan.Silent {
		h.say(map[string]any{"type": "ready", "version": "1", "python": "fake", "pid": 1, "tools": []string{}})
	}
	sc := bufio.NewScanner(h.c.inside)
	for sc.Scan() {
		var req struct {
			Type        string `json:"type"`
			Nonce       string `json:"nonce"`
			ExecutionID string `json:"execution_id"`
			Script      string `json:"script"`
		}
		if json.Unmarshal(sc.Bytes(), &req) != nil || h.mute {
			continue
		}
		switch req.Type {
		case "ping":
			h.say(map[string]any{"type": "pong", "nonce": req.Nonce})
		case "reset":
			h.say(map[string]any{"type": "reset_done", "nonce": req.Nonce})
		case "execute":
			h.execute(req.ExecutionID, req.Nonce, req.Script)
		}
	}
}

// execute answers an execute as its script says:
//
//	"exit"       the stream ends: the harness died
//	"oom"        the stream ends, and Docker says it killed the container for memory
//	"forge"      a script_done without the execute's nonce: a protocol violation
//	"hang"       nothing
//	"noreset"    a result and a script_done, but no reset_done after them
//	"slowreset"  a result and a script_done, and the reset_done a second later
//	"mute"       a result, a script_done and a reset_done, then nothing ever again
//	"chatter"    a result, a script_done and a reset_done, then a line nobody asked for
//
// and any other script a result (the script's text), a script_done and a reset_done.
func (h *fakeHarness) execute(id, nonce, script string) {
	result := func() { h.say(map[string]any{"type": "final_result", "execution_id": id, "data": script}) }
	done := func() {
		h.say(map[string]any{"type": "script_done", "execution_id": id, "exit_code": 0, "nonce": nonce})
	}
	reset := func() { h.say(map[string]any{"type": "reset_done", "nonce": nonce}) }
	switch script {
	case "exit":
		h.c.stop()
	case "oom":
		h.e.mu.Lock()
		h.c.oom = true
		h.e.mu.Unlock()
		h.c.stop()
	case "forge":
		h.say(map[string]any{"type": "script_done", "execution_id": id, "exit_code": 0})
	case "hang":
	case "noreset":
		result()
		done()
	case "slowreset":
		result()
		done()
		time.Sleep(time.Second)
		reset()
	default:
		result()
		done()
		reset()
		switch script {
		case "mute":
			h.mute = true
		case "chatter":
			h.say(map[string]any{"type": "pong", "nonce": "unasked"})
		}
	}
}

// say writes one protocol line.
func (h *fakeHarness) say(v any) {
	b, _ := json.Marshal(v)
	h.frame(1, append(b, '\n'))
}

// frame writes b as one frame of the stream, with Docker's 8-byte header. A write to
// a stopped container fails, and nobody reads it.
func (h *fakeHarness) frame(stream byte, b []byte) {
	hdr := make([]byte, 8, 8+len(b))
	hdr[0] = stream
	binary.BigEndian.PutUint32(hdr[4:], uint32(len(b)))
	_, _ = h.c.inside.Write(append(hdr, b...))
}

// Users are the User of each create, in order.
func (e *Engine) Users() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.users)
}
