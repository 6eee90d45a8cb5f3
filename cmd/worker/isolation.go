package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/worker"
)

// What worker.require_gvisor may say: which sandboxes must run under gVisor's kernel
// (sandboxpool.GVisor) rather than the host's.
const (
	requireGVisorNone    = ""        // none
	requireGVisorTenants = "tenants" // those that serve tenants: any other serves the fleet's own account only
	requireGVisorAll     = "all"     // every sandbox: a worker with another refuses to start
)

// isolate checks, before any container is made, that the engine has the runtime of
// every sandbox, and gVisor's whenever require asks for it (make gvisor registers
// it), and applies require: with "all", a sandbox under another runtime is an error;
// with "tenants", it serves the fleet's own account only (served[i].TenantRefusal,
// served in the order of sandboxes).
func isolate(ctx context.Context, docker interface {
	Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error)
}, require string, sandboxes []sandboxpool.Sandbox, served []worker.Sandbox) error {
	have, err := sandboxpool.EngineRuntimes(ctx, docker)
	if err != nil {
		return err
	}
	var missing []string
	if require != requireGVisorNone && !slices.Contains(have, sandboxpool.GVisor) {
		missing = append(missing, fmt.Sprintf("worker.require_gvisor (%q) needs runtime %q", require, sandboxpool.GVisor))
	}
	for _, sb := range sandboxes {
		if sb.Runtime != "" && !slices.Contains(have, sb.Runtime) {
			missing = append(missing, fmt.Sprintf("sandbox %q asks for runtime %q", sb.Name, sb.Runtime))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s, which the Docker engine does not have (it has %s); make gvisor builds gVisor's runsc and registers it with the engine",
			strings.Join(missing, "; "), strings.Join(have, ", "))
	}
	var others []string
	for i, sb := range sandboxes {
		if sb.Runtime == sandboxpool.GVisor {
			continue
		}
		others = append(others, sb.Name)
		if require == requireGVisorTenants {
			served[i].TenantRefusal = fmt.Sprintf("this fleet runs its tenants' scripts under gVisor (runtime %s) only, and this sandbox runs under %s", sandboxpool.GVisor, cmp.Or(sb.Runtime, "the engine's default runtime"))
		}
	}
	if require == requireGVisorAll && len(others) > 0 {
		return usageError("worker.require_gvisor is %q, and sandboxes %s do not say runtime: %s", require, strings.Join(others, ", "), sandboxpool.GVisor)
	}
	return nil
}
