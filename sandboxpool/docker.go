package sandboxpool

import (
	"context"

	"github.com/moby/moby/client"
)

// Docker is the part of the Docker Engine API the pool uses: it creates, attaches to,
// starts, inspects (for an OOM kill), lists (for the reaper and Close's sweep) and
// removes containers. *client.Client from github.com/moby/moby/client satisfies it;
// the pool's logic tests put an engine in memory behind it.
type Docker interface {
	ContainerCreate(ctx context.Context, options client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerAttach(ctx context.Context, containerID string, options client.ContainerAttachOptions) (client.ContainerAttachResult, error)
	ContainerStart(ctx context.Context, containerID string, options client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerInspect(ctx context.Context, containerID string, options client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerRemove(ctx context.Context, containerID string, options client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
	ContainerList(ctx context.Context, options client.ContainerListOptions) (client.ContainerListResult, error)
}

var _ Docker = (*client.Client)(nil)

// localDocker is the client of a Config without one: the engine the environment
// names (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH; the local socket without
// them), the API version negotiated. It connects at its first call.
func localDocker() (*client.Client, error) {
	return client.New(client.FromEnv, client.WithAPIVersionNegotiation())
}
