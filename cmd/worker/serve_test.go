package main

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestStartTriesAgainOnlyWhileJetStreamIsNotReady(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("worker: create or update stream JAZZMINE_EXEC: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"a request that timed out is tried again", wrap(context.DeadlineExceeded), true},
		{"a request nobody answered is tried again", wrap(nats.ErrNoResponders), true},
		{"a server without a meta leader yet is tried again", wrap(jetstream.ErrJetStreamNotEnabled), true},
		{"a 503 of a group electing its leader is tried again", wrap(&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true},
		{"a config the server refuses ends the start", wrap(&jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use with a different configuration"}), false},
		{"a cancelled start ends", wrap(context.Canceled), false},
		{"any other error ends the start", errors.New("worker: invalid config"), false},
	} {
		if got := jetStreamNotReady(tc.err); got != tc.want {
			t.Errorf("%s: jetStreamNotReady(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
