package testenv

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	natsdeploy "github.com/jazzmine/worker/deploy/nats"
)

// TenantsNATS starts an in-process NATS server with JetStream whose accounts are
// those `worker nats-auth` renders (natsdeploy.AuthConfig) for one worker identity
// and the tenants named. It returns the server's URL, the seed file of the worker's
// identity and those of the tenants' agents, by tenant. The server stops at the end
// of the test.
func TenantsNATS(t testing.TB, tenants ...string) (url, workerSeed string, seeds map[string]string) {
	t.Helper()
	seed, pub := UserKey(t)
	workerSeed = WriteSeed(t, seed)
	seeds = map[string]string{}
	var ts []natsdeploy.Tenant
	for _, name := range tenants {
		seed, pub := UserKey(t)
		seeds[name] = WriteSeed(t, seed)
		ts = append(ts, natsdeploy.Tenant{Name: name, Key: pub})
	}
	conf, err := natsdeploy.AuthConfig([]string{pub}, ts)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return AuthServer(t, file).ClientURL(), workerSeed, seeds
}

// AuthServer starts an in-process NATS server from the configuration file conf (an
// auth.conf, or a file that includes one), with JetStream, on a free loopback port;
// it stops at the end of the test.
func AuthServer(t testing.TB, conf string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("process %s: %v", conf, err)
	}
	opts.Host, opts.Port = "127.0.0.1", server.RANDOM_PORT
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	return srv
}

// UserKey returns a new user nkey's seed and public key.
func UserKey(t testing.TB) (seed []byte, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	if seed, err = kp.Seed(); err != nil {
		t.Fatal(err)
	}
	if pub, err = kp.PublicKey(); err != nil {
		t.Fatal(err)
	}
	return seed, pub
}

// WriteSeed writes seed to a file of its own, as `worker nkey` does, and returns its
// path: what `worker serve --nkey` and nats.NkeyOptionFromSeed take.
func WriteSeed(t testing.TB, seed []byte) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "user.seed")
	if err := os.WriteFile(file, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// ConnectSeed connects to url as the user of the nkey seed file, as `worker serve
// --nkey` does, with onErr (if not nil) as its asynchronous error handler; the
// connection closes at the end of the test.
func ConnectSeed(t testing.TB, url, seedFile string, onErr nats.ErrHandler) *nats.Conn {
	t.Helper()
	nkey, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nkey}
	if onErr != nil {
		opts = append(opts, nats.ErrorHandler(onErr))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect with the nkey of %s: %v", seedFile, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
