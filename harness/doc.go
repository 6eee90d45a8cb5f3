// Package harness owns the in-container Python harness and the Go side of its
// protocol.
//
// The harness (the Python package jazzmine_harness, embedded with go:embed and
// exposed as [Source]; [Command] starts it) is the long-lived process inside
// every sandbox container. It reads one JSON request a line on stdin (execute,
// cancel, reset, ping) and writes one JSON event a line on stdout. Each execute
// runs in a process forked from a zygote, so nothing a script does survives into
// the next execution. In a container the harness is PID 1 and the only holder of
// the stream.
//
// The host trusts the stream only as answers to what it asked: every request
// carries a nonce that the harness echoes in script_done, reset_done and pong and
// never passes to a script, and any other line is an [ErrProtocol], after which
// the container is retired (docs/SECURITY.md, the trust model).
//
// [Executor] sends one request over any reader/writer pair (a container's
// attached stream or a local python3 process) and collects that execution's
// events under limits: a wall-clock deadline (timeout plus a buffer) and a
// maximum number of output bytes.
//
// The event types and error kinds it shares with the worker are wire's; the
// protocol's own (ready, reset_done, pong) are here. A test holds the Python
// harness's names to both.
//
// The package knows neither Docker nor NATS; it imports only the standard
// library and wire, for those names.
package harness
