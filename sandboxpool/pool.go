package sandboxpool

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jazzmine/worker/harness"
)

// Retirement reasons, as counted in Stats.
const (
	RetireMaxUses     = "max_uses"
	RetireMaxAge      = "max_age"
	RetireCrashed     = "crashed"
	RetireOOM         = "oom"
	RetireResetFailed = "reset_failed"
	RetireLimit       = "executor_limit"
	RetireUnhealthy   = "unhealthy"
	RetireIdle        = "idle_timeout"
	RetireExited      = "exited"
	RetireClosing     = "closing"
	// RetireViolation: the harness stream broke the protocol (harness.ErrProtocol):
	// a line nobody asked for, or an answer without its request's nonce.
	RetireViolation = "protocol_violation"
	// RetireSession: the container held a session, which ended; it is never lent
	// to anything else.
	RetireSession = "session_ended"
)

// Pool keeps warm containers of each sandbox and lends them out one execution at a
// time. Its methods are safe for concurrent use.
type Pool struct {
	cfg    Config
	log    *slog.Logger
	exe    *harness.Executor
	tracer trace.Tracer

	mu        sync.Mutex // guards the fields below and every sandbox's and ctr's mutable state
	sandboxes map[string]*sandbox
	all       map[string]*ctr // every live container by id
	uids      map[int]bool    // the uids of the containers spawned and not yet removed
	closed    bool
	// readyChanged is closed, and replaced, when a sandbox's ready changes (ready.go).
	readyChanged chan struct{}

	// deadSince is when the reaper first found each worker dead, in a run of checks
	// that all found it so (see Config.ReapGrace). Only ReapOrphans uses it.
	reapMu    sync.Mutex
	deadSince map[string]time.Time

	bg       context.Context // cancelled by Close: aborts spawns under way
	stopBg   context.CancelFunc
	wg       sync.WaitGroup // every goroutine the pool starts
	started  bool
	warmed   bool // Start has spawned the warm containers of the sandboxes it found
	stopLoop chan struct{}

	ownDocker io.Closer // the Docker client New made, closed by Close; nil if given one
}

// sandbox is one sandbox's share of the pool; its fields are guarded by Pool.mu.
type sandbox struct {
	cfg      Sandbox
	idle     []*ctr     // LIFO: the most recently used container is handed out first
	waiters  *list.List // of *waiter, FIFO
	total    int        // slots taken: containers alive or starting, whatever their state
	retiring int        // containers on their last use, whose slots went to replacements
	starting int
	inUse    int
	// coming counts the containers being reset or checked (tendLocked) that will
	// serve again, not on their last use: each will be free within milliseconds,
	// where a spawn takes a second or more and holds its memory for the idle timeout.
	coming   int
	stats    SandboxStats   // counters
	lastFail time.Time      // of a spawn, for backing off replenishment
	ready    *harness.Ready // of its newest container; nil until one was ready
}

type waiter struct {
	ch chan handoff // buffered: a handoff never blocks
}

type handoff struct {
	c   *ctr
	err error
}

