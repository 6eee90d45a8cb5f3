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

// The opener of a sandbox's sessions (see session.go) sees every call once, and is
// what answers for the calls of a session whose owner died. It holds calls (a nak,
// looked at again later) rather than watching every one until it has its end, which
// made one session's thousands of queued calls keep the sandbox's other sessions from
// opening. A call of a live session is acked by the opener when
//
//   - its owner has acked the call, and with it every call before it (the session's
//     consumer's ack floor), or
//   - the opener holds a later call of the session: held calls answer for the calls
//     before them, as that later call is itself acked only by one of these rules.
//
// A call of an ended session is answered with session_lost and acked once every call
// the session left has its end (the entry's Answered): its end answers them (finish),
// from the first call its owner had not acked. An end cut short (its worker died or
// shut down during it) is finished by the opener that holds one of its calls. So the
// opener holds about one call of each session, the last it has seen, and a session's
// queue costs it two looks at each call.

// A view is what an opener knows of a session: its entry, and its owner's ack floor.
type view struct {
	entry   *sessionEntry
	rev     uint64
	written time.Time // of the entry
	floor   uint64    // the owner has acked every call up to this stream sequence
	known   bool      // floor was read from the owner's consumer
	held    uint64    // the latest call this opener held (nakked) of the session
	read    time.Time // when entry and floor were read
	// readAfter: every call up to this stream sequence was stored before the read.
	readAfter uint64
}

// views are an opener's views, by session key. A view's entry and floor are read
// again once older than viewAge, or when what the opener does depends on their being
// current: a floor only grows and an ended entry stays ended, so an older view may
// hold a call but never acks one it should not.
type views struct {
	m    map[string]*view
	seen uint64 // the latest stream sequence the opener has been handed
}

const (
	viewAge  = 250 * time.Millisecond
	viewsMax = 4096 // past it, views start over
	// endStall is how long an ended session may go without its calls' being answered
	// before an opener finishes its end for it.
	endStall = 30 * time.Second
)

// open is an opener loop: one call at a time of the sandbox's sessions.
func (s *sessions) open(ctx context.Context, sandbox string, cons jetstream.Consumer) {
	defer s.loops.Done()
	if !s.gates.wait(ctx, sandbox) {
		return
	}
	vs := &views{m: map[string]*view{}}
	pullEach(ctx, cons, s.log.With("sandbox", sandbox), "a session call", func(msg jetstream.Msg) { s.see(ctx, sandbox, msg, vs) })
}

// view returns the opener's view of session id, read again when it is older than
// viewAge or current is set. A session with no entry has no view kept.
func (s *sessions) view(ctx context.Context, id sessionRef, vs *views, current bool) (*view, error) {
	v := vs.m[id.key()]
	if v != nil && !current && time.Since(v.read) < viewAge {
		return v, nil
	}
	entry, rev, written, err := s.entry(ctx, id)
	if err != nil {
		return nil, err
	}
	if v == nil {
		v = &view{}
	}
	v.entry, v.rev, v.written, v.read, v.readAfter = entry, rev, written, time.Now(), vs.seen
	if entry != nil && entry.State == sessionOpen {
		if c, err := s.js.Consumer(ctx, wire.StreamSessions, id.consumer()); err == nil {
			v.floor, v.known = max(v.floor, c.CachedInfo().AckFloor.Stream), true
		}
	}
	if entry != nil {
		if len(vs.m) >= viewsMax {
			clear(vs.m)
		}
		vs.m[id.key()] = v
	}
	return v, nil
}

