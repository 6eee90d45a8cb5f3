package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestOnlyTransientFailuresAreTriedAgain(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("event of x not stored: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"an ack that did not come in time", fmt.Errorf("wait for event acks of x: %w", context.DeadlineExceeded), true},
		{"an ack that nats.go gave up waiting for", wrap(jetstream.ErrAsyncPublishTimeout), true},
		{"a stream without a leader (no responders)", wrap(jetstream.ErrNoStreamResponse), true},
		{"a stream that answers 503", wrap(&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true},
		{"a send while too many acks are outstanding", jetstream.ErrTooManyStalledMsgs, true},
		{"a send while the reconnect buffer is full", nats.ErrReconnectBufExceeded, true},
		{"a message too large for the server", wrap(nats.ErrMaxPayload), false},
		{"a stream that refuses the message", wrap(&jetstream.APIError{Code: 400, ErrorCode: 10054, Description: "maximum message size exceeded"}), false},
		{"a closed connection", wrap(nats.ErrConnectionClosed), false},
		{"a server without a meta leader yet", wrap(jetstream.ErrJetStreamNotEnabled), true},
		{"a request nobody answered", wrap(nats.ErrNoResponders), true},
		{"a config the server refuses", wrap(&jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use with a different configuration"}), false},
		{"a cancelled request", wrap(context.Canceled), false},
		{"anything else", errors.New("boom"), false},
	} {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