// New validates cfg and returns a pool that has started nothing yet; call Start.
func New(cfg Config) (*Pool, error) {
	if cfg.WorkerID == "" {
		return nil, errors.New("sandboxpool: Config.WorkerID is empty")
	}
	var own io.Closer // the client New made, if it made one
	if cfg.Docker == nil {
		cli, err := localDocker()
		if err != nil {
			return nil, fmt.Errorf("sandboxpool: Docker client: %w", err)
		}
		cfg.Docker, own = cli, cli
	}
	if cfg.ResetTimeout == 0 {
		cfg.ResetTimeout = DefaultResetTimeout
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = DefaultHealthInterval
	}
	if cfg.ReapMinAge == 0 {
		cfg.ReapMinAge = DefaultReapMinAge
	}
	if cfg.ReapGrace == 0 {
		cfg.ReapGrace = DefaultReapGrace
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = DefaultReapInterval
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	p := &Pool{tracer: tp.Tracer("github.com/jazzmine/worker/sandboxpool"), cfg: cfg, log: cfg.Logger, exe: cfg.Executor, sandboxes: map[string]*sandbox{}, all: map[string]*ctr{}, uids: map[int]bool{}, stopLoop: make(chan struct{}), ownDocker: own, readyChanged: make(chan struct{})}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.exe == nil {
		p.exe = &harness.Executor{Logger: p.log}
	}
	for _, sb := range cfg.Sandboxes {
		if err := p.addLocked(sb); err != nil {
			return nil, err
		}
	}
	p.bg, p.stopBg = context.WithCancel(context.Background())
	return p, nil
}

// Start removes orphaned containers of dead workers, pre-warms PoolSize containers
// of every sandbox and starts background maintenance. It waits until the warm
// containers are ready or have failed, and returns the failures joined; the pool keeps
// running either way and retries failed spawns in the background. ctx bounds the wait.
func (p *Pool) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.closed || p.started {
		p.mu.Unlock()
		return ErrClosed
	}
	p.started = true
	p.mu.Unlock()
	if _, err := p.ReapOrphans(ctx); err != nil {
		p.log.Warn("reap orphaned containers", "err", err)
	}
	var w warmUp
	p.mu.Lock()
	for _, sb := range p.sandboxes {
		w.spawnLocked(p, sb)
	}
	p.warmed = true // a sandbox added from now on is warmed by Add
	p.wg.Add(1)
	go p.maintain()
	if p.cfg.ReapInterval > 0 && p.cfg.WorkerAlive != nil {
		p.wg.Add(1)
		go p.reapLoop()
	}
	p.mu.Unlock()
	return w.wait(ctx)
}

// Add adds a sandbox to the pool, one whose image was not ready when the pool was
// made: once Start has warmed the others, it spawns the sandbox's warm containers
// and waits for them as Start does; before, Start does. An error of a spawn leaves the sandbox
// in the pool, which keeps trying as it does for any sandbox.
func (p *Pool) Add(ctx context.Context, sb Sandbox) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	if err := p.addLocked(sb); err != nil {
		p.mu.Unlock()
		return err
	}
	var w warmUp
	if p.warmed {
		w.spawnLocked(p, p.sandboxes[sb.Name])
	}
	p.mu.Unlock()
	return w.wait(ctx)
}

// addLocked validates sb and adds it, with nothing spawned.
func (p *Pool) addLocked(sb Sandbox) error {
	sb.setDefaults()
	if err := sb.validate(); err != nil {
		return fmt.Errorf("sandboxpool: %w", err)
	}
	if _, dup := p.sandboxes[sb.Name]; dup {
		return fmt.Errorf("sandboxpool: sandbox %q is configured twice", sb.Name)
	}
	p.sandboxes[sb.Name] = &sandbox{cfg: sb, waiters: list.New(), stats: SandboxStats{Retired: map[string]uint64{}}}
	return nil
}

// warmUp is the spawns of a sandbox's warm containers, and their errors.
type warmUp struct {
	wg   sync.WaitGroup
	mu   sync.Mutex // guards errs
	errs []error
}

// spawnLocked spawns the warm containers of sb.
func (w *warmUp) spawnLocked(p *Pool, sb *sandbox) {
	for range sb.cfg.PoolSize {
		sb.total++
		sb.starting++
		w.wg.Add(1)
		p.spawnLocked(sb, trace.SpanContext{}, func(err error) {
			if err != nil {
				w.mu.Lock()
				w.errs = append(w.errs, err)
				w.mu.Unlock()
			}
			w.wg.Done()
		})
	}
}

// wait waits for the spawns, or for ctx to end.
func (w *warmUp) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("sandboxpool: warm up: %w", ctx.Err())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return errors.Join(w.errs...)
}

