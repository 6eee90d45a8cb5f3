package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// Sessions. A session's calls are published on jazzmine.session.<sandbox>.<id>
// (jazzmine.session.<tenant>.<sandbox>.<id> from a tenant) and
// kept in StreamSessions while they wait. Each call is routed once:
//
//   - per sandbox, the fleet's opener (wire.SessionOpenerName) sees every call once,
//     on one worker (opener.go). A call of a session nobody holds opens it there: the
//     worker claims the session in BucketSessions (a create, so one worker wins),
//     takes a container of its own for it and makes the session's consumer. A call
//     of an open session is acked: the session's consumer has it. A call of a
//     session that ended (closed, idle, too old, its process or its worker died) is
//     answered with session_lost, and never runs: no silent new session.
//   - per session, its owner's consumer (wire.SessionConsumerName), which starts at
//     the first call and delivers the calls in order, one at a time, to the loop
//     that runs them (serve).
//
// A session whose owner is gone, or whose end was cut short, is the rescuer's
// (rescuer.go): every worker watches the bucket, and on a timer ends such sessions
// and answers the calls they left.

// Session states in BucketSessions.
const (
	sessionOpen  = "open"
	sessionEnded = "ended"
)

// sessionEntry is a session's entry in BucketSessions, keyed by its key (sessionRef).
type sessionEntry struct {
	Worker  string `json:"worker"`
	Sandbox string `json:"sandbox"`
	State   string `json:"state"`
	// Reason says why an ended session ended, for the session_lost of later calls.
	Reason string `json:"reason,omitempty"`
	// From is the first call (stream sequence) an ended session's owner had not
	// acked, where its end answers calls from; 0 if unknown. Answered says that every
	// call it left has its end (finish).
	From     uint64 `json:"from,omitempty"`
	Answered bool   `json:"answered,omitempty"`
}

// sessions holds this worker's sessions and runs the openers of its sandboxes and
// the rescuer.
type sessions struct {
	cfg     *Config
	js      jetstream.JetStream
	proc    *processor
	events  *events
	log     *slog.Logger
	kv      jetstream.KeyValue            // BucketSessions
	stream  jetstream.Stream              // StreamSessions
	openers map[string]jetstream.Consumer // by sandbox
	gates   *gates

	mu        sync.Mutex
	held      map[string]*session // by session key; reserved while being opened (claim)
	finishing map[string]bool     // ended sessions whose calls this worker answers (finish)
	stopped   bool
	loops     sync.WaitGroup // openers, the rescuer, session loops and the answering of ended sessions
}

// session is one session this worker holds.
type session struct {
	ref     sessionRef
	sandbox string
	lease   *sandboxpool.Lease
	cons    jetstream.Consumer
	opened  time.Time
	ended   string // why it ended, once it has; set by the session's own loop
	// stopTouch ends the writing of its entry (touch), which starts at its claim.
	stopTouch chan struct{}
	// taken says why the fleet ended the session, its owner taken for dead (touch);
	// the fleet answers its calls.
	taken chan string
}

func newSessions(cfg *Config, js jetstream.JetStream, topo *topology, proc *processor, ev *events, g *gates) *sessions {
	return &sessions{cfg: cfg, js: js, kv: topo.sessionKV, stream: topo.sessions, openers: topo.openers, proc: proc, events: ev, log: cfg.Logger,
		gates: g, held: map[string]*session{}, finishing: map[string]bool{}}
}

// start runs an opener loop per sandbox and the rescuer until run ends.
func (s *sessions) start(_, run context.Context) error {
	w, err := s.kv.WatchAll(run)
	if err != nil {
		return fmt.Errorf("watch the sessions: %w", err)
	}
	s.loops.Add(1)
	go s.rescue(run, w)
	for _, sb := range s.cfg.Sandboxes {
		s.loops.Add(1)
		go s.open(run, sb.Name, s.openers[sb.Name])
	}
	return nil
}

// stop ends every session this worker holds (their next calls get session_lost) once
// their running call, if any, has ended, and waits for the loops.
func (s *sessions) stop(context.Context) {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.loops.Wait()
}

