// Package nats holds the NATS side of a jazzmine deployment: the server
// configurations in this directory, and [AuthConfig], which renders the roles and
// tenants of auth.conf for any set of keys (`worker nats-auth`). Its tests run the
// deployment: the shipped auth configuration against hostile agents, the cluster
// under faults, the worker's image.
package nats

import (
	_ "embed"
	"fmt"
	"regexp"
	"strings"
	"text/template"

	"github.com/nats-io/nkeys"

	"github.com/jazzmine/worker/wire"
)

// authTemplate is the server configuration of a fleet's roles and tenants;
// auth.conf is its rendering for one tenant, agents (a test keeps them equal).
//
//go:embed auth.conf.tmpl
var authTemplate string

var authConf = template.Must(template.New("auth.conf").Parse(authTemplate))

// envKey is a key given as an environment reference, $NAME, that the server
// resolves when it reads the file.
var envKey = regexp.MustCompile(`^\$[A-Za-z_][A-Za-z0-9_]*$`)

// Tenant is one tenant of a fleet: its name, the token its subjects carry in the
// fleet's account (a valid id, see [wire.ValidateID]), and its agents' public user
// nkey (U...) or an environment reference ($NAME) to it.
type Tenant struct{ Name, Key string }

// AuthConfig renders the NATS server configuration (accounts, users, permissions,
// exports and imports) of a fleet whose workers have the given keys, serving the
// given tenants. A key is a public user nkey or an environment reference. It fails
// on a key that is neither, a tenant name that is not a valid id, a tenant named
// twice, or no worker or no tenant.
func AuthConfig(workerKeys []string, tenants []Tenant) (string, error) {
	if len(workerKeys) == 0 || len(tenants) == 0 {
		return "", fmt.Errorf("auth config: at least one worker key and one tenant")
	}
	for _, k := range workerKeys {
		if err := checkUserKey(k); err != nil {
			return "", fmt.Errorf("auth config: worker key %s: %w", k, err)
		}
	}
	type tenant struct{ Name, Account, Key string }
	seen := map[string]bool{}
	var ts []tenant
	for _, t := range tenants {
		if err := wire.ValidateID("tenant", t.Name); err != nil {
			return "", fmt.Errorf("auth config: %w", err)
		}
		if seen[t.Name] {
			return "", fmt.Errorf("auth config: tenant %q named twice", t.Name)
		}
		seen[t.Name] = true
		if err := checkUserKey(t.Key); err != nil {
			return "", fmt.Errorf("auth config: tenant %s: key %s: %w", t.Name, t.Key, err)
		}
		ts = append(ts, tenant{t.Name, "TENANT_" + t.Name, t.Key})
	}
	var b strings.Builder
	err := authConf.Execute(&b, struct {
		Workers []string
		Tenants []tenant
	}{workerKeys, ts})
	return b.String(), err
}

func checkUserKey(k string) error {
	if envKey.MatchString(k) || nkeys.IsValidPublicUserKey(k) {
		return nil
	}
	return fmt.Errorf("not a public user nkey (U...) nor an environment reference ($NAME)")
}