// Checkout lends a container of the named sandbox: an idle one at once if there is
// one; otherwise a new one if the sandbox is below PoolSize+MaxOverflow; otherwise
// the next one returned. ctx bounds only the wait: a container started for a caller
// who gave up goes idle for the next one. Errors: ErrUnknownSandbox, ErrClosed, the
// reason a spawn failed, or ctx's error.
func (p *Pool) Checkout(ctx context.Context, name string) (*Lease, error) {
	started := time.Now()
	p.mu.Lock()
	sb := p.sandboxes[name]
	if sb == nil {
		p.mu.Unlock()
		return nil, fmt.Errorf("%w %q", ErrUnknownSandbox, name)
	}
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	for n := len(sb.idle); n > 0; n = len(sb.idle) {
		c := sb.idle[n-1]
		sb.idle[n-1] = nil
		sb.idle = sb.idle[:n-1]
		if !c.conn.Quiet() {
			// Its stream ended, or its harness said something since its last answer.
			c.state = stateChecking // out of the idle queue already
			reason := RetireViolation
			select {
			case <-c.conn.Done():
				reason = RetireExited
			default:
			}
			p.retireLocked(c, reason)
			continue
		}
		p.lendLocked(c)
		sb.stats.Checkouts++
		p.mu.Unlock()
		return &Lease{p: p, c: c}, nil
	}
	w := &waiter{ch: make(chan handoff, 1)}
	elem := sb.waiters.PushBack(w)
	// A container starting or coming back from its reset serves one waiter each: a
	// spawn only when they are fewer than the waiters (a sequential agent's next job,
	// sent while its last one's container resets, waits for that container).
	if sb.total < sb.cfg.capacity() && sb.waiters.Len() > sb.starting+sb.coming {
		sb.total++
		sb.starting++
		p.spawnLocked(sb, trace.SpanContextFromContext(ctx), nil)
	}
	p.mu.Unlock()

	select {
	case h := <-w.ch:
		return p.took(sb, h, started)
	case <-ctx.Done():
		p.mu.Lock()
		sb.waiters.Remove(elem) // a no-op if a handoff already dequeued us
		select {
		case h := <-w.ch:
			// Handed over just as we gave up: lent, never used; pass it on.
			if h.c != nil {
				sb.inUse--
				p.offerLocked(h.c)
			}
		default:
		}
		p.mu.Unlock()
		return nil, fmt.Errorf("checkout from sandbox %q: %w", name, ctx.Err())
	}
}

func (p *Pool) took(sb *sandbox, h handoff, started time.Time) (*Lease, error) {
	if h.err != nil {
		return nil, h.err
	}
	p.mu.Lock()
	sb.stats.Checkouts++
	sb.stats.CheckoutWaits++
	sb.stats.CheckoutWaitTotal += time.Since(started)
	p.mu.Unlock()
	return &Lease{p: p, c: h.c}, nil
}

func (p *Pool) lendLocked(c *ctr) {
	c.state = stateInUse
	sb := c.sandbox
	sb.inUse++
	if c.uses+1 >= sb.cfg.MaxUses {
		p.wearOutLocked(c)
	}
}

// wearOutLocked hands the slot of c, on its last use or past its age, to a
// replacement that starts now, so that recycling never leaves the sandbox without a
// warm container; c serves until the replacement is ready.
func (p *Pool) wearOutLocked(c *ctr) {
	if c.retiring {
		return
	}
	sb := c.sandbox
	c.retiring = true
	sb.total--
	sb.retiring++
	p.refillLocked(sb)
}

// worn is why c must retire once a replacement is ready: it reached MaxUses or
// MaxAge; "" when it has not.
func (c *ctr) worn(now time.Time) string {
	switch {
	case c.uses >= c.sandbox.cfg.MaxUses:
		return RetireMaxUses
	case now.Sub(c.born) >= c.sandbox.cfg.MaxAge:
		return RetireMaxAge
	}
	return ""
}

