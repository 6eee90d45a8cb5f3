// Package client is the Go SDK for agents: submit a job, stream its events,
// wait for its result, cancel it. It speaks the NATS contract of package wire.
package client
