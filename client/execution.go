package client

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// Execution follows one submitted job: its events, in order, and its
// result. [Client.Submit] returns it; it is safe for concurrent use.
//
// A goroutine reads the execution's events, folds each into the result and
// hands it to the Events channel. It ends after the first script_done,
// whatever its attempt, or at [Execution.Close]. Close must be called (once
// the result is in is fine; [Client.Run] does it): until then the goroutine
// waits for someone to read the events.
//
// The events come by one of two paths, and nothing is lost between them:
//   - The fast path, a plain subscription to the execution's subjects, made
//     before the job is published. It costs the server nothing per
//     execution, and most executions end on it. It delivers an event only
//     when it is the next of its attempt (events carry a sequence number
//     per attempt).
//   - The events stream, through an ordered JetStream consumer that starts
//     at the execution's first event and survives reconnects and the loss of
//     the server that held it (Execution.resume). An execution
//     moves to it when the fast path skips a sequence number (a message
//     lost to a reconnect or a slow consumer), when the job was a duplicate
//     (its events may have been published before the subscription), or
//     when the execution has not ended within [Config.LiveWindow]. Events
//     the fast path delivered are not delivered again.
//
// There are two ways to read an execution, and they combine:
//   - [Execution.Wait] alone: it reads and discards the events and returns
//     the [Result].
//   - [Execution.Events] until the channel is closed, then Wait, which
//     returns the Result at once.
//
// The Result does not depend on who reads the events, but each event is
// received once: Wait called while another goroutine reads Events takes
// some of the events from that reader.
type Execution struct {
	// ID is the execution id, the job's ExecutionID (generated when the job
	// had none).
	ID string

	// Sandbox is the sandbox the job was submitted to.
	Sandbox string

	// Duplicate reports that the jobs stream dropped the job as a duplicate
	// of one published earlier with the same id: the execution follows the
	// earlier job's events.
	Duplicate bool

	c      *Client
	events chan *wire.Event

	// The fast path: nil when the client reads the stream from the start.
	// endLive ends it: at Close, on a duplicate, or when the window is over.
	live    *nats.Subscription
	liveCh  chan *nats.Msg
	liveCtx context.Context
	endLive context.CancelFunc

	closing   chan struct{} // closed by Close: the goroutine stops
	done      chan struct{} // closed when the goroutine has ended
	closeOnce sync.Once
	col       collector      // the goroutine's alone
	last      map[int]uint64 // the goroutine's alone: per attempt, the last seq delivered
	after     uint64         // the goroutine's alone: stream sequence of the last event read

	// mu guards the fields below. The goroutine sets cons and iter (the stream
	// path; resume replaces them) with it held, and reads them without it.
	mu     sync.Mutex
	cons   jetstream.Consumer
	iter   jetstream.MessagesContext
	result *Result // set by the script_done that ended the execution
	err    error   // why the execution ended without a result
}

func newExecution(c *Client, id, sandbox string) *Execution {
	return &Execution{
		ID:      id,
		Sandbox: sandbox,
		c:       c,
		events:  make(chan *wire.Event, eventsBuffer),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		col:     collector{id: id},
		last:    map[int]uint64{},
	}
}

// Events returns the channel of the execution's events, every event in the
// order it was published, decoded according to its Content-Type header
// (one that cannot be decoded is logged and skipped). Events of every
// attempt come through, including those of an attempt that a worker left
// unfinished. The channel is closed after the script_done that ends the
// execution, when the execution is closed, or when reading the events fails
// for good (the connection closed); [Execution.Wait] then says which. Every
// call returns the same channel.
func (e *Execution) Events() <-chan *wire.Event { return e.events }