// begin takes a container for session h, whose claim wrote its entry and touches it
// meanwhile (a container may take up to the ack wait to free), and starts its loop on
// a consumer of its calls. A session the fleet ended while it was being opened (its
// owner taken for dead) is not served: its consumer is deleted and its container
// retired.
func (s *sessions) begin(ctx context.Context, h *session) error {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.AckWait)
	defer cancel()
	lease, err := s.cfg.Pool.Checkout(cctx, h.sandbox)
	if err != nil {
		return err
	}
	retire := func() {
		lease.Retire(sandboxpool.RetireSession)
		lease.Release()
	}
	cons, err := s.js.CreateOrUpdateConsumer(cctx, wire.StreamSessions, jetstream.ConsumerConfig{
		Durable:       h.ref.consumer(),
		Description:   "calls of session " + h.ref.key(),
		FilterSubject: h.ref.subject(h.sandbox),
		// From the session's first call, whichever call claimed it: a call that
		// another worker nakked at its limits is earlier than the one that claimed the
		// session here. Calls that have their end (refused ones) are skipped
		// (job.go, ended).
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		MaxAckPending: 1,
		// Gone by itself when its worker died and no call came to end the session.
		InactiveThreshold: s.cfg.SessionIdleTTL + s.cfg.AckWait,
		Replicas:          s.cfg.Replicas,
	})
	if err != nil {
		retire()
		return err
	}
	// Still ours once the consumer is there: an end written before this read is seen
	// here, and one written after it deletes the consumer and answers what it holds.
	if e, _, _, err := s.entry(cctx, h.ref); err != nil || e == nil || e.State != sessionOpen || e.Worker != s.cfg.WorkerID {
		_ = s.js.DeleteConsumer(context.WithoutCancel(cctx), wire.StreamSessions, h.ref.consumer())
		retire()
		if err == nil {
			err = errors.New("the fleet ended it while it was being opened")
		}
		return err
	}
	h.lease, h.cons, h.opened = lease, cons, time.Now()
	s.mu.Lock()
	s.held[h.ref.key()] = h
	s.mu.Unlock()
	s.loops.Add(1)
	go s.serve(h)
	return nil
}

// serve runs the session's calls one at a time, in order, until it ends: closed, idle
// past the TTL, past its maximum life, its process lost, or the worker stopping.
func (s *sessions) serve(h *session) {
	defer s.loops.Done()
	idleSince := time.Now()
	taken := false
	for h.ended == "" {
		select {
		case h.ended = <-h.taken:
			taken = true
			continue
		default:
		}
		if reason := s.expired(h, idleSince); reason != "" {
			h.ended = reason
			break
		}
		msg, err := h.cons.Next(jetstream.FetchMaxWait(250 * time.Millisecond))
		if err != nil {
			continue // nothing yet (or a passing failure): look at the clocks again
		}
		if act := s.proc.handleIn(h.sandbox, msg, h.runCall(s.proc)); act == actAck || act == actTerm {
			s.dropThrough(h, msg)
		}
		idleSince = time.Now()
	}
	close(h.stopTouch)
	if taken {
		s.release(h, h.ended)
		return
	}
	s.end(context.Background(), h, h.ended)
}

// expired says why the session must end now, or "".
func (s *sessions) expired(h *session, idleSince time.Time) string {
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	switch {
	case stopped:
		return "its worker shut down"
	case time.Since(idleSince) > s.cfg.SessionIdleTTL:
		return fmt.Sprintf("it was idle for %v (the idle TTL)", s.cfg.SessionIdleTTL)
	case time.Since(h.opened) > s.cfg.SessionMaxLife:
		return fmt.Sprintf("it reached its maximum life of %v", s.cfg.SessionMaxLife)
	}
	return ""
}

// end marks the session ended with reason (later calls get session_lost saying it),
// answers the calls its consumer still holds, deletes it and retires its container.
func (s *sessions) end(ctx context.Context, h *session, reason string) {
	// Answering the calls left takes a moment each; a worker that stops leaves what it
	// did not answer in 5 s to the fleet's rescuers (endStall), not its shutdown.
	s.mu.Lock()
	budget := time.Minute
	if s.stopped {
		budget = 5 * time.Second
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	e := &sessionEntry{Worker: s.cfg.WorkerID, Sandbox: h.sandbox, State: sessionEnded, Reason: reason}
	if h.cons != nil {
		if info, err := h.cons.Info(ctx); err == nil {
			e.From = info.AckFloor.Stream + 1
		}
	}
	if _, err := s.kv.Put(ctx, h.ref.key(), mustJSON(e)); err != nil {
		s.log.Warn("mark a session ended", "session_id", h.ref.key(), "err", err)
	}
	// Calls that came before the entry said ended were left to this consumer by the
	// opener: they get their session_lost here, or, should this worker stop first,
	// from a rescuer (rescuer.go).
	if err := s.finish(ctx, h.sandbox, h.ref, e); err != nil {
		s.log.Warn("answer the calls left in an ended session; a rescuer will finish it", "session_id", h.ref.key(), "err", err)
	}
	s.release(h, reason)
}

// release retires the session's container and forgets the session.
func (s *sessions) release(h *session, reason string) {
	if h.lease != nil {
		h.lease.Retire(sandboxpool.RetireSession)
		h.lease.Release()
	}
	s.mu.Lock()
	delete(s.held, h.ref.key())
	s.mu.Unlock()
	s.log.Info("session ended", "session_id", h.ref.key(), "sandbox", h.sandbox, "reason", reason)
}

// entry returns the session's entry, its revision and when it was written, or nil
// when it has none.
func (s *sessions) entry(ctx context.Context, id sessionRef) (*sessionEntry, uint64, time.Time, error) {
	kve, err := s.kv.Get(ctx, id.key())
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, time.Time{}, nil
	}
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	var e sessionEntry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return nil, 0, time.Time{}, fmt.Errorf("session %s: entry %q: %w", id.key(), kve.Value(), err)
	}
	return &e, kve.Revision(), kve.Created(), nil
}