// offerLocked hands c to the first waiter or puts it in the idle queue; a worn-out
// container whose replacement is ready is retired instead, as on release.
func (p *Pool) offerLocked(c *ctr) {
	sb := c.sandbox
	switch {
	case p.closed:
		p.retireLocked(c, RetireClosing)
		return
	case c.retiring && (len(sb.idle) > 0 || sb.starting == 0):
		// Back from its reset after its replacement became ready.
		p.retireLocked(c, cmp.Or(c.worn(time.Now()), RetireMaxUses))
		return
	}
	if front := sb.waiters.Front(); front != nil {
		sb.waiters.Remove(front)
		p.lendLocked(c)
		front.Value.(*waiter).ch <- handoff{c: c}
		return
	}
	if c.state != stateChecking {
		c.idleSince = time.Now()
	}
	c.state = stateIdle
	// The queue runs from worn-out containers (serving only until their replacement is
	// ready: lent last) to the most recently used. One back from a health check keeps
	// its place, so that the checks keep no idle overflow from its IdleTimeout.
	i := 0
	if !c.retiring {
		i = len(sb.idle)
		for i > 0 && !sb.idle[i-1].retiring && sb.idle[i-1].idleSince.After(c.idleSince) {
			i--
		}
	}
	sb.idle = slices.Insert(sb.idle, i, c)
}

// retireWornLocked retires one idle container that is past MaxUses or MaxAge, now
// that a new container has come to take its place.
func (p *Pool) retireWornLocked(sb *sandbox) {
	for _, c := range sb.idle {
		if c.retiring {
			p.retireLocked(c, cmp.Or(c.worn(time.Now()), RetireMaxUses))
			return
		}
	}
}

// ageOutLocked starts the replacement of the idle containers of sb past MaxAge, one
// at a time and only while nobody waits for the sandbox: an hour-old container can
// serve a few seconds more, and a spawn costs the machine most when it is busiest.
// Each then waits, lent last, for its replacement to be ready.
func (p *Pool) ageOutLocked(sb *sandbox, now time.Time) {
	if sb.waiters.Len() > 0 || sb.starting > 0 {
		return
	}
	for i, c := range sb.idle {
		if !c.retiring && c.worn(now) == RetireMaxAge {
			p.wearOutLocked(c)
			sb.idle = slices.Insert(slices.Delete(sb.idle, i, i+1), 0, c)
			return
		}
	}
}

// spawnLocked starts one container in the background. The caller has counted it in
// sb.total and sb.starting. done, if not nil, is called with the outcome. A spawn a
// traced caller waits for is a child span of the caller's.
func (p *Pool) spawnLocked(sb *sandbox, parent trace.SpanContext, done func(error)) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ctx := p.bg
		var span trace.Span
		if parent.IsValid() {
			ctx, span = p.tracer.Start(trace.ContextWithSpanContext(p.bg, parent), "spawn",
				trace.WithAttributes(attribute.String("jazzmine.sandbox", sb.cfg.Name)))
		}
		c, err := p.spawn(ctx, sb)
		if span != nil {
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			} else {
				span.SetAttributes(attribute.String("jazzmine.container_id", c.shortID()))
			}
			span.End()
		}
		p.mu.Lock()
		sb.starting--
		if err != nil {
			sb.total--
			sb.stats.SpawnFailures++
			sb.lastFail = time.Now()
			if front := sb.waiters.Front(); front != nil {
				sb.waiters.Remove(front)
				front.Value.(*waiter).ch <- handoff{err: err}
			}
			closing := p.closed
			p.mu.Unlock()
			if closing {
				p.log.Debug("spawn abandoned: the pool is closing", "sandbox", sb.cfg.Name, "err", err)
			} else {
				p.log.Error("spawn container", "sandbox", sb.cfg.Name, "err", err)
			}
		} else {
			sb.stats.Spawned++
			p.setReadyLocked(sb, c.ready)
			c.lastCheck = time.Now()
			p.all[c.id] = c
			p.offerLocked(c)
			p.retireWornLocked(sb)
			p.wg.Add(1)
			go p.watch(c)
			p.mu.Unlock()
		}
		if done != nil {
			done(err)
		}
	}()
}

// watch retires a container whose stream ends while the pool holds it: killed from
// outside, or its harness died.
func (p *Pool) watch(c *ctr) {
	defer p.wg.Done()
	<-c.conn.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch c.state {
	case stateGone:
	case stateInUse:
		// The lease holder's run sees the end and retires it on release.
	default:
		p.retireLocked(c, RetireExited)
	}
}

