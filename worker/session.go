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

// Sessions. A session's calls are published on jazzmine.session.<sandbox>.<id> and
// kept in StreamSessions. Two kinds of consumers read them:
//
//   - per sandbox, the fleet's opener (wire.SessionOpenerName) sees every call once,
//     on one worker. A call of a session nobody holds opens it there: the worker
//     claims the session in BucketSessions (a create, so one worker wins), takes a
//     container of its own for it and makes the session's consumer. A call of a
//     session that ended (closed, idle, too old, its process or its worker died) is
//     answered with session_lost by the opener, and never runs: no silent new session.
//   - per session, its owner's consumer (wire.SessionConsumerName), which starts at
//     the first call and delivers the calls in order, one at a time.
//
// The opener acks the calls of live sessions without doing anything: their owner's
// consumer has them too. It keeps watching one call of each live session, its last
// (see see): should the owner die, that call ends the session, and with it every
// call of the session the owner left (answerAll).

// Session states in BucketSessions.
const (
	sessionOpen  = "open"
	sessionEnded = "ended"
)

// sessionEntry is a session's entry in BucketSessions, keyed by its id.
type sessionEntry struct {
	Worker  string `json:"worker"`
	Sandbox string `json:"sandbox"`
	State   string `json:"state"`
	// Reason says why an ended session ended, for the session_lost of later calls.
	Reason string `json:"reason,omitempty"`
}

// sessions holds this worker's sessions and runs the openers of its sandboxes.
type sessions struct {
	cfg     *Config
	js      jetstream.JetStream
	proc    *processor
	events  *events
	log     *slog.Logger
	kv      jetstream.KeyValue // BucketSessions, set by ensureStreams
	stream  jetstream.Stream   // StreamSessions, set by ensureStreams
	openers map[string]jetstream.Consumer

	mu      sync.Mutex
	held    map[string]*session // by session id
	stopped bool
	loops   sync.WaitGroup // openers and session loops
}

// session is one session this worker holds.
type session struct {
	id, sandbox string
	lease       *sandboxpool.Lease
	cons        jetstream.Consumer
	opened      time.Time
	rev         uint64 // of its entry when it was claimed
	ended       string // why it ended, once it has; set by the session's own loop
}

func newSessions(cfg *Config, js jetstream.JetStream, proc *processor, ev *events) *sessions {
	return &sessions{cfg: cfg, js: js, proc: proc, events: ev, log: cfg.Logger, openers: map[string]jetstream.Consumer{}, held: map[string]*session{}}
}

// start runs an opener loop per sandbox until ctx ends.
func (s *sessions) start(ctx context.Context) {
	for _, sb := range s.cfg.Sandboxes {
		s.loops.Add(1)
		go s.open(ctx, sb.Name, s.openers[sb.Name])
	}
}

// stop ends every session this worker holds (their next calls get session_lost) once
// their running call, if any, has ended, and waits for the loops.
func (s *sessions) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.loops.Wait()
}

// open is an opener loop: one call at a time of the sandbox's sessions.
func (s *sessions) open(ctx context.Context, sandbox string, cons jetstream.Consumer) {
	defer s.loops.Done()
	last := lastCalls{}
	pullEach(ctx, cons, s.log.With("sandbox", sandbox), "a session call", func(msg jetstream.Msg) { s.see(ctx, sandbox, msg, last) })
}

// lastCalls is an opener's note of the stream sequence of each session's last call
// it knows of. A sequence only grows, so a note, however old, says that a call
// before it is not its session's last.
type lastCalls map[string]uint64

// lastCallsMax bounds an opener's notes; past it they start over.
const lastCallsMax = 4096

// later reports whether session id has a call stored after the call at seq, from the
// notes or, failing them, the stream.
func (s *sessions) later(ctx context.Context, sandbox, id string, seq uint64, notes lastCalls) bool {
	if notes[id] > seq {
		return true
	}
	last, err := s.stream.GetLastMsgForSubject(ctx, wire.SessionSubject(sandbox, id))
	if err != nil {
		return false // watched, as it may be the last
	}
	if len(notes) >= lastCallsMax {
		clear(notes)
	}
	notes[id] = last.Sequence
	return last.Sequence > seq
}

