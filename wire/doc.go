// Package wire owns the messages that cross NATS: the [Job] an agent publishes,
// the [Event] a worker publishes for each step of an execution, their msgpack
// and JSON encodings (chosen by the Content-Type header), their validation, and
// the subject, stream, consumer and header names of the NATS contract, and the
// entries of the fleet's sandbox catalog ([SandboxInfo], [SandboxesBucket]).
//
// Identifiers that become subject tokens (sandbox names, execution ids) are
// validated here ([ValidateID]), so nothing unvalidated ever reaches a subject.
//
// # Encodings
//
// Both encodings use the same snake_case field names and carry the same
// values: msgpack (the default, [ContentTypeMsgpack]) and JSON
// ([ContentTypeJSON]). [DecodeJob] and [DecodeEvent] are strict where a
// mistake would otherwise pass silently and lenient where the protocol must
// grow: a body must be a map (an object), fields must have their types,
// strings must be UTF-8, and nothing may follow the message, but unknown
// fields are ignored. Their errors wrap [ErrMalformed] and say which encoding
// failed and, where it can, which field. A msgpack message is checked as a
// whole before it is decoded, so that lengths it announces but does not hold
// are never allocated, and nesting is bounded as encoding/json bounds it.
//
// An event's time is an RFC 3339 string in both encodings, and its data is
// JSON-like values in both (see [Event]), so an event decoded from one
// encoding encodes in the other without loss.
//
// The package knows neither Docker nor NATS connections; it imports only the
// standard library and msgpack.
package wire
