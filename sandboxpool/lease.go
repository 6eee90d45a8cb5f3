package sandboxpool

import (
	"context"
	"sync"

	"github.com/jazzmine/worker/harness"
)

// Lease is one checked-out container. Release gives it back; it is safe to call more
// than once, so `defer lease.Release()` is always right. A Lease is used by one
// goroutine at a time.
type Lease struct {
	p      *Pool
	c      *ctr
	once   sync.Once
	retire string
	ran    bool // Run sent an execute: the harness ends it with a reset_done
}

// ContainerID is the container's short id.
func (l *Lease) ContainerID() string { return l.c.shortID() }

// Retire marks the container to be removed, not reused, on Release; reason is counted
// in Stats.
func (l *Lease) Retire(reason string) {
	if l.retire == "" {
		l.retire = reason
	}
}

// Run executes req in the container with the pool's Executor. It retires the
// container on Release when the harness did not end the execution cleanly (a host-side
// limit, a closed stream) or the script ran out of memory, and reports a container
// that Docker killed for memory as an oom error rather than a crash.
func (l *Lease) Run(ctx context.Context, req harness.Request, on harness.EventFunc) (*harness.Result, error) {
	oom := false // Docker killed the container for memory; asked once, on a closed stream
	wrapped := func(ctx context.Context, ev harness.Event) error {
		if ev.Type == harness.EventError && ev.Kind == harness.KindCrashed && ev.Error == harness.ErrStdoutClosed && l.p.oomKilled(l.c) {
			oom = true
			ev.Kind = harness.KindOOM
			ev.Error = "Container was killed: out of memory"
		}
		if on == nil {
			return nil
		}
		return on(ctx, ev)
	}
	l.ran = true
	res, err := l.p.exe.Run(ctx, l.c.conn, req, wrapped)
	if res == nil {
		return res, err
	}
	if oom {
		res.ErrorKind = harness.KindOOM
		res.Error = "Container was killed: out of memory"
	}
	switch {
	case res.Violation != "":
		l.Retire(RetireViolation)
	case res.ErrorKind == harness.KindOOM:
		l.Retire(RetireOOM)
	case !res.Reusable && res.ErrorKind == harness.KindCrashed:
		l.Retire(RetireCrashed)
	case !res.Reusable:
		l.Retire(RetireLimit)
	}
	return res, err
}

// AwaitReady waits, after Run, for the harness to say it is ready for the next
// request (its reset_done, which after a session's execution resets nothing): a
// session keeps its lease from one call to the next and runs them one at a time.
func (l *Lease) AwaitReady(ctx context.Context) error {
	if !l.ran {
		return nil
	}
	l.ran = false
	return l.c.conn.AwaitReset(ctx)
}

// Release gives the container back: reset and reused, or removed if it was marked
// with Retire, has reached MaxUses, or the pool is closing. It does not block on the
// reset. Calls after the first do nothing.
func (l *Lease) Release() {
	l.once.Do(func() { l.p.release(l.c, l.retire, l.ran) })
}
