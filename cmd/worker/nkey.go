package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"

	"github.com/jazzmine/worker/wire"
)

// nkeyCommand makes NATS user keys: `worker nkey [--out DIR] NAME...`. For each
// NAME it writes a new seed to DIR/NAME.seed (mode 0600) and its public key to
// DIR/NAME.pub, and prints "NAME PUBLIC_KEY". A seed already there is kept: its
// public key is written and printed again, so running the command twice changes no
// key (compose.sh relies on that).
func nkeyCommand(args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("nkey", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Usage = func() {
		fmt.Fprintln(stderr, "Usage: worker nkey [--out DIR] NAME...\n\nMakes a NATS user nkey for each NAME, for the server's configuration (worker nats-auth) and for --nkey: writes the seed (S...) to DIR/NAME.seed, readable by its owner only, and the public key (U...) to DIR/NAME.pub, and prints \"NAME PUBLIC_KEY\" lines. An existing NAME.seed is kept and its public key printed.\n\nFlags:")
		fset.PrintDefaults()
	}
	out := fset.String("out", ".", "the directory the seeds and public keys go to (created if missing, mode 0700)")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &exitError{code: 2}
	}
	if fset.NArg() == 0 {
		fset.Usage()
		return usageError("nkey: name at least one key")
	}
	for _, name := range fset.Args() {
		// A name is a file name's stem: the id rules keep it to one path element.
		if err := wire.ValidateID("key name", name); err != nil {
			return usageError("nkey: %v", err)
		}
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return fmt.Errorf("nkey: %w", err)
	}
	for _, name := range fset.Args() {
		pub, err := userKey(filepath.Join(*out, name+".seed"))
		if err != nil {
			return fmt.Errorf("nkey %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(*out, name+".pub"), []byte(pub+"\n"), 0o644); err != nil {
			return fmt.Errorf("nkey %s: %w", name, err)
		}
		if _, err := fmt.Fprintln(stdout, name, pub); err != nil {
			return err
		}
	}
	return nil
}

// userKey returns the public key of the user seed in the file seedFile, which it
// creates with a new seed first when there is none.
func userKey(seedFile string) (string, error) {
	seed, err := os.ReadFile(seedFile)
	if errors.Is(err, fs.ErrNotExist) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return "", err
		}
		if seed, err = kp.Seed(); err != nil {
			return "", err
		}
		// O_EXCL: a seed that appeared meanwhile is not overwritten.
		f, err := os.OpenFile(seedFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return "", err
		}
		_, err = f.Write(append(seed, '\n'))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(seedFile)
			return "", fmt.Errorf("write %s: %w", seedFile, err)
		}
	} else if err != nil {
		return "", err
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		return "", fmt.Errorf("%s: %w", seedFile, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return "", err
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("%s holds the seed of %s, not of a user (U...)", seedFile, pub)
	}
	return pub, nil
}