// Wait reads the remaining events until the execution ends and returns its
// [Result]: that of the attempt whose script_done ended it. A script that
// failed is a Result with Success false, not an error. Once the execution
// has ended, Wait returns at once, and the same Result every time.
//
// Wait returns an error when ctx ends first (the execution goes on, and
// Wait may be called again), an error wrapping [ErrClosed] when the
// execution was closed before its script_done, and the error of nats.go
// when reading the events failed for good.
func (e *Execution) Wait(ctx context.Context) (*Result, error) {
	for {
		select {
		case _, ok := <-e.events:
			if !ok {
				return e.outcome()
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for execution %q: %w", e.ID, ctx.Err())
		}
	}
}

// outcome returns the result or the error the execution ended with. It is
// called once the events channel is closed.
func (e *Execution) outcome() (*Result, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.result != nil {
		return e.result, nil
	}
	return nil, e.err
}

// Cancel asks the workers to cancel the execution; see [Client.Cancel].
func (e *Execution) Cancel(ctx context.Context) error {
	return e.c.Cancel(ctx, e.ID)
}

// Close stops following the execution: it stops the goroutine that reads
// the events, closes the Events channel (if the execution has not ended)
// and deletes the events consumer on the server, if there is one. It does
// not cancel the job (see [Execution.Cancel]). Close is idempotent and safe
// to call from any goroutine; it returns once the goroutine has ended, which
// takes at most a few seconds when the server is unreachable, and up to
// about 20 s while the execution replaces a consumer lost with its server.
func (e *Execution) Close() {
	e.closeOnce.Do(func() {
		close(e.closing)
		e.leaveLive()
		e.mu.Lock()
		if e.iter != nil {
			e.iter.Stop()
		}
		e.mu.Unlock()
	})
	<-e.done
}

// leaveLive ends the fast path: the goroutine goes on with the stream, or
// stops if the execution is closing.
func (e *Execution) leaveLive() {
	if e.endLive != nil {
		e.endLive()
	}
}

// run reads the execution's events until the execution ends or is closed.
func (e *Execution) run() {
	defer close(e.done)
	err := e.read()
	if e.live != nil {
		_ = e.live.Unsubscribe()
		e.endLive()
	}
	e.mu.Lock()
	if e.iter != nil {
		e.iter.Stop()
	}
	if e.result == nil {
		e.err = err
	}
	e.mu.Unlock()
	close(e.events)
	if e.cons != nil {
		e.c.deleteConsumer(e.cons)
	}
}

// read hands the events to the Events channel until a script_done, and
// returns why it stopped without one: the fast path first, then the stream.
func (e *Execution) read() error {
	if e.live != nil {
		ended, err := e.readLive()
		if ended {
			return err
		}
		// Now, not at the end: a subscription nobody reads would fill its channel
		// and report a slow consumer on the connection.
		_ = e.live.Unsubscribe()
	}
	return e.readStream()
}

// readLive reads the fast path. It returns ended when the execution ended
// (its script_done, or Close) with why it ended without a result, or not
// ended when the stream must take over (a closed connection shows there).
func (e *Execution) readLive() (ended bool, err error) {
	for {
		var msg *nats.Msg
		select {
		case msg = <-e.liveCh:
		case <-e.liveCtx.Done():
			select {
			case <-e.closing:
				return true, e.closedError()
			default:
			}
			// The window is over, or a duplicate: the stream has it all. A closed
			// connection shows there too.
			e.c.log.Debug("jazzmine client: following the events stream", "execution_id", e.ID, "reason", context.Cause(e.liveCtx))
			return false, nil
		}
		ev, ok := e.decode(msg.Header.Get(wire.HeaderContentType), msg.Data, msg.Subject)
		if !ok {
			continue
		}
		if ev.Seq <= e.last[ev.Attempt] {
			continue // seen already
		}
		if ev.Seq != e.last[ev.Attempt]+1 {
			e.c.log.Debug("jazzmine client: an event was missed, following the events stream", "execution_id", e.ID, "attempt", ev.Attempt, "seq", ev.Seq)
			return false, nil
		}
		if done, err := e.deliver(ev); done {
			return true, err
		}
	}
}

// readStream reads the events stream from the execution's first event,
// skipping what the fast path delivered. Its consumer is made here, unless
// follow made it.
func (e *Execution) readStream() error {
	if e.iter == nil {
		ctx, cancel := context.WithTimeout(context.Background(), resumeTimeout)
		cons, iter, err := e.c.consume(ctx, e.ID)
		cancel()
		if err != nil {
			return fmt.Errorf("read the events of execution %q: %w", e.ID, err)
		}
		e.mu.Lock()
		e.cons, e.iter = cons, iter
		e.mu.Unlock()
	}
	select {
	case <-e.closing: // Close came before iter was set: it did not stop it
		return e.closedError()
	default:
	}
	for {
		msg, err := e.iter.Next()
		if err != nil {
			select {
			case <-e.closing:
				return e.closedError()
			default:
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) { // the connection closed
				return fmt.Errorf("read the events of execution %q: %w", e.ID, err)
			}
			// The consumer gave up recreating itself (consumerResetAttempts).
			if err := e.resume(err); err != nil {
				return err
			}
			continue
		}
		if meta, err := msg.Metadata(); err == nil {
			e.after = meta.Sequence.Stream
		}
		ev, ok := e.decode(msg.Headers().Get(wire.HeaderContentType), msg.Data(), msg.Subject())
		if !ok {
			continue
		}
		if ev.Seq != 0 && ev.Seq <= e.last[ev.Attempt] {
			continue // delivered by the fast path
		}
		if done, err := e.deliver(ev); done {
			return err
		}
	}
}

// decode decodes an event, or logs and skips it.
func (e *Execution) decode(contentType string, data []byte, subject string) (*wire.Event, bool) {
	ev, err := wire.DecodeEvent(contentType, data)
	if err != nil {
		e.c.log.Warn("jazzmine client: skipped an event that cannot be decoded", "execution_id", e.ID, "subject", subject, "error", err)
		return nil, false
	}
	return ev, true
}

// deliver folds ev into the result and hands it to the Events channel. It
// returns done at the script_done that ends the execution (err nil) or when
// the execution is closed.
func (e *Execution) deliver(ev *wire.Event) (done bool, err error) {
	e.last[ev.Attempt] = max(e.last[ev.Attempt], ev.Seq)
	res := e.col.add(ev)
	if res != nil {
		e.mu.Lock()
		e.result = res
		e.mu.Unlock()
	}
	select {
	case e.events <- ev:
	case <-e.closing:
		return true, e.closedError()
	}
	return res != nil, nil
}

func (e *Execution) closedError() error {
	return errorf(ErrClosed, "execution %q was closed before its script_done", e.ID)
}
