package sandboxpool

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/moby/moby/client"
)

// GVisor is the name of gVisor's runtime as make gvisor registers it with the engine
// (runsc with --oci-seccomp, --network=none, --host-uds=open): a Sandbox.Runtime of
// this name runs under gVisor's kernel, for which the pool sets what gVisor enforces
// otherwise than runc (the PIDs limit, the POSIX message queues: container.go,
// seccomp.go).
const GVisor = "runsc"

// EngineRuntimes returns the names of the OCI runtimes the engine has (its
// daemon.json "runtimes" and its own), sorted. A sandbox's Runtime must be one: the
// engine refuses to create a container of any other, and a pool would go on trying.
func EngineRuntimes(ctx context.Context, docker interface {
	Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error)
}) ([]string, error) {
	res, err := docker.Info(ctx, client.InfoOptions{})
	if err != nil {
		return nil, fmt.Errorf("docker info: %w", err)
	}
	return slices.Sorted(maps.Keys(res.Info.Runtimes)), nil
}