// see decides what the opener does with a call. A call of an unknown session opens
// it; a call of an ended session gets session_lost. A call of an open session is its
// owner's to run. The opener watches over the session through its last call: it
// looks at that call again later (a nak) while the call has no end and the owner is
// alive, and ends the session if the owner died first, so that no call is left in
// the consumer of a dead worker. An earlier call is acked at once: the owner runs the
// calls in order, so the last one's end comes after theirs, and a dead owner's are
// answered with it. (Every call was watched until it had its end before: one
// session's thousands of queued calls kept the opener from the sandbox's other
// sessions.) notes are the opener's notes of last calls.
func (s *sessions) see(ctx context.Context, sandbox string, msg jetstream.Msg, notes lastCalls) {
	_, id, err := wire.ParseSessionSubject(msg.Subject())
	meta, merr := msg.Metadata()
	if err != nil || merr != nil { // the stream takes no other subject
		_ = msg.Term()
		return
	}
	// Nothing is ever published under a call with no valid id (decode owns none): it
	// opens no session and has no end; its owner refuses it.
	key := msg.Headers().Get(wire.HeaderMsgID)
	valid := wire.ValidateID("execution id", key) == nil
	entry, rev, touched, err := s.entry(ctx, id)
	if err != nil {
		s.log.Warn("look up a session", "session_id", id, "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	switch {
	case entry == nil && !valid:
		_ = msg.Ack()
		return
	case entry == nil:
		switch answered, err := s.events.ended(ctx, key); {
		case err != nil:
			_ = msg.NakWithDelay(time.Second) // not claimed on a guess: it may have run
			return
		case answered:
			_ = msg.Ack() // while no worker served its sandbox (triage.go)
			return
		}
		s.claim(ctx, sandbox, id, msg)
		return
	case entry.Sandbox != sandbox:
		s.answer(sandbox, msg, wire.KindInvalidJob, fmt.Sprintf("session %s is a session of sandbox %s, not %s: a session id is the fleet's, use a new one", id, entry.Sandbox, sandbox))
		_ = msg.Ack()
		return
	case entry.State == sessionOpen:
		if s.later(ctx, sandbox, id, meta.Sequence.Stream, notes) {
			_ = msg.Ack() // the session's last call is watched
			return
		}
		if answered, _ := s.events.ended(ctx, key); answered && valid {
			_ = msg.Ack() // its owner ran it, and every call before it
			return
		}
		if s.alive(entry, id, touched) {
			// A last call with no valid id never has an end: it is watched while the
			// session lives, or until a later call comes.
			_ = msg.NakWithDelay(watchDelay(meta))
			return
		}
		entry = &sessionEntry{Worker: entry.Worker, Sandbox: sandbox, State: sessionEnded, Reason: fmt.Sprintf("its worker %s died", entry.Worker)}
		if _, err := s.kv.Update(ctx, id, mustJSON(entry), rev); err != nil {
			_ = msg.NakWithDelay(100 * time.Millisecond) // someone else changed it: look again
			return
		}
		if err := s.answerAll(ctx, sandbox, id, entry.Reason); err != nil {
			s.log.Warn("answer the calls of a dead worker's session", "session_id", id, "err", err)
		}
		_ = s.js.DeleteConsumer(ctx, wire.StreamSessions, wire.SessionConsumerName(id))
	}
	if valid {
		s.answer(sandbox, msg, wire.KindSessionLost, fmt.Sprintf("session %s ended: %s", id, entry.Reason))
	}
	_ = msg.Ack()
}

// answerAll answers with session_lost every call of session id stored so far that
// has no end, from the first its consumer has not acked (from the first of all when
// the consumer is gone). The session's entry says it ended: a call stored after this
// reads it is the opener's to answer.
func (s *sessions) answerAll(ctx context.Context, sandbox, id, reason string) error {
	subject := wire.SessionSubject(sandbox, id)
	last, err := s.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("look up the last call: %w", err)
	}
	start := uint64(1)
	if c, err := s.js.Consumer(ctx, wire.StreamSessions, wire.SessionConsumerName(id)); err == nil {
		start = c.CachedInfo().AckFloor.Stream + 1
	}
	if start > last.Sequence {
		return nil
	}
	walk, err := s.js.OrderedConsumer(ctx, wire.StreamSessions, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    start,
	})
	if err != nil {
		return fmt.Errorf("read the calls: %w", err)
	}
	text := fmt.Sprintf("session %s ended: %s", id, reason)
	for {
		msg, err := walk.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			return fmt.Errorf("read the calls: %w", err)
		}
		s.answer(sandbox, msg, wire.KindSessionLost, text)
		if meta, err := msg.Metadata(); err != nil || meta.Sequence.Stream >= last.Sequence {
			return err
		}
	}
}

