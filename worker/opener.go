package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// The opener of a sandbox's sessions (see session.go) sees every call once, on one
// worker, and routes it once:
//
//   - a call of a session nobody holds opens it there (claim);
//   - a call of an open session is acked as soon as the session's own consumer
//     exists: that consumer has the call, and its owner runs it, or the session's
//     end answers it (the end deletes the consumer before it reads what is left);
//   - a call of an ended session is answered with session_lost.
//
// What a dead owner or an end cut short leaves is the rescuer's (rescuer.go), on a
// timer, not the opener's: the opener holds no call and keeps no view of a session.

// endStall is how long an ended session may go without its calls' being answered
// before a rescuer finishes its end for it.
const endStall = 30 * time.Second

// open is an opener loop: one call at a time of the sandbox's sessions.
func (s *sessions) open(ctx context.Context, sandbox string, cons jetstream.Consumer) {
	defer s.loops.Done()
	if !s.gates.wait(ctx, sandbox) {
		return
	}
	pullEach(ctx, cons, s.log.With("sandbox", sandbox), "a session call", func(msg jetstream.Msg) { s.see(ctx, sandbox, msg) })
}

// see routes a call: a call of an unknown session opens it; a call of an open
// session is its owner's to run; a call of an ended session gets session_lost.
func (s *sessions) see(ctx context.Context, sandbox string, msg jetstream.Msg) {
	tenant, _, sid, err := wire.ParseSessionSubject(msg.Subject())
	id := sessionRef{tenant, sid}
	meta, merr := msg.Metadata()
	if err != nil || merr != nil {
		// A subject that names no session (a tenant's literal '*' token): nobody will
		// ever run it, and it would hold room in the stream until its max age.
		s.done(msg)
		return
	}
	// Nothing is ever published under a call with no valid id (decode owns none): it
	// opens no session and has no end; its owner refuses it.
	key := msg.Headers().Get(wire.HeaderMsgID)
	valid := wire.ValidateID("execution id", key) == nil
	if refused := refusedToTenants(s.cfg.sandbox(sandbox)); tenant != "" && refused != nil {
		s.answerDone(sandbox, msg, wire.KindInvalidJob, refused.Error()) // no tenant's session of it is ever opened
		return
	}
	entry, _, _, err := s.entry(ctx, id)
	if err != nil {
		s.log.Warn("look up a session", "session_id", id.key(), "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	switch {
	case entry == nil && !valid:
		s.done(msg)
	case entry == nil:
		switch answered, err := s.events.ended(ctx, execRef{tenant, key}.key()); {
		case err != nil:
			_ = msg.NakWithDelay(time.Second) // not claimed on a guess: it may have run
		case answered:
			s.done(msg) // cancelled while queued (cancel.go)
		default:
			s.claim(ctx, sandbox, id, msg, meta)
		}
	case entry.Sandbox != sandbox:
		s.answerDone(sandbox, msg, wire.KindInvalidJob, fmt.Sprintf("session %s is a session of sandbox %s, not %s: a session id is one session's, use a new one", id.id, entry.Sandbox, sandbox))
	case entry.State == sessionOpen:
		s.handOn(ctx, id, msg, meta)
	case valid:
		s.answerDone(sandbox, msg, wire.KindSessionLost, fmt.Sprintf("session %s ended: %s", id.id, entry.Reason))
	default:
		s.done(msg)
	}
}

// handOn acks a call of open session id once the session's consumer exists. The
// consumer then has the call, stored before it was looked up: its owner runs it, or
// the session's end answers it, as the end deletes the consumer before it answers
// what the session left. Until the consumer exists (the session being opened by
// another worker, or its end begun) the call is looked at again a little later,
// when its entry may say ended.
func (s *sessions) handOn(ctx context.Context, id sessionRef, msg jetstream.Msg, meta *jetstream.MsgMetadata) {
	_, err := s.js.Consumer(ctx, wire.StreamSessions, id.consumer())
	switch {
	case err == nil:
		_ = msg.Ack()
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		_ = msg.NakWithDelay(lookAgain(meta))
	default:
		s.log.Warn("look up a session's consumer", "session_id", id.key(), "err", err)
		_ = msg.NakWithDelay(time.Second)
	}
}

// lookAgain is how long the opener waits before it looks at a call again: 100 ms,
// then longer the more often it has looked, up to 5 s.
func lookAgain(meta *jetstream.MsgMetadata) time.Duration {
	return min(time.Duration(meta.NumDelivered)*100*time.Millisecond, 5*time.Second)
}

// answerDone answers the call (see answer) and, once it has its end, is done with it.
func (s *sessions) answerDone(sandbox string, msg jetstream.Msg, kind, text string) {
	if err := s.answer(sandbox, msg, kind, text); err != nil {
		_ = msg.NakWithDelay(time.Second) // answered on the next look
		return
	}
	s.done(msg)
}

// done deletes a call that is done with, run or answered, from the sessions stream,
// which holds the calls that wait (its bounds refuse new calls rather than drop
// waiting ones), and acks it; a call that could not be deleted comes back to be
// deleted (it would hold its room until the stream's max age).
func (s *sessions) done(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.stream.DeleteMsg(ctx, meta.Sequence.Stream); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		s.log.Debug("drop a session call", "seq", meta.Sequence.Stream, "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}

// dropThrough deletes, from the sessions stream, the calls of session h up to msg,
// which its owner has just acked: the owner runs them in order, so every one is done
// with. A deletion that failed before is made up for here, or by the session's end.
func (s *sessions) dropThrough(h *session, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.purge(ctx, h.sandbox, h.ref, meta.Sequence.Stream); err != nil {
		s.log.Debug("drop a session's calls", "session_id", h.ref.key(), "through", meta.Sequence.Stream, "err", err)
	}
}

// purge deletes the calls of session id up to stream sequence through.
func (s *sessions) purge(ctx context.Context, sandbox string, id sessionRef, through uint64) error {
	return s.stream.Purge(ctx, jetstream.WithPurgeSubject(id.subject(sandbox)), jetstream.WithPurgeSequence(through+1))
}

// finishLater runs finish in the background, once at a time per session on this
// worker, until it is done or ctx ends.
func (s *sessions) finishLater(ctx context.Context, sandbox string, id sessionRef, e *sessionEntry) {
	s.mu.Lock()
	if s.finishing[id.key()] || s.stopped {
		s.mu.Unlock()
		return
	}
	s.finishing[id.key()] = true
	s.loops.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.loops.Done()
		if err := s.finish(ctx, sandbox, id, e); err != nil && ctx.Err() == nil {
			s.log.Warn("answer the calls an ended session left", "session_id", id.key(), "err", err)
		}
		s.mu.Lock()
		delete(s.finishing, id.key())
		s.mu.Unlock()
	}()
}

// finish ends what the ended session e left: its consumer is deleted (an owner
// wrongly found dead takes no more calls), every call it left gets session_lost
// (answerAll) and its entry then says so (Answered). Anyone may finish an end, as
// often as it takes: a call with an end is not answered again.
func (s *sessions) finish(ctx context.Context, sandbox string, id sessionRef, e *sessionEntry) error {
	if err := s.js.DeleteConsumer(ctx, wire.StreamSessions, id.consumer()); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete the session's consumer: %w", err)
	}
	through, err := s.answerAll(ctx, sandbox, id, e.Reason, e.From)
	if err != nil {
		return err
	}
	if err := s.answered(ctx, id); err != nil {
		return err
	}
	// The calls run or answered are dropped; those stored after them are the opener's.
	if through > 0 {
		if err := s.purge(ctx, sandbox, id, through); err != nil {
			return fmt.Errorf("drop the session's answered calls: %w", err)
		}
	}
	return nil
}

// answered says in ended session id's entry that every call it left has its end.
func (s *sessions) answered(ctx context.Context, id sessionRef) error {
	for range 3 {
		cur, rev, _, err := s.entry(ctx, id)
		if err != nil || cur == nil || cur.State != sessionEnded || cur.Answered {
			return err
		}
		cur.Answered = true
		if _, err := s.kv.Update(ctx, id.key(), mustJSON(cur), rev); err == nil {
			return nil
		}
	}
	return errors.New("say the session's calls are answered: its entry kept changing")
}

// answerAll answers with session_lost every call of session id stored so far that
// has no end, from stream sequence from, and returns the sequence through which every
// call of the session is done with, run or answered (0 for none). With no from (0:
// the entry did not know the owner's ack floor), from the first, but for calls older
// than the events' age: they ran or were answered long since, and their events may
// be gone.
func (s *sessions) answerAll(ctx context.Context, sandbox string, id sessionRef, reason string, from uint64) (uint64, error) {
	text := fmt.Sprintf("session %s ended: %s", id.id, reason)
	through := max(from, 1) - 1 // its owner acked the calls before from
	var aerr error
	_, err := scan(ctx, s.stream, id.subject(sandbox), from, math.MaxInt, func(m *jetstream.RawStreamMsg) bool {
		if from > 0 || time.Since(m.Time) < s.cfg.EventsMaxAge {
			if aerr = s.answer(sandbox, storedMsg{m}, wire.KindSessionLost, text); aerr != nil {
				return false
			}
		}
		through = m.Sequence
		return true
	})
	if err = errors.Join(err, aerr); err != nil {
		return 0, fmt.Errorf("answer the calls: %w", err)
	}
	return through, nil
}

// claim opens session id here for its first call msg, or, at this worker's limits,
// leaves it to another worker (a nak) until the last delivery, which answers the call
// with session_limit and ends the session before it began. The call that opened the
// session is acked once the session's consumer, which starts at its first call, exists.
func (s *sessions) claim(ctx context.Context, sandbox string, id sessionRef, msg jetstream.Msg, meta *jetstream.MsgMetadata) {
	last := int(meta.NumDelivered) >= s.cfg.MaxDeliver
	if full := s.reserve(sandbox, id); full != "" {
		s.log.Debug("no room for a session here", "session_id", id.key(), "sandbox", sandbox, "limit", full, "last_delivery", last)
		if !last {
			_ = msg.NakWithDelay(200 * time.Millisecond)
			return
		}
		// Answered: no call of the session was acked before it was claimed. Another
		// worker may have ended or claimed it meanwhile: the next look reads which.
		reason := "no worker had room for it (session limits: the last worker asked " + full + ")"
		if _, err := s.kv.Create(ctx, id.key(), mustJSON(&sessionEntry{Worker: s.cfg.WorkerID, Sandbox: sandbox, State: sessionEnded, Reason: reason, Answered: true})); err != nil {
			_ = msg.NakWithDelay(50 * time.Millisecond)
			return
		}
		s.answerDone(sandbox, msg, wire.KindSessionLimit, fmt.Sprintf("session %s could not be opened: %s", id.id, reason))
		return
	}
	rev, err := s.kv.Create(ctx, id.key(), mustJSON(&sessionEntry{Worker: s.cfg.WorkerID, Sandbox: sandbox, State: sessionOpen}))
	if err != nil {
		s.mu.Lock()
		delete(s.held, id.key()) // its reservation
		s.mu.Unlock()
		if !errors.Is(err, jetstream.ErrKeyExists) {
			s.log.Warn("claim a session", "session_id", id.key(), "err", err)
		}
		_ = msg.NakWithDelay(50 * time.Millisecond) // another worker claimed it first: see it again
		return
	}
	// Its entry is written from now on, so that the fleet does not take a session
	// waiting for a container for one whose owner died.
	h := &session{ref: id, sandbox: sandbox, taken: make(chan string, 1), stopTouch: make(chan struct{})}
	s.loops.Add(1)
	go s.touch(h, rev, h.stopTouch)
	if err := s.begin(ctx, h); err != nil {
		close(h.stopTouch)
		s.log.Warn("open a session", "session_id", id.key(), "sandbox", sandbox, "err", err)
		answered := s.answer(sandbox, msg, wire.KindInfrastructure, fmt.Sprintf("session %s could not be opened: %v", id.id, err))
		s.end(context.Background(), h, "it could not be opened: "+err.Error())
		if answered != nil {
			_ = msg.NakWithDelay(time.Second) // session_lost on the next look
			return
		}
		s.done(msg)
		return
	}
	_ = msg.Ack() // the session's consumer, from its first call, has it
}

// reserve says why this worker may not open session id of sandbox now ("held 4
// sessions of sandbox py, its limit"), or "" and holds its room in s.held until begin
// puts the session there or the claim fails: another opener's claim meanwhile counts
// it (two openers of a worker both passed the check, each counting what was held).
func (s *sessions) reserve(sandbox string, id sessionRef) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return "was stopping"
	}
	if len(s.held) >= s.cfg.MaxSessions {
		return fmt.Sprintf("held %d sessions, its limit", len(s.held))
	}
	sb := s.cfg.sandbox(sandbox)
	n, ofTenant, ofTenantHere := 0, 0, 0
	for _, h := range s.held {
		mine := id.tenant != "" && h.ref.tenant == id.tenant
		if mine {
			ofTenant++
		}
		if h.sandbox == sandbox {
			n++
			if mine {
				ofTenantHere++
			}
		}
	}
	switch {
	case n >= sb.MaxSessions:
		return fmt.Sprintf("held %d sessions of sandbox %s, its limit", n, sandbox)
	case id.tenant != "" && ofTenantHere >= sb.TenantSessions:
		return fmt.Sprintf("held %d sessions of sandbox %s of this tenant, its limit for one tenant", ofTenantHere, sandbox)
	case id.tenant != "" && ofTenant >= tenantShare(s.cfg.MaxSessions):
		return fmt.Sprintf("held %d sessions of this tenant, its limit for one tenant", ofTenant)
	}
	s.held[id.key()] = &session{ref: id, sandbox: sandbox}
	return ""
}
