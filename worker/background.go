package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/jazzmine/worker/wire"
)

// Background work: what a worker does for a message of one of its subscriptions
// beyond answering it at once, the coordination of a cancel and the answer to a job
// for a sandbox no worker serves.
const (
	// backgroundLimit caps the background tasks a worker runs at once.
	backgroundLimit = 32
	// backgroundQueue caps the tasks of one tenant waiting for a slot.
	backgroundQueue = 256
	// backgroundTimeout bounds one background task.
	backgroundTimeout = 10 * time.Second
)

// background runs the worker's background tasks: at most backgroundLimit at once,
// taken from the tenants' queues in turn. A subscription's handler never waits for
// it, so a tenant that floods the worker with cancels (or jobs for unknown
// sandboxes) fills its own queue and loses its own excess; another tenant's task
// waits for one task of each busy tenant at most, not for the flood.
type background struct {
	log *slog.Logger

	mu      sync.Mutex // guards the fields below
	closed  bool
	queues  map[string][]func(context.Context) // by tenant ("" for the fleet's account)
	turn    []string                           // tenants with queued tasks, next first
	full    map[string]bool                    // a tenant whose excess was logged
	dropped map[*nats.Subscription]int         // messages the client dropped, as last logged

	wake    chan struct{} // a token when a task is queued
	closing chan struct{} // closed by close
	wg      sync.WaitGroup
}

func newBackground(log *slog.Logger) *background {
	return &background{
		log: log, queues: map[string][]func(context.Context){}, full: map[string]bool{},
		dropped: map[*nats.Subscription]int{}, wake: make(chan struct{}, backgroundLimit), closing: make(chan struct{}),
	}
}

// start starts the slots; stop (close) stops them. Tasks queued before wait for it.
func (b *background) start(_, _ context.Context) error {
	b.begin()
	return nil
}

func (b *background) stop(context.Context) { b.close() }

func (b *background) begin() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	for range backgroundLimit {
		b.wg.Add(1)
		go b.serve()
	}
}

// run queues f as a background task of tenant, to run with a bounded context unless
// the worker shuts down first; close waits for the tasks under way. It is called by
// the handler of the NATS subscription that received m (nil for work a job asks
// for), and does not wait. A
// tenant's task beyond backgroundQueue waiting is dropped (logged once until its
// queue drains): a flood costs its sender, not the others. What the client itself
// drops beyond its limits (a slow consumer) is logged, with the count, at the next
// task. It reports whether f was queued.
func (b *background) run(tenant string, m *nats.Msg, f func(ctx context.Context)) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	var sub *nats.Subscription // nil for work that no message asked for
	subject := ""
	if m != nil {
		sub, subject = m.Sub, m.Subject
	}
	dropped := b.droppedLocked(sub)
	q := b.queues[tenant]
	switch {
	case len(q) >= backgroundQueue:
		first := !b.full[tenant]
		b.full[tenant] = true
		b.mu.Unlock()
		if first {
			b.log.Warn("a tenant's background work is at its limit: its excess is dropped", "tenant", tenant, "limit", backgroundQueue, "subject", subject)
		}
		return false
	case len(q) == 0:
		b.turn = append(b.turn, tenant)
	}
	b.queues[tenant] = append(q, f)
	b.mu.Unlock()
	if dropped > 0 {
		b.log.Error("messages dropped by the NATS client while background work was at its limit (slow consumer)", "subject", sub.Subject, "dropped", dropped)
	}
	select {
	case b.wake <- struct{}{}:
	default: // every server is awake already
	}
	return true
}

// serve is one slot: it runs the next task, tenants in turn, until close.
func (b *background) serve() {
	defer b.wg.Done()
	for {
		f := b.next()
		if f == nil {
			select {
			case <-b.wake:
				continue
			case <-b.closing:
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), backgroundTimeout)
		f(ctx)
		cancel()
	}
}

// next takes the first task of the tenant whose turn it is, or returns nil.
func (b *background) next() func(context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(b.turn) == 0 {
		return nil
	}
	tenant := b.turn[0]
	b.turn = b.turn[1:]
	q := b.queues[tenant]
	f := q[0]
	q[0] = nil
	if q = q[1:]; len(q) > 0 {
		b.queues[tenant] = q
		b.turn = append(b.turn, tenant)
	} else {
		delete(b.queues, tenant)
		delete(b.full, tenant)
	}
	return f
}

// droppedLocked returns how many messages the client dropped for sub since the last
// call.
func (b *background) droppedLocked(sub *nats.Subscription) int {
	if sub == nil {
		return 0
	}
	n, err := sub.Dropped()
	if err != nil || n <= b.dropped[sub] {
		return 0
	}
	d := n - b.dropped[sub]
	b.dropped[sub] = n
	return d
}

// close drops the tasks not started and waits for those under way. It is safe to
// call more than once.
func (b *background) close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		b.queues, b.turn = nil, nil
		close(b.closing)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// tenantRates is a rate of requests for each tenant, made at its first request. The
// tenant tokens come from the subjects the server writes for the tenants' imports, so
// there are as many rates as tenants.
type tenantRates struct {
	limit rate.Limit
	burst int

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func newTenantRates(perSecond float64, burst int) *tenantRates {
	return &tenantRates{limit: rate.Limit(perSecond), burst: burst, m: map[string]*rate.Limiter{}}
}

// allow reports whether tenant may have one more request now.
func (r *tenantRates) allow(tenant string) bool {
	r.mu.Lock()
	l, ok := r.m[tenant]
	if !ok {
		l = rate.NewLimiter(r.limit, r.burst)
		r.m[tenant] = l
	}
	r.mu.Unlock()
	return l.Allow()
}

// busyHeader is the header of every busy answer to a tenant's request, made once: a
// flood of requests past a tenant's rate costs an answer each, and no more. Its
// content type is no event's: aimed at an events subject, it is not taken for one.
var busyHeader = nats.Header{wire.HeaderContentType: {wire.ContentTypeBytes}, wire.HeaderError: {wire.Busy}}

// serveTenant answers m, a tenant's request on a subject parse reads the tenant of,
// with what answer makes of it, in the background as the tenant's work within its
// rates; beyond them, or beyond the tenant's background queue, the answer is busy.
func (b *background) serveTenant(m *nats.Msg, parse func(string) (string, error), rates *tenantRates, answer func(ctx context.Context, tenant string) *nats.Msg) {
	tenant, err := parse(m.Subject)
	if err != nil || m.Reply == "" {
		b.log.Debug("ignored a tenant's request", "subject", m.Subject, "err", err)
		return
	}
	if rates.allow(tenant) && b.run(tenant, m, func(ctx context.Context) {
		if err := m.RespondMsg(answer(ctx, tenant)); err != nil {
			// Larger than the server takes, say: the asker is told, not left waiting.
			_ = m.RespondMsg(&nats.Msg{Header: nats.Header{wire.HeaderContentType: {wire.ContentTypeBytes}, wire.HeaderError: {"no answer could be sent: " + err.Error()}}})
		}
	}) {
		return
	}
	_ = m.RespondMsg(&nats.Msg{Header: busyHeader})
}