// watchDelay is how long the opener waits before it looks at a call of a live
// session again: 100 ms, then longer the longer the call runs, up to 5 s.
func watchDelay(meta *jetstream.MsgMetadata) time.Duration {
	return min(time.Duration(meta.NumDelivered)*100*time.Millisecond, 5*time.Second)
}

// claim opens session id here for its first call msg, or, at this worker's limits,
// leaves it to another worker (a nak) until the last delivery, which answers the call
// with session_limit and ends the session before it began.
func (s *sessions) claim(ctx context.Context, sandbox, id string, msg jetstream.Msg) {
	last := false
	if meta, err := msg.Metadata(); err == nil {
		last = int(meta.NumDelivered) >= s.cfg.MaxDeliver
	}
	if !s.room(sandbox) {
		s.log.Debug("no room for a session here", "session_id", id, "sandbox", sandbox, "last_delivery", last)
		if !last {
			_ = msg.NakWithDelay(200 * time.Millisecond)
			return
		}
		reason := "no worker had room for it (session limits)"
		if _, err := s.kv.Create(ctx, id, mustJSON(&sessionEntry{Worker: s.cfg.WorkerID, Sandbox: sandbox, State: sessionEnded, Reason: reason})); err == nil {
			s.answer(sandbox, msg, wire.KindSessionLimit, fmt.Sprintf("session %s could not be opened: %s", id, reason))
		}
		_ = msg.Ack()
		return
	}
	rev, err := s.kv.Create(ctx, id, mustJSON(&sessionEntry{Worker: s.cfg.WorkerID, Sandbox: sandbox, State: sessionOpen}))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			s.log.Warn("claim a session", "session_id", id, "err", err)
		}
		_ = msg.NakWithDelay(50 * time.Millisecond) // another worker claimed it first: see it again
		return
	}
	if err := s.begin(ctx, sandbox, id, rev); err != nil {
		s.log.Warn("open a session", "session_id", id, "sandbox", sandbox, "err", err)
		s.end(context.Background(), &session{id: id, sandbox: sandbox}, "it could not be opened: "+err.Error())
		s.answer(sandbox, msg, wire.KindInfrastructure, fmt.Sprintf("session %s could not be opened: %v", id, err))
	}
	_ = msg.Ack()
}

// room reports whether this worker may open another session of sandbox.
func (s *sessions) room(sandbox string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || len(s.held) >= s.cfg.MaxSessions {
		return false
	}
	n := 0
	for _, h := range s.held {
		if h.sandbox == sandbox {
			n++
		}
	}
	return n < s.cfg.sandbox(sandbox).MaxSessions
}

// begin takes a container for the session and starts its loop on a consumer of its
// calls; rev is the revision of the entry that claimed it.
func (s *sessions) begin(ctx context.Context, sandbox, id string, rev uint64) error {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.AckWait)
	defer cancel()
	lease, err := s.cfg.Pool.Checkout(cctx, sandbox)
	if err != nil {
		return err
	}
	cons, err := s.js.CreateOrUpdateConsumer(cctx, wire.StreamSessions, jetstream.ConsumerConfig{
		Durable:       wire.SessionConsumerName(id),
		Description:   "calls of session " + id,
		FilterSubject: wire.SessionSubject(sandbox, id),
		// From the session's first call, whichever call claimed it: a call that
		// another worker nakked at its limits is earlier than the one that claimed the
		// session here. Calls that have their end (refused ones) are skipped
		// (ended.go).
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		MaxAckPending: 1,
		// Gone by itself when its worker died and no call came to end the session.
		InactiveThreshold: s.cfg.SessionIdleTTL + s.cfg.AckWait,
		Replicas:          s.cfg.Replicas,
	})
	if err != nil {
		lease.Retire(sandboxpool.RetireSession)
		lease.Release()
		return err
	}
	h := &session{id: id, sandbox: sandbox, lease: lease, cons: cons, opened: time.Now(), rev: rev}
	s.mu.Lock()
	s.held[id] = h
	s.mu.Unlock()
	s.loops.Add(1)
	go s.serve(h)
	return nil
}