// retireLocked takes c out of the pool, removes it in the background and, unless the
// pool is closing, starts a replacement if a waiter needs one or the sandbox is below
// PoolSize.
func (p *Pool) retireLocked(c *ctr, reason string) {
	if c.state == stateGone {
		return
	}
	sb := c.sandbox
	if c.state == stateIdle {
		for i, x := range sb.idle {
			if x == c {
				sb.idle = append(sb.idle[:i], sb.idle[i+1:]...)
				break
			}
		}
	}
	if c.state == stateInUse {
		sb.inUse--
	}
	c.state = stateGone
	delete(p.all, c.id)
	if c.retiring {
		sb.retiring--
	} else {
		sb.total--
	}
	sb.stats.Retired[reason]++
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.remove(c)
	}()
	p.log.Debug("retire container", "container", c.shortID(), "sandbox", sb.cfg.Name, "reason", reason, "uses", c.uses)
	p.refillLocked(sb)
}

// refillLocked starts containers for waiting callers that no container starting or
// coming back will serve, and up to PoolSize.
func (p *Pool) refillLocked(sb *sandbox) {
	if p.closed {
		return
	}
	want := max(sb.cfg.PoolSize-sb.total, min(sb.waiters.Len()-sb.starting-sb.coming, sb.cfg.capacity()-sb.total))
	for range want {
		sb.total++
		sb.starting++
		p.spawnLocked(sb, trace.SpanContext{}, nil)
	}
}

// release returns a lent container: retired if reason is set, the container is worn
// out, or the pool is closing; otherwise offered again once the harness has reset
// (after an execute) or at once (when nothing ran).
func (p *Pool) release(c *ctr, reason string, ran bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.state == stateGone {
		return
	}
	c.uses++
	sb := c.sandbox
	worn := c.worn(time.Now())
	switch {
	case reason != "":
	case p.closed:
		reason = RetireClosing
	case worn != "" && (len(sb.idle) > 0 || sb.starting == 0):
		reason = worn
		// Otherwise it serves on, past MaxUses or MaxAge, until its replacement is
		// ready: the sandbox is never left without a container because one wore out.
	}
	if reason != "" {
		p.retireLocked(c, reason)
		return
	}
	sb.inUse--
	switch {
	case !ran:
		p.offerLocked(c)
	case p.cfg.ResetOnReturn:
		c.state = stateReturning
		p.tendLocked(c, func(ctx context.Context) error {
			// The execute's own reset_done comes first: nothing may be left unread.
			if err := c.conn.AwaitReset(ctx); err != nil {
				return err
			}
			return c.conn.Reset(ctx)
		}, RetireResetFailed, "reset failed")
	default:
		c.state = stateReturning
		p.tendLocked(c, c.conn.AwaitReset, RetireResetFailed, "reset failed")
	}
}

// Close stops the pool: waiting callers get ErrClosed, and every container is
// removed, checked-out ones included (their leases' Release becomes a no-op). It waits
// for background work, then sweeps Docker for containers of its worker id that the
// pool lost track of, until ctx ends: then it returns ctx's error while removals
// under way go on in the background. It is safe to call more than once.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stopLoop)
		for _, sb := range p.sandboxes {
			for e := sb.waiters.Front(); e != nil; e = sb.waiters.Front() {
				sb.waiters.Remove(e)
				e.Value.(*waiter).ch <- handoff{err: ErrClosed}
			}
		}
		for _, c := range p.all {
			p.retireLocked(c, RetireClosing)
		}
	}
	p.mu.Unlock()
	p.stopBg() // spawns under way give up; what they created is removed

	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("sandboxpool: close: %w", ctx.Err())
	}
	if err == nil {
		// A sweep by label catches anything this worker created that the pool lost track of.
		if n, serr := p.removeByLabel(ctx, LabelWorker+"="+p.cfg.WorkerID); serr != nil {
			err = serr
		} else if n > 0 {
			p.log.Warn("removed containers the pool had lost track of", "count", n)
		}
	}
	if p.ownDocker != nil {
		p.ownDocker.Close() // its idle connections; it stays usable for a later Close
	}
	return err
}

func isNotFound(err error) bool { return errdefs.IsNotFound(err) }

// WorkerID is the worker id the pool labels its containers with.
func (p *Pool) WorkerID() string { return p.cfg.WorkerID }
