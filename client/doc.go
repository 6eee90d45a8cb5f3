// Package client is the Go SDK for agents: run Python on a jazzmine fleet, stream
// what it does, get back what it gave, cancel it. It speaks the NATS contract of
// package wire.
//
// [Connect] connects to the fleet's NATS server (or [New] takes a connection of
// the caller's). [Client.Run] runs a [wire.Job] and returns its [Result]: what
// the script printed, the value of its last line as IPython shows it
// ([Result.Value], and as a Go value with [Result.Decode]), its error with a
// hint, the files it left. A job with no Sandbox runs in [DefaultSandbox] and a
// job with no Mode in [wire.ModeInteractive], as a notebook cell does. When
// Run's context ends, the job is cancelled on the fleet.
//
// [Client.Submit] publishes a job on jazzmine.exec.<sandbox> (stream
// JAZZMINE_EXEC) and returns an [Execution] that follows its events on
// jazzmine.events.<execution_id>.>: through a plain subscription made before the
// job is published, the fast path, and from the events stream (JAZZMINE_EVENTS)
// through a JetStream consumer when an event's seq shows a gap, when the job
// was a duplicate, or after [Config.LiveWindow]; every event arrives once and in
// order either way, even across reconnects. [Execution.Events] streams the
// events, [Execution.Wait] returns the Result, [Execution.Cancel] cancels the
// job, and [Execution.Close] stops following it (Run does all of it).
//
// [Client.NewSession] runs calls that keep their state in one Python process;
// [Client.PutFile], [Client.InputFile] and [Client.Download] move files in and
// out; [Client.Sandboxes] lists the sandboxes the fleet serves, with what they
// have.
//
// The package does not create the streams: a worker does. Without them a
// submission fails with [ErrNoStream]; for a sandbox no worker of the fleet
// serves, the server refuses it at publish, with [ErrUnknownSandbox]; when the
// jobs stream's backlog is full, with [ErrBacklogFull].
//
// A job may be delivered more than once (a worker died mid-job); each
// attempt's events carry its number, and the Result is that of the attempt
// whose script_done ended the execution. Retrying Submit with the same
// ExecutionID within the jobs stream's duplicate window is safe: the server
// drops the duplicate and the new Execution follows the first job.
//
// Trace context: when the context given to Submit or Cancel carries an
// OpenTelemetry span, the global propagator (otel.GetTextMapPropagator)
// writes it into the message's headers (traceparent and tracestate with the
// W3C propagator). It writes nothing until the program configures one.
//
// The package knows neither Docker nor the workers' internals; it imports
// wire, nats.go and the OpenTelemetry API.
package client
