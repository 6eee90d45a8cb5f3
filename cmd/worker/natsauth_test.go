package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

func TestNATSAuthTakesFlagsOrTheNATSCLIsEnvironment(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	b, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seed, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		options int
		wantErr string
	}{
		{"nothing given means no options", nil, nil, 0, ""},
		{"an nkey seed from the flag is one option", []string{"--nkey", seed}, nil, 1, ""},
		{"an nkey seed from NATS_NKEY is one option", nil, map[string]string{"NATS_NKEY": seed}, 1, ""},
		{"a flag overrides the environment", []string{"--nkey", seed}, map[string]string{"NATS_NKEY": "/nonexistent"}, 1, ""},
		{"credentials and TLS from the environment are three options", nil, map[string]string{"NATS_CREDS": "u.creds", "NATS_CA": "ca.pem", "NATS_CERT": "c.pem", "NATS_KEY": "c.key"}, 3, ""},
		{"credentials and an nkey together are refused", []string{"--creds", "u.creds", "--nkey", seed}, nil, 0, "not both"},
		{"a certificate without its key is refused", []string{"--tls-cert", "c.pem"}, nil, 0, "go together"},
		{"a missing seed file is named", []string{"--nkey", "/nonexistent/seed"}, nil, 0, "/nonexistent/seed"},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		a := addNATSAuthFlags(fs, func(k string) string { return tc.env[k] })
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		opts, err := a.options()
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: err = %v, want one saying %q", tc.name, err, tc.wantErr)
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case len(opts) != tc.options:
			t.Errorf("%s: %d options, want %d", tc.name, len(opts), tc.options)
		}
		if set := len(tc.args) > 0 || len(tc.env) > 0; a.set() != set {
			t.Errorf("%s: set() = %v, want %v", tc.name, a.set(), set)
		}
	}
}