// Owners write their open sessions' entries every sessionTouch; an entry not written
// for sessionTouchTimeout is a session whose owner died (or lost NATS that long).
const (
	sessionTouch        = 5 * time.Second
	sessionTouchTimeout = 3 * sessionTouch
)

// alive reports whether the owner of open session id, whose entry was written
// at touched, still holds it: this worker, if it holds it (a worker restarted under
// its old id holds none of its sessions); another, if it wrote the entry lately. Its
// worker's liveness key is not enough: a worker that missed a refresh would see its
// running call answered by another, and a dead worker's undelivered call is
// indistinguishable from a running one in its consumer.
func (s *sessions) alive(entry *sessionEntry, id sessionRef, touched time.Time) bool {
	if entry.Worker == s.cfg.WorkerID {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.held[id.key()] != nil
	}
	return time.Since(touched) < sessionTouchTimeout
}

// touch writes the session's entry every sessionTouch until stop is closed, so that
// the fleet knows its owner lives. Each write is an update of the revision it wrote
// last: once the session's end has written its entry, a late touch fails.
func (s *sessions) touch(h *session, rev uint64, stop <-chan struct{}) {
	defer s.loops.Done()
	entry := mustJSON(&sessionEntry{Worker: s.cfg.WorkerID, Sandbox: h.sandbox, State: sessionOpen})
	t := time.NewTicker(sessionTouch)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), sessionTouch)
			next, err := s.kv.Update(ctx, h.ref.key(), entry, rev)
			if err == nil {
				rev = next
			} else if e, _, _, gerr := s.entry(ctx, h.ref); gerr == nil && e != nil && e.State == sessionEnded {
				// The fleet took this worker for dead (it could not write for a
				// while) and ended the session; it holds the container for nothing.
				h.taken <- "the fleet ended it: " + e.Reason
				cancel()
				return
			} else {
				s.log.Warn("refresh a session's entry", "session_id", h.ref.key(), "err", err)
			}
			cancel()
		}
	}
}

// answer ends a call that does not run with an error of kind, unless it has an end
// already (its session's owner ran it before the session ended).
// It fails when it cannot tell whether the call has an end, or cannot store one:
// the caller keeps the call to answer it again.
func (s *sessions) answer(sandbox string, msg message, kind, text string) error {
	job, ref, ct, err := decode(sandbox, msg, s.cfg.MaxScriptBytes)
	switch {
	case err != nil && ref.id == "":
		return nil // no id of its own to answer under: no end is owed
	case err != nil:
		kind, text = wire.KindInvalidJob, err.Error()
	}
	var meta map[string]string
	if err == nil {
		meta = job.Metadata
	}
	ctx, cancel := publishContext()
	defer cancel()
	if ended, err := s.events.ended(ctx, ref.key()); err != nil || ended {
		return err
	}
	// Attempt 0, as a job ended before it ran: its message ids are never a run's.
	p := s.events.publisher(ref, 0, ct, meta)
	if err := p.terminal(kind, text); err != nil {
		s.log.Warn("answer a session call", "execution_id", ref, "err", err)
		return err
	}
	return nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only sessionEntry, which always encodes
	}
	return b
}

// runCall is the processor's step for a call of the session (runStep): it runs in the
// session's container, in place of checkout and release, and settles whether the
// session goes on (it sets sess.ended when the session must end after it). The call
// is done with once acked or terminated, not back to the queue.
func (sess *session) runCall(pr *processor) runStep {
	return func(ctx context.Context, job *wire.Job, inputs []harness.InputFile, p *publisher, ref execRef, attempt int, log *slog.Logger) (outcome, string) {
		return sess.run(ctx, pr, job, inputs, p, ref, attempt, log)
	}
}

func (sess *session) run(ctx context.Context, pr *processor, job *wire.Job, inputs []harness.InputFile, p *publisher, ref execRef, attempt int, log *slog.Logger) (outcome, string) {
	if job.Script == "" { // a close, and nothing to run
		sess.ended = "it was closed"
		return pr.finish(ctx, p, &harness.Result{Success: true}, nil, log)
	}
	res, err := pr.run(ctx, sess.lease, job, inputs, p, ref, attempt)
	if pr.handOver(ctx, ref, res, err, log) {
		// Not back to the queue: the session is gone with this worker.
		sess.ended = "its worker shut down during a call"
		if perr := p.terminal(wire.KindSessionLost, "session "+sess.ref.id+" ended: "+sess.ended); perr != nil {
			return outUnstored, truncateReason(perr.Error())
		}
		return outRan, ""
	}
	switch {
	case res == nil:
	case res.ErrorKind == wire.KindSessionLost:
		sess.ended = res.Error // the harness found its session process dead
	case !res.Reusable:
		sess.ended = fmt.Sprintf("its container was lost (%s: %s)", res.ErrorKind, res.Error)
	default:
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := sess.lease.AwaitReady(rctx); err != nil {
			sess.ended = "its container stopped answering: " + err.Error()
		}
		cancel()
	}
	if job.SessionClose && sess.ended == "" {
		sess.ended = "it was closed"
	}
	return pr.finish(ctx, p, res, err, log)
}
