package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// TestNkeyMakesASeedOnceAndPrintsItsPublicKey: `worker nkey --out DIR worker agent`
// writes each seed readable by its owner only, in the form --nkey reads, and its
// public key beside it and on stdout; a second run keeps both seeds.
func TestNkeyMakesASeedOnceAndPrintsItsPublicKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	nkey := func() map[string]string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"nkey", "--out", dir, "worker", "agent"}, os.Getenv, nil, &out, &errOut); err != nil {
			t.Fatalf("worker nkey: %v\n%s", err, errOut.String())
		}
		keys := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			name, pub, _ := strings.Cut(line, " ")
			keys[name] = pub
		}
		return keys
	}
	first := nkey()
	for _, name := range []string{"worker", "agent"} {
		seedFile := filepath.Join(dir, name+".seed")
		fi, err := os.Stat(seedFile)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", seedFile, fi.Mode().Perm())
		}
		seed, err := os.ReadFile(seedFile)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.ParseDecoratedNKey(seed) // what nats.NkeyOptionFromSeed reads a seed file with
		if err != nil {
			t.Fatalf("%s: %v", seedFile, err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		if !nkeys.IsValidPublicUserKey(pub) || first[name] != pub {
			t.Errorf("%s: printed %q, the seed's public key is %q; want the same user key", name, first[name], pub)
		}
		if b, err := os.ReadFile(filepath.Join(dir, name+".pub")); err != nil || strings.TrimSpace(string(b)) != pub {
			t.Errorf("%s.pub: %q, %v; want %s", name, b, err, pub)
		}
	}
	if first["worker"] == first["agent"] {
		t.Error("the worker and the agent got the same key")
	}
	if again := nkey(); again["worker"] != first["worker"] || again["agent"] != first["agent"] {
		t.Errorf("a second run changed the keys: %v, then %v", first, again)
	}
}

func TestNkeyRefusesWhatItCannotMakeAUserKeyOf(t *testing.T) {
	dir := t.TempDir()
	account, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	accountSeed, err := account.Seed()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "acct.seed"), accountSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "junk.seed"), []byte("not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"no name is a usage error", []string{"nkey", "--out", dir}, 2, "at least one"},
		{"a name that is a path is a usage error", []string{"nkey", "--out", dir, "../escape"}, 2, "key name"},
		{"a seed file of an account is refused", []string{"nkey", "--out", dir, "acct"}, 1, "not of a user"},
		{"a seed file that holds no seed is refused", []string{"nkey", "--out", dir, "junk"}, 1, "junk.seed"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), tc.args, os.Getenv, nil, &out, &errOut)
		var ee *exitError
		code := 1
		if errors.As(err, &ee) {
			code = ee.code
		}
		if err == nil || code != tc.wantCode || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: err = %v (exit %d), want exit %d saying %q", tc.name, err, code, tc.wantCode, tc.wantErr)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape.seed")); err == nil {
		t.Error("a seed was written outside the directory")
	}
}
