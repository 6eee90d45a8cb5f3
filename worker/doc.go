// Package worker owns the JetStream side of the product: streams and
// per-sandbox consumers, pull loops that take a free container slot before
// asking for one job, dispatch through the pool and the executor, event
// publishing, cancel, telemetry wiring and configuration.
package worker
