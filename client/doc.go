// Package client is the Go SDK for agents: submit a job, stream its events,
// wait for its result, cancel it. It speaks the NATS contract of package wire.
//
// A [Client] wraps a NATS connection the caller owns. [Client.Submit]
// publishes a [wire.Job] on jazzmine.exec.<sandbox> (stream JAZZMINE_EXEC)
// and returns an [Execution], which has already subscribed to the job's
// events on jazzmine.events.<execution_id>.> (stream JAZZMINE_EVENTS) with a
// JetStream ordered consumer, from the first event, so that none is missed,
// even across reconnects. [Execution.Events] streams the events;
// [Execution.Wait] returns the [Result] that the script_done event ends;
// [Execution.Cancel] asks the workers to cancel the job; [Execution.Close]
// stops following it. [Client.Run] does it all in one call. [Client.NewSession]
// runs calls that keep their state; [Client.Sandboxes] lists the sandboxes the
// fleet serves, with the tools a script may call there.
//
// The package does not create the streams: a worker does. Without them a
// submission fails with [ErrNoStream]; when the jobs stream's backlog is
// full, with [ErrBacklogFull].
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
