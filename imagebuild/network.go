package imagebuild

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// NetworkDocker is the part of the Engine API that sandbox networks need;
// *client.Client satisfies it.
type NetworkDocker interface {
	NetworkCreate(ctx context.Context, name string, options client.NetworkCreateOptions) (client.NetworkCreateResult, error)
	NetworkInspect(ctx context.Context, networkID string, options client.NetworkInspectOptions) (client.NetworkInspectResult, error)
	NetworkConnect(ctx context.Context, networkID string, options client.NetworkConnectOptions) (client.NetworkConnectResult, error)
}

var _ NetworkDocker = (*client.Client)(nil)

// SandboxNetwork is a sandbox's own network.
type SandboxNetwork struct {
	Name, ID string
	// Subnet is the network's IPv4 subnet: the egress proxy tells sandboxes apart by it.
	Subnet netip.Prefix
}

// NetworkName is the name of the sandbox's network.
func NetworkName(sandbox string) string { return repository(sandbox) + "-net" }

// maskOption turns IP masquerading off on a bridge network.
const maskOption = "com.docker.network.bridge.enable_ip_masquerade"

// EnsureNetwork returns the sandbox's network, creating it if needed: an internal
// bridge (no route out) with IP masquerading off, labelled jazzmine.managed and
// jazzmine.sandbox. A network of that name that is not internal is an error, never
// used. Workers racing to create it end up with the same one.
func EnsureNetwork(ctx context.Context, d NetworkDocker, sandbox string) (SandboxNetwork, error) {
	name := NetworkName(sandbox)
	n, err := inspectNetwork(ctx, d, name, sandbox)
	if errdefs.IsNotFound(err) {
		_, err = d.NetworkCreate(ctx, name, client.NetworkCreateOptions{
			Driver:   "bridge",
			Internal: true,
			Options:  map[string]string{maskOption: "false"},
			Labels:   map[string]string{LabelManaged: "true", LabelSandbox: sandbox},
		})
		if err != nil && !errdefs.IsConflict(err) {
			return SandboxNetwork{}, fmt.Errorf("create network %s for sandbox %q: %w", name, sandbox, err)
		}
		n, err = inspectNetwork(ctx, d, name, sandbox) // ours, or the one a racing worker made
	}
	if err != nil {
		return SandboxNetwork{}, fmt.Errorf("network %s for sandbox %q: %w", name, sandbox, err)
	}
	return n, nil
}

func inspectNetwork(ctx context.Context, d NetworkDocker, name, sandbox string) (SandboxNetwork, error) {
	res, err := d.NetworkInspect(ctx, name, client.NetworkInspectOptions{})
	if err != nil {
		return SandboxNetwork{}, err
	}
	nw := res.Network
	if !nw.Internal || nw.Options[maskOption] != "false" {
		return SandboxNetwork{}, fmt.Errorf("network %s exists but is not internal with masquerading off: remove it (docker network rm %s) and restart", name, name)
	}
	if nw.Labels[LabelSandbox] != sandbox {
		return SandboxNetwork{}, fmt.Errorf("network %s belongs to sandbox %q, not %q (names that differ only in case or punctuation share a network name)", name, nw.Labels[LabelSandbox], sandbox)
	}
	out := SandboxNetwork{Name: nw.Name, ID: nw.ID}
	for _, c := range nw.IPAM.Config {
		if c.Subnet.Addr().Is4() {
			out.Subnet = c.Subnet
			break
		}
	}
	if !out.Subnet.IsValid() {
		return SandboxNetwork{}, fmt.Errorf("network %s has no IPv4 subnet", name)
	}
	return out, nil
}

// JoinNetwork joins the container to the network unless it is already on it, so that
// calling it twice is no error.
func JoinNetwork(ctx context.Context, d NetworkDocker, network, container string) error {
	res, err := d.NetworkInspect(ctx, network, client.NetworkInspectOptions{})
	if err != nil {
		return fmt.Errorf("inspect network %s: %w", network, err)
	}
	for id, ep := range res.Network.Containers {
		if strings.HasPrefix(id, container) || ep.Name == container {
			return nil
		}
	}
	if _, err := d.NetworkConnect(ctx, network, client.NetworkConnectOptions{Container: container}); err != nil {
		return fmt.Errorf("connect container %s to network %s: %w", container, network, err)
	}
	return nil
}
