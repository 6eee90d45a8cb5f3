package nats_test

import (
	"os"
	"strings"
	"testing"

	natsdeploy "github.com/jazzmine/worker/deploy/nats"
)

// TestTheShippedAuthConfIsRendered: auth.conf is what `worker nats-auth` renders for
// the worker key and the one tenant, agents, of its environment; edit the template,
// not the file.
func TestTheShippedAuthConfIsRendered(t *testing.T) {
	want, err := natsdeploy.AuthConfig([]string{"$JAZZMINE_WORKER_NKEY"}, []natsdeploy.Tenant{{Name: "agents", Key: "$JAZZMINE_AGENT_NKEY"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("auth.conf")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("auth.conf is not the rendering of auth.conf.tmpl: run\n  worker nats-auth --worker '$JAZZMINE_WORKER_NKEY' --tenant 'agents=$JAZZMINE_AGENT_NKEY' > deploy/nats/auth.conf")
	}
}

// TestAnAuthConfigRefusesWhatTheServerWouldMisread: keys that are not public user
// nkeys, tenant names that would change a subject's meaning, a tenant twice.
func TestAnAuthConfigRefusesWhatTheServerWouldMisread(t *testing.T) {
	const ok = "$KEY"
	tests := []struct {
		name    string
		workers []string
		tenants []natsdeploy.Tenant
		want    string
	}{
		{"no worker", nil, []natsdeploy.Tenant{{"a", ok}}, "at least one"},
		{"a seed instead of a public key", []string{"SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"}, []natsdeploy.Tenant{{"a", ok}}, "not a public user nkey"},
		{"a tenant name with a dot", []string{ok}, []natsdeploy.Tenant{{"a.b", ok}}, "tenant"},
		{"a tenant name with a wildcard", []string{ok}, []natsdeploy.Tenant{{"*", ok}}, "tenant"},
		{"a tenant twice", []string{ok}, []natsdeploy.Tenant{{"a", ok}, {"a", ok}}, "named twice"},
		{"a key that is config syntax", []string{ok}, []natsdeploy.Tenant{{"a", "U} users: [{"}}, "not a public user nkey"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := natsdeploy.AuthConfig(tt.workers, tt.tenants)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one that says %q", err, tt.want)
			}
		})
	}
}
