package worker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// TestTheStreamsTakeMoreConsumersThanTheServersDefault: every open session is a
// consumer of the sessions stream, and every execution read after the client's live
// window one of the events stream. nats-server caps a stream that sets no bound at
// 1,000 consumers, so without a bound of the worker's the fleet's 1,000th open session
// failed with "maximum consumers limit reached" (BenchmarkScale, 1,000 sessions).
func TestTheStreamsTakeMoreConsumersThanTheServersDefault(t *testing.T) {
	_, nc := testenv.NATS(t)
	startBareWorker(t, nc, nil, nil)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for stream, filter := range map[string]func(i int) string{
		wire.StreamSessions: func(i int) string { return fmt.Sprintf("jazzmine.session.default.s%d", i) },
		wire.StreamEvents:   func(i int) string { return wire.EventsWildcard(fmt.Sprintf("e%d", i)) },
	} {
		for i := range 1_001 {
			if _, err := js.CreateConsumer(t.Context(), stream, jetstream.ConsumerConfig{
				Durable: fmt.Sprintf("c%d", i), FilterSubject: filter(i), AckPolicy: jetstream.AckExplicitPolicy, MemoryStorage: true,
			}); err != nil {
				t.Fatalf("stream %s: consumer %d: %v", stream, i+1, err)
			}
		}
	}
}

// TestAWorkerStartsInAnAccountThatBoundsItsConsumers: a stream's bound may not exceed
// its account's, which then replaces the server's default: in an account with a bound
// the worker sets none of its own (a bound of a million failed the streams' creation
// there), and the account's applies.
func TestAWorkerStartsInAnAccountThatBoundsItsConsumers(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "server.conf")
	if err := os.WriteFile(conf, []byte(`accounts: { FLEET: { jetstream: { max_consumers: 5000 }, users: [ { user: w, password: w } ] } }`), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := testenv.AuthServer(t, conf)
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("w", "w"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	startBareWorker(t, nc, nil, nil)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1_001 {
		if _, err := js.CreateConsumer(t.Context(), wire.StreamSessions, jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("c%d", i), FilterSubject: fmt.Sprintf("jazzmine.session.default.s%d", i), MemoryStorage: true,
		}); err != nil {
			t.Fatalf("consumer %d: %v", i+1, err)
		}
	}
}
