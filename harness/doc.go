// Package harness owns the in-container Python harness and the Go side of its
// protocol.
//
// The harness (executor_harness.py, embedded with go:embed and exposed as
// [Script]) is the long-lived process inside every sandbox container. It reads
// one JSON request a line on stdin (execute, cancel, reset, ping) and writes one
// JSON event a line on stdout. Each execute runs in a forked child of the
// harness, so nothing a script does survives into the next execution.
//
// [Executor] sends one request over any reader/writer pair (a container's
// attached stream or a local python3 process) and collects that execution's
// events under limits: a wall-clock deadline (timeout plus a buffer) and a
// maximum number of output bytes.
//
// The package knows neither Docker nor NATS; it imports only the standard
// library.
package harness
