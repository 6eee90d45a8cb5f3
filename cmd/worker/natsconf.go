package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	natsdeploy "github.com/jazzmine/worker/deploy/nats"
)

// natsAuthConfig prints the NATS server configuration of a fleet's roles and
// tenants: `worker nats-auth --worker KEY... --tenant NAME=KEY...`.
func natsAuthConfig(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("nats-auth", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: worker nats-auth --worker KEY [--worker KEY...] --tenant NAME=KEY [--tenant NAME=KEY...]\n\nPrints the NATS server configuration of a fleet's roles and tenants (include it from the server's; see deploy/nats/README.md). A KEY is a public user nkey (U...) or $ENV, which the server reads from its environment.\n\nFlags:")
		fs.PrintDefaults()
	}
	var workers, tenants listFlag
	fs.Var(&workers, "worker", "a worker's public user nkey, or $ENV naming it; repeat for more")
	fs.Var(&tenants, "tenant", "NAME=KEY: a tenant and its agents' public user nkey (or $ENV); repeat for more")
	if err := fs.Parse(args); err != nil {
		return &exitError{code: 2}
	}
	var ts []natsdeploy.Tenant
	for _, t := range tenants {
		name, key, ok := strings.Cut(t, "=")
		if !ok {
			return usageError("nats-auth: --tenant %q is not NAME=KEY", t)
		}
		ts = append(ts, natsdeploy.Tenant{Name: name, Key: key})
	}
	conf, err := natsdeploy.AuthConfig(workers, ts)
	if err != nil {
		return usageError("nats-auth: %v", err)
	}
	_, err = io.WriteString(stdout, conf)
	return err
}
