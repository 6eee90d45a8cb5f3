package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/worker"
)

// engineWith is an engine's Info listing the runtimes.
type engineWith []string

func (e engineWith) Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error) {
	res := client.SystemInfoResult{Info: system.Info{Runtimes: map[string]system.RuntimeWithStatus{}}}
	for _, rt := range e {
		res.Info.Runtimes[rt] = system.RuntimeWithStatus{}
	}
	return res, nil
}

func TestIsolateRefusesWhatTheEngineOrTheFleetsRequirementCannotServe(t *testing.T) {
	plain, gvisor := sandboxpool.Sandbox{Name: "plain"}, sandboxpool.Sandbox{Name: "strong", Runtime: sandboxpool.GVisor}
	cases := []struct {
		name      string
		engine    engineWith
		require   string
		sandboxes []sandboxpool.Sandbox
		err       []string // what the error says; none: no error
		usage     bool     // the error is the config's (exit code 2)
		refused   []string // the sandboxes that serve no tenant
	}{
		{name: "a sandbox asking for a runtime the engine lacks is refused, and make gvisor named",
			engine: engineWith{"runc"}, sandboxes: []sandboxpool.Sandbox{plain, gvisor},
			err: []string{`sandbox "strong" asks for runtime "runsc"`, "it has runc", "make gvisor"}},
		{name: "a fleet requiring gVisor on an engine without it is refused, whatever its sandboxes",
			engine: engineWith{"runc"}, require: "tenants", sandboxes: []sandboxpool.Sandbox{plain},
			err: []string{`worker.require_gvisor ("tenants") needs runtime "runsc"`, "make gvisor"}},
		{name: "with require_gvisor all, a sandbox under runc is refused",
			engine: engineWith{"runc", "runsc"}, require: "all", sandboxes: []sandboxpool.Sandbox{plain, gvisor},
			err: []string{`sandboxes plain do not say runtime: runsc`}, usage: true},
		{name: "with require_gvisor tenants, a sandbox under runc serves the fleet's own account only",
			engine: engineWith{"runc", "runsc"}, require: "tenants", sandboxes: []sandboxpool.Sandbox{plain, gvisor},
			refused: []string{"plain"}},
		{name: "without a requirement, every sandbox serves tenants",
			engine: engineWith{"runc", "runsc"}, sandboxes: []sandboxpool.Sandbox{plain, gvisor}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			served := make([]worker.Sandbox, len(c.sandboxes))
			for i, sb := range c.sandboxes {
				served[i].Name = sb.Name
			}
			err := isolate(context.Background(), c.engine, c.require, c.sandboxes, served)
			for _, want := range c.err {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v, want it to say %q", err, want)
				}
			}
			if len(c.err) == 0 && err != nil {
				t.Errorf("error %v, want none", err)
			}
			var ee *exitError
			if isUsage := errors.As(err, &ee) && ee.code == 2; isUsage != c.usage {
				t.Errorf("error %v: a usage error %v, want %v", err, isUsage, c.usage)
			}
			var refused []string
			for _, sb := range served {
				if sb.TenantRefusal != "" {
					refused = append(refused, sb.Name)
				}
			}
			if !slices.Equal(refused, c.refused) {
				t.Errorf("sandboxes refused to tenants: %v, want %v", refused, c.refused)
			}
		})
	}
}

// TestServeRefusesToStartWithARuntimeTheEngineLacks: `worker serve` with a sandbox
// whose runtime the local engine does not have exits at start with an error naming
// the sandbox, the runtime and make gvisor, before it makes any container (before,
// its pool tried to create one for ever).
func TestServeRefusesToStartWithARuntimeTheEngineLacks(t *testing.T) {
	testenv.Docker(t)
	srv, _ := testenv.NATS(t)
	config := filepath.Join(t.TempDir(), "config.yaml")
	tools := filepath.Join(testenv.RepoRoot(), "examples", "tools", "*.py")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("sandboxes:\n  default:\n    tools: [%q]\n    runtime: no-such-runtime\n    pool: {size: 1}\n", tools)), 0o644); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("isolate-%d", time.Now().UnixNano())
	env := func(k string) string {
		if k == "NATS_URL" {
			return srv.ClientURL()
		}
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stderr strings.Builder
	err := serve(ctx, []string{"--config", config, "--worker-id", id, "--metrics-addr", ""}, env, &stderr)
	if err == nil || !strings.Contains(err.Error(), `sandbox "default" asks for runtime "no-such-runtime"`) || !strings.Contains(err.Error(), "make gvisor") {
		t.Errorf("serve: %v, want it to refuse the runtime and name make gvisor", err)
	}
	if left := testenv.ContainersOf(t, id); len(left) > 0 {
		t.Errorf("containers made: %v", left)
	}
}
