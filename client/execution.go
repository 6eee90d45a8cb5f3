package client

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/wire"
)

// Execution follows one submitted job: its events, in order, and its
// result. [Client.Submit] returns it; it is safe for concurrent use.
//
// A goroutine reads the execution's events from JetStream (an ordered
// consumer on JAZZMINE_EVENTS that starts at the execution's first event
// and survives reconnects and the loss of the server that held it), folds
// each into the result and hands it to the Events channel. It ends after
// the first script_done, whatever its attempt, or at [Execution.Close].
// Close must be called (once the result is in is fine; [Client.Run] does
// it): until then the goroutine waits for someone to read the events.
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

	closing   chan struct{} // closed by Close: the goroutine stops
	done      chan struct{} // closed when the goroutine has ended
	closeOnce sync.Once
	col       collector // the goroutine's alone
	after     uint64    // the goroutine's alone: stream sequence of the last event read

	// mu guards the fields below. The goroutine sets cons and iter (resume
	// replaces them) with it held, and reads them without it.
	mu     sync.Mutex
	cons   jetstream.Consumer
	iter   jetstream.MessagesContext
	result *Result // set by the script_done that ended the execution
	err    error   // why the execution ended without a result
}

func newExecution(c *Client, id, sandbox string, cons jetstream.Consumer, iter jetstream.MessagesContext) *Execution {
	return &Execution{
		ID:      id,
		Sandbox: sandbox,
		c:       c,
		cons:    cons,
		iter:    iter,
		events:  make(chan *wire.Event, eventsBuffer),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		col:     collector{id: id},
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
// and deletes the events consumer on the server. It does not cancel the job
// (see [Execution.Cancel]). Close is idempotent and safe to call from any
// goroutine; it returns once the goroutine has ended, which takes at most a
// few seconds when the server is unreachable, and up to about 20 s while the
// execution replaces a consumer lost with its server.
func (e *Execution) Close() {
	e.closeOnce.Do(func() {
		close(e.closing)
		e.mu.Lock()
		iter := e.iter
		e.mu.Unlock()
		iter.Stop() // a consumer that resume opens from now on, resume stops
	})
	<-e.done
}

// run reads the execution's events until the execution ends or is closed.
func (e *Execution) run() {
	defer close(e.done)
	err := e.read()
	e.iter.Stop()
	e.mu.Lock()
	if e.result == nil {
		e.err = err
	}
	e.mu.Unlock()
	close(e.events)
	e.c.deleteConsumer(e.cons)
}

// read hands the events to the Events channel until a script_done, and
// returns why it stopped without one.
func (e *Execution) read() error {
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
		ev, err := wire.DecodeEvent(msg.Headers().Get(wire.HeaderContentType), msg.Data())
		if err != nil {
			e.c.log.Warn("jazzmine client: skipped an event that cannot be decoded", "execution_id", e.ID, "subject", msg.Subject(), "error", err)
			continue
		}
		res := e.col.add(ev)
		if res != nil {
			e.mu.Lock()
			e.result = res
			e.mu.Unlock()
		}
		select {
		case e.events <- ev:
		case <-e.closing:
			return e.closedError()
		}
		if res != nil {
			return nil
		}
	}
}

func (e *Execution) closedError() error {
	return errorf(ErrClosed, "execution %q was closed before its script_done", e.ID)
}
