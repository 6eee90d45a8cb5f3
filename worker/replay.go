package worker

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// Replay. A tenant's events reach its account's own events stream through a stream
// import (deploy/nats/auth.conf), that is as plain messages: what that stream misses
// while it elects a leader, or while the server it is on is down, is lost to it,
// though the fleet's stream, which the workers publish to with acknowledgements,
// holds every event. An agent whose execution went quiet asks for its events again on
// jazzmine.replay.<id>; one worker of the fleet (queue group) reads them from the
// fleet's stream and publishes them again, with their Nats-Msg-Id, on
// jazzmine.replayed.<tenant>.<id>.<type>, which the tenant's account receives as
// jazzmine.events.<id>.<type>: its stream drops what it holds already (within its
// duplicate window) and the client skips what it has seen. The fleet's own account
// needs none of it (its stream is the one the workers publish to), so a replay
// request without a tenant token is ignored.
const (
	groupReplay = "jazzmine-replay"
	// replayAll matches the replay requests of every tenant, and only theirs.
	replayAll = wire.SubjectPrefixReplay + ".*.*"
	// replayEvery is how often one execution's events are replayed at most: an agent
	// asking in a loop costs the fleet one read of them a second.
	replayEvery = time.Second
	// maxReplayEvents bounds the events one replay publishes: more than an agent is
	// owed for any execution the workers' limits allow.
	maxReplayEvents = 100_000
	// replayBatch is how many events a replay fetches at a time.
	replayBatch = 256
)

// replayer answers the fleet's replay requests.
type replayer struct {
	nc     *nats.Conn
	events *events
	bg     *background
	log    *slog.Logger

	mu     sync.Mutex          // guards recent and order
	recent map[string]struct{} // executions replayed within replayEvery
	order  []replayed          // the same, oldest first
}

// replayed notes when an execution's replay was queued.
type replayed struct {
	key string
	at  time.Time
}

func newReplayer(nc *nats.Conn, events *events, bg *background, log *slog.Logger) *replayer {
	return &replayer{nc: nc, events: events, bg: bg, log: log, recent: map[string]struct{}{}}
}

// see is the handler of replayAll: a request is replayed in the background, as the
// tenant's work (background.run), unless the same execution was replayed within
// replayEvery. Only a request the background queued is noted, and notes expire
// oldest first, so what one request costs here is constant: a tenant flooding the
// fleet with requests for made-up executions loses its excess in its own background
// queue and does not slow the handler down for the others' requests.
func (r *replayer) see(m *nats.Msg) {
	tenant, id, err := wire.ParseReplaySubject(m.Subject)
	if err != nil || tenant == "" {
		r.log.Debug("ignored a replay request", "subject", m.Subject, "err", err)
		return
	}
	ref := execRef{tenant: tenant, id: id}
	key := ref.key()
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for len(r.order) > 0 && now.Sub(r.order[0].at) >= replayEvery {
		delete(r.recent, r.order[0].key)
		r.order[0] = replayed{}
		r.order = r.order[1:]
	}
	if _, ok := r.recent[key]; ok {
		return
	}
	queued := r.bg.run(tenant, m, func(ctx context.Context) {
		n, err := r.replay(ctx, ref)
		r.log.Debug("replayed an execution's events", "execution_id", ref, "events", n, "err", err)
	})
	if queued {
		r.recent[key] = struct{}{}
		r.order = append(r.order, replayed{key: key, at: now})
	}
}

// replay publishes the events of ref stored in the fleet's stream again, on the
// tenant's replayed subjects, and returns how many.
func (r *replayer) replay(ctx context.Context, ref execRef) (int, error) {
	cons, err := r.events.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventsWildcard(ref.key())}, InactiveThreshold: backgroundTimeout,
	})
	if err != nil {
		return 0, err
	}
	// Deleted at once: a tenant asking for many executions must not leave a consumer
	// per request on the fleet's stream for the inactivity threshold.
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = r.events.stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	pending := min(int(cons.CachedInfo().NumPending), maxReplayEvents)
	from := wire.SubjectPrefixEvents + "." + ref.key() + "."
	to := wire.SubjectPrefixReplayed + "." + ref.key() + "."
	n := 0
	for n < pending {
		batch, err := cons.Fetch(min(replayBatch, pending-n), jetstream.FetchContext(ctx))
		if err != nil {
			return n, err
		}
		for msg := range batch.Messages() {
			eventType, _ := strings.CutPrefix(msg.Subject(), from)
			if err := r.nc.PublishMsg(&nats.Msg{Subject: to + eventType, Header: msg.Headers(), Data: msg.Data()}); err != nil {
				return n, err
			}
			n++
		}
		if err := batch.Error(); err != nil {
			return n, err
		}
	}
	return n, nil
}