// serve runs the session's calls one at a time, in order, until it ends: closed, idle
// past the TTL, past its maximum life, its process lost, or the worker stopping.
func (s *sessions) serve(h *session) {
	defer s.loops.Done()
	stopTouch := make(chan struct{})
	s.loops.Add(1)
	go s.touch(h, h.rev, stopTouch)
	idleSince := time.Now()
	for h.ended == "" {
		if reason := s.expired(h, idleSince); reason != "" {
			h.ended = reason
			break
		}
		msg, err := h.cons.Next(jetstream.FetchMaxWait(250 * time.Millisecond))
		if err != nil {
			continue // nothing yet (or a passing failure): look at the clocks again
		}
		h.ended = s.proc.handleSession(h, msg)
		idleSince = time.Now()
	}
	close(stopTouch)
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
	ctx, cancel := context.WithTimeout(ctx, time.Minute) // answerAll is a call at a time
	defer cancel()
	entry := mustJSON(&sessionEntry{Worker: s.cfg.WorkerID, Sandbox: h.sandbox, State: sessionEnded, Reason: reason})
	if _, err := s.kv.Put(ctx, h.id, entry); err != nil {
		s.log.Warn("mark a session ended", "session_id", h.id, "err", err)
	}
	if h.cons != nil {
		// Calls that came before the entry said ended were left to this consumer by
		// the opener: they get their session_lost here.
		if err := s.answerAll(ctx, h.sandbox, h.id, reason); err != nil {
			s.log.Warn("answer the calls left in an ended session", "session_id", h.id, "err", err)
		}
		_ = s.js.DeleteConsumer(ctx, wire.StreamSessions, wire.SessionConsumerName(h.id))
	}
	if h.lease != nil {
		h.lease.Retire(sandboxpool.RetireSession)
		h.lease.Release()
	}
	s.mu.Lock()
	delete(s.held, h.id)
	s.mu.Unlock()
	s.log.Info("session ended", "session_id", h.id, "sandbox", h.sandbox, "reason", reason)
}

// entry returns the session's entry, its revision and when it was written, or nil
// when it has none.
func (s *sessions) entry(ctx context.Context, id string) (*sessionEntry, uint64, time.Time, error) {
	kve, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, time.Time{}, nil
	}
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	var e sessionEntry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return nil, 0, time.Time{}, fmt.Errorf("session %s: entry %q: %w", id, kve.Value(), err)
	}
	return &e, kve.Revision(), kve.Created(), nil
}

// Owners write their open sessions' entries every sessionTouch; an entry not written
// for sessionTouchTimeout is a session whose owner died (or lost NATS that long).
const (
	sessionTouch        = 5 * time.Second
	sessionTouchTimeout = 3 * sessionTouch
)

// alive reports whether the owner of open session sessionID, whose entry was written
// at touched, still holds it: this worker, if it holds it (a worker restarted under
// its old id holds none of its sessions); another, if it wrote the entry lately. Its
// worker's liveness key is not enough: a worker that missed a refresh would see its
// running call answered by another, and a dead worker's undelivered call is
// indistinguishable from a running one in its consumer.
func (s *sessions) alive(entry *sessionEntry, sessionID string, touched time.Time) bool {
	if entry.Worker == s.cfg.WorkerID {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.held[sessionID] != nil
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
			next, err := s.kv.Update(ctx, h.id, entry, rev)
			cancel()
			if err == nil {
				rev = next
			} else {
				s.log.Warn("refresh a session's entry", "session_id", h.id, "err", err)
			}
		}
	}
}

// answer ends a call that does not run with an error of kind, unless it has an end
// already (its session's owner ran it before the session ended).
func (s *sessions) answer(sandbox string, msg jetstream.Msg, kind, text string) {
	job, ref, ct, err := decode(sandbox, msg, s.cfg.MaxScriptBytes)
	switch {
	case err != nil && ref.id == "":
		return // no id of its own to answer under: the caller acks it
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
		return
	}
	// Attempt 0, as a job ended before it ran: its message ids are never a run's.
	p := s.events.publisher(ref, 0, ct, meta)
	if perr := p.terminal(kind, text); perr != nil {
		s.log.Warn("answer a session call", "execution_id", ref, "err", perr)
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only sessionEntry, which always encodes
	}
	return b
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// inSession runs a call in its session's container (the processor's step for session
// calls, in place of checkout and release) and settles whether the session goes on.
func (pr *processor) inSession(ctx context.Context, sess *session, job *wire.Job, inputs []harness.InputFile, p *publisher, ref execRef, attempt int, log *slog.Logger) (outcome, string) {
	if job.Script == "" { // a close, and nothing to run
		sess.ended = "it was closed"
		return pr.finish(ctx, p, &harness.Result{Success: true}, nil, log)
	}
	res, err := pr.run(ctx, sess.lease, job, inputs, p, ref, attempt)
	if pr.handOver(ctx, ref, res, err, log) {
		// Not back to the queue: the session is gone with this worker.
		sess.ended = "its worker shut down during a call"
		if perr := p.terminal(wire.KindSessionLost, "session "+sess.id+" ended: "+sess.ended); perr != nil {
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
