package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/nats-io/nats.go"
)

// natsAuth is how the binary proves who it is to a NATS server: a credentials file
// (a user JWT and its nkey seed, as `nsc` makes them), or an nkey seed file, and TLS.
// Each flag defaults to the environment variable the `nats` CLI reads.
type natsAuth struct {
	creds, nkey            string
	tlsCA, tlsCert, tlsKey string
}

// addNATSAuthFlags adds --creds, --nkey, --tls-ca, --tls-cert and --tls-key to fs.
func addNATSAuthFlags(fs *flag.FlagSet, getenv func(string) string) *natsAuth {
	a := &natsAuth{}
	fs.StringVar(&a.creds, "creds", getenv("NATS_CREDS"), "NATS credentials file: user JWT and seed (env NATS_CREDS)")
	fs.StringVar(&a.nkey, "nkey", getenv("NATS_NKEY"), "NATS user nkey seed file (env NATS_NKEY)")
	fs.StringVar(&a.tlsCA, "tls-ca", getenv("NATS_CA"), "CA certificates that sign the NATS server's (env NATS_CA)")
	fs.StringVar(&a.tlsCert, "tls-cert", getenv("NATS_CERT"), "client certificate for NATS (env NATS_CERT)")
	fs.StringVar(&a.tlsKey, "tls-key", getenv("NATS_KEY"), "the client certificate's key (env NATS_KEY)")
	return a
}

// addServerFlag adds --server to fs: the NATS server of a command that is a client
// of the fleet (submit, mcp), NATS_URL by default, the embedded server's address
// when that is unset too.
func addServerFlag(fs *flag.FlagSet, getenv func(string) string) *string {
	return fs.String("server", getenv("NATS_URL"), "the `URL` of the NATS server the fleet's workers use, or a cluster's, comma-separated (env NATS_URL; default nats://"+defaultEmbeddedAddr+", where \"worker serve\" listens)")
}

// set reports whether any credential or TLS option is given.
func (a *natsAuth) set() bool {
	return *a != natsAuth{}
}

// options returns the connection options of a. Credentials and an nkey together, or
// a certificate without its key, are refused.
func (a *natsAuth) options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case a.creds != "" && a.nkey != "":
		return nil, errors.New("give NATS credentials (--creds) or an nkey seed (--nkey), not both")
	case a.creds != "":
		opts = append(opts, nats.UserCredentials(a.creds))
	case a.nkey != "":
		opt, err := nats.NkeyOptionFromSeed(a.nkey)
		if err != nil {
			return nil, fmt.Errorf("nkey seed %s: %w", a.nkey, err)
		}
		opts = append(opts, opt)
	}
	if (a.tlsCert == "") != (a.tlsKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if a.tlsCA != "" {
		opts = append(opts, nats.RootCAs(a.tlsCA))
	}
	if a.tlsCert != "" {
		opts = append(opts, nats.ClientCert(a.tlsCert, a.tlsKey))
	}
	return opts, nil
}