// see decides what the opener does with a call: a call of an unknown session opens
// it; a call of an open session is its owner's to run, and the opener holds it until
// one of the rules above acks it, or ends the session if its owner died; a call of an
// ended session gets session_lost.
func (s *sessions) see(ctx context.Context, sandbox string, msg jetstream.Msg, vs *views) {
	tenant, _, sid, err := wire.ParseSessionSubject(msg.Subject())
	id := sessionRef{tenant, sid}
	meta, merr := msg.Metadata()
	if err != nil || merr != nil {
		// A subject that names no session (a tenant's literal '*' token): nobody will
		// ever run it, and it would hold room in the stream until its max age.
		s.done(msg)
		return
	}
	seq := meta.Sequence.Stream
	vs.seen = max(vs.seen, seq)
	// Nothing is ever published under a call with no valid id (decode owns none): it
	// opens no session and has no end; its owner refuses it.
	key := msg.Headers().Get(wire.HeaderMsgID)
	valid := wire.ValidateID("execution id", key) == nil
	if refused := refusedToTenants(s.cfg.sandbox(sandbox)); tenant != "" && refused != nil {
		s.answerDone(sandbox, msg, wire.KindInvalidJob, refused.Error()) // no tenant's session of it is ever opened
		return
	}
	v, err := s.view(ctx, id, vs, false)
	if err == nil && v.entry != nil && v.entry.State == sessionOpen && v.held > seq && v.floor < seq && seq > v.readAfter {
		// Acked on a later call only if stored while the session was open: then its
		// end's answers cover it, should it end.
		v, err = s.view(ctx, id, vs, true)
	}
	if err != nil {
		s.log.Warn("look up a session", "session_id", id.key(), "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	entry := v.entry
	switch {
	case entry == nil && !valid:
		s.done(msg)
		return
	case entry == nil:
		switch answered, err := s.events.ended(ctx, execRef{tenant, key}.key()); {
		case err != nil:
			_ = msg.NakWithDelay(time.Second) // not claimed on a guess: it may have run
		case answered:
			s.done(msg) // cancelled while queued (cancel.go)
		default:
			s.claim(ctx, sandbox, id, msg, meta, vs)
		}
		return
	case entry.Sandbox != sandbox:
		s.answerDone(sandbox, msg, wire.KindInvalidJob, fmt.Sprintf("session %s is a session of sandbox %s, not %s: a session id is one session's, use a new one", id.id, entry.Sandbox, sandbox))
		return
	case entry.State == sessionOpen && v.floor >= seq:
		s.done(msg) // its owner ran it
		return
	case entry.State == sessionOpen && v.held > seq:
		_ = msg.Ack() // a later call held answers for it; its owner runs it
		return
	case entry.State == sessionOpen && s.alive(entry, id, v.written):
		s.hold(msg, meta, v)
		return
	case entry.State == sessionOpen:
		if v, err = s.view(ctx, id, vs, true); err == nil && v.entry != nil && v.entry.State == sessionOpen && v.floor < seq && !s.alive(v.entry, id, v.written) {
			s.endDead(ctx, sandbox, id, v)
		}
		s.hold(msg, meta, v) // looked at again, in whatever state the session is now
		return
	}
	if valid {
		if err := s.answer(sandbox, msg, wire.KindSessionLost, fmt.Sprintf("session %s ended: %s", id.id, entry.Reason)); err != nil {
			_ = msg.NakWithDelay(time.Second)
			return
		}
	}
	if entry.Answered || v.held > seq {
		s.done(msg)
		return
	}
	if time.Since(v.written) > endStall {
		s.finishLater(ctx, sandbox, id, entry)
	}
	s.hold(msg, meta, v)
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

// hold looks at the call again later, and notes it held.
func (s *sessions) hold(msg jetstream.Msg, meta *jetstream.MsgMetadata, v *view) {
	v.held = max(v.held, meta.Sequence.Stream)
	_ = msg.NakWithDelay(watchDelay(meta))
}

// watchDelay is how long the opener waits before it looks at a held call again:
// 100 ms, then longer the more often it has looked, up to 5 s.
func watchDelay(meta *jetstream.MsgMetadata) time.Duration {
	return min(time.Duration(meta.NumDelivered)*100*time.Millisecond, 5*time.Second)
}

// endDead ends the open session of view v, whose owner died, and finishes its end in
// the background.
func (s *sessions) endDead(ctx context.Context, sandbox string, id sessionRef, v *view) {
	e := &sessionEntry{Worker: v.entry.Worker, Sandbox: sandbox, State: sessionEnded, Reason: fmt.Sprintf("its worker %s died", v.entry.Worker)}
	if v.known {
		e.From = v.floor + 1
	}
	if _, err := s.kv.Update(ctx, id.key(), mustJSON(e), v.rev); err != nil {
		return // someone else changed it: the next look sees what
	}
	s.finishLater(ctx, sandbox, id, e)
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
// session is held as any other.
func (s *sessions) claim(ctx context.Context, sandbox string, id sessionRef, msg jetstream.Msg, meta *jetstream.MsgMetadata, vs *views) {
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
	if err := s.begin(ctx, sandbox, id, rev); err != nil {
		s.log.Warn("open a session", "session_id", id.key(), "sandbox", sandbox, "err", err)
		answered := s.answer(sandbox, msg, wire.KindInfrastructure, fmt.Sprintf("session %s could not be opened: %v", id.id, err))
		s.end(context.Background(), &session{ref: id, sandbox: sandbox}, "it could not be opened: "+err.Error())
		if answered != nil {
			_ = msg.NakWithDelay(time.Second) // session_lost on the next look
			return
		}
		s.done(msg)
		return
	}
	if v, err := s.view(ctx, id, vs, true); err == nil {
		s.hold(msg, meta, v)
		return
	}
	_ = msg.NakWithDelay(watchDelay(meta))
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
