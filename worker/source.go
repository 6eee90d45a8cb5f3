package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// Sources. A tenant's executions' events are published in the fleet's account and
// kept in its StreamEvents; the tenant's account has an events stream of its own,
// which sources them (JetStream's durable sourcing, nats-server 2.14 and later): per
// tenant, the fleet's durable consumer TenantEventsConsumer, filtered to the
// tenant's events, delivers them on TenantEventsSubject with flow control, and the
// tenant's stream's answers to that flow control are the consumer's acks. What the
// tenant's stream did not store (it was electing a leader, its server was down) is
// delivered again: every event arrives at least once, and its Nats-Msg-Id drops the
// copies. The tenant reaches nothing of the fleet's JetStream API but that
// consumer's reset, and the consumer's filter and deliver subject are the fleet's:
// deploy/nats/auth.conf exports those three subjects to the tenant alone.
//
// The consumer is made when a tenant's agent asks (wire.SubjectSource, before its
// client makes the tenant's stream: a stream whose source is missing tries again
// only after a growing wait) and when a worker first runs a job of the tenant.
const (
	sourceAll   = wire.SubjectSource + ".*"
	groupSource = "jazzmine-source"
	// sourceRate and sourceBurst bound a tenant's source requests on a worker: a
	// client asks once, when it makes its account's events stream.
	sourceRate  = 1
	sourceBurst = 4
	// sourceHeartbeat is what durable sourcing requires of the consumer.
	sourceHeartbeat = time.Second
	// sourcePending bounds the events delivered and not yet acknowledged by the
	// tenant's stream's flow control.
	sourcePending = 10_000
)

// sourcer makes the tenants' events consumers.
type sourcer struct {
	js       jetstream.JetStream
	replicas int
	bg       *background
	rates    *tenantRates
	log      *slog.Logger

	mu    sync.Mutex
	made  map[string]time.Time // when this worker last made or updated a tenant's consumer
	tried map[string]time.Time // when a job of the tenant last had it made (ensureFor)
}

const (
	// sourceFresh is how long a consumer this worker made counts as there: a
	// request or a job after it makes it again (an idempotent update), so that one
	// an operator deleted, or lost with the fleet's stream, comes back.
	sourceFresh = 10 * time.Minute
	// sourceRetry is how soon a job of a tenant has its consumer made again after a
	// try (a server older than 2.14 refuses it every time).
	sourceRetry = time.Minute
)

func newSourcer(js jetstream.JetStream, replicas int, bg *background, log *slog.Logger) *sourcer {
	return &sourcer{js: js, replicas: replicas, bg: bg, rates: newTenantRates(sourceRate, sourceBurst), log: log,
		made: map[string]time.Time{}, tried: map[string]time.Time{}}
}

// fresh reports whether this worker made tenant's consumer within sourceFresh.
func (s *sourcer) fresh(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(s.made[tenant]) < sourceFresh
}

// ensure makes or updates tenant's events consumer.
func (s *sourcer) ensure(ctx context.Context, tenant string) error {
	_, err := s.js.CreateOrUpdatePushConsumer(ctx, wire.StreamEvents, jetstream.ConsumerConfig{
		Durable:        wire.TenantEventsConsumer(tenant),
		Description:    "the events of tenant " + tenant + ", sourced by its account's events stream",
		FilterSubject:  wire.SubjectPrefixEvents + "." + tenant + ".>",
		DeliverSubject: wire.TenantEventsSubject(tenant),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckFlowControlPolicy,
		FlowControl:    true,
		IdleHeartbeat:  sourceHeartbeat,
		MaxAckPending:  sourcePending,
		Replicas:       s.replicas,
	})
	if err != nil {
		return fmt.Errorf("make the events consumer of tenant %s: %w", tenant, err)
	}
	s.mu.Lock()
	s.made[tenant] = time.Now()
	s.mu.Unlock()
	return nil
}

// ensureFor has tenant's events consumer made, for a job of the tenant this worker
// takes, in the tenant's background work (not on the job's path), unless it is
// fresh or a job had it made within sourceRetry: about once per tenant and worker
// every sourceFresh. A failure is logged, not the job's: the events are in the
// fleet's stream, and the consumer, made later, delivers them from the first.
func (s *sourcer) ensureFor(tenant string) {
	if tenant == "" {
		return
	}
	s.mu.Lock()
	skip := time.Since(s.made[tenant]) < sourceFresh || time.Since(s.tried[tenant]) < sourceRetry
	if !skip {
		s.tried[tenant] = time.Now()
	}
	s.mu.Unlock()
	if skip {
		return
	}
	s.bg.run(tenant, nil, func(ctx context.Context) {
		if err := s.ensure(ctx, tenant); err != nil {
			s.log.Warn("carry a tenant's events to its account", "tenant", tenant, "err", err)
		}
	})
}

// serve is the handler of sourceAll: a tenant's request that the fleet carry its
// events, answered at once when this worker made its consumer lately, else once it
// has made it again (an empty answer) or with the error, within the tenant's rate.
func (s *sourcer) serve(m *nats.Msg) {
	if tenant, err := wire.ParseSourceSubject(m.Subject); err == nil && m.Reply != "" && s.fresh(tenant) {
		_ = m.Respond(nil)
		return
	}
	s.bg.serveTenant(m, wire.ParseSourceSubject, s.rates, func(ctx context.Context, tenant string) *nats.Msg {
		reply := &nats.Msg{Header: nats.Header{}}
		if err := s.ensure(ctx, tenant); err != nil {
			s.log.Warn("carry a tenant's events to its account", "tenant", tenant, "err", err)
			reply.Header.Set(wire.HeaderError, err.Error())
		}
		return reply
	})
}
