package imagebuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// ProxyDocker is the part of the Engine API the proxy sidecar needs; *client.Client
// satisfies it.
type ProxyDocker interface {
	NetworkDocker
	ContainerCreate(ctx context.Context, options client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerStart(ctx context.Context, containerID string, options client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerInspect(ctx context.Context, containerID string, options client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerRemove(ctx context.Context, containerID string, options client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
}

var _ ProxyDocker = (*client.Client)(nil)

// Names and labels of the sidecar.
const (
	// ProxyContainer is the sidecar's container name: one per Docker host.
	ProxyContainer = "jazzmine-proxy"
	// EgressNetwork is the routed network the sidecar reaches the outside through.
	EgressNetwork = "jazzmine-egress"
	// ProxyPort is where the sidecar listens on every sandbox network.
	ProxyPort = 3128
	// LabelProxyConfig holds the checksum of the sidecar's image and allowlists; a
	// sidecar whose label differs from the wanted one is replaced.
	LabelProxyConfig = "jazzmine.proxy.config"
)

// ProxySandbox is one sandbox behind the proxy: its network and its allowlist.
type ProxySandbox struct {
	Name    string
	Network SandboxNetwork
	Allowed []string
}

// Proxy is a running sidecar.
type Proxy struct {
	ContainerID string
	// Addrs is the proxy's address on each sandbox's network, by sandbox name.
	Addrs map[string]netip.Addr
	// Replaced reports that a sidecar was (re)started by this call.
	Replaced bool
}

// URL is the proxy's URL for the sandbox's HTTP_PROXY and HTTPS_PROXY.
func (p Proxy) URL(sandbox string) string {
	return fmt.Sprintf("http://%s:%d", p.Addrs[sandbox], ProxyPort)
}

// EnsureProxy runs the egress proxy sidecar, a container called name (ProxyContainer
// in production), from image with the sandboxes' own
// allowlists, joined to every sandbox network and to EgressNetwork. A sidecar already
// running with the same image and allowlists is kept (joining its networks again is no
// error); one with others, or not running, is replaced.
func EnsureProxy(ctx context.Context, d ProxyDocker, name, image string, sandboxes []ProxySandbox) (Proxy, error) {
	cfg, sum, err := proxyConfig(image, sandboxes)
	if err != nil {
		return Proxy{}, err
	}
	p := Proxy{}
	cur, err := d.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	switch {
	case errdefs.IsNotFound(err):
	case err != nil:
		return Proxy{}, fmt.Errorf("inspect the proxy sidecar: %w", err)
	case cur.Container.Config.Labels[LabelProxyConfig] == sum && cur.Container.State != nil && cur.Container.State.Running:
		p.ContainerID = cur.Container.ID
	default:
		if _, err := d.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
			return Proxy{}, fmt.Errorf("remove the outdated proxy sidecar: %w", err)
		}
	}
	if p.ContainerID == "" {
		if err := ensureEgressNetwork(ctx, d); err != nil {
			return Proxy{}, err
		}
		yes := true
		created, err := d.ContainerCreate(ctx, client.ContainerCreateOptions{
			Name: name,
			Config: &container.Config{
				Image:  image,
				Env:    []string{"JAZZMINE_PROXY_CONFIG=" + cfg},
				Labels: map[string]string{LabelManaged: "true", LabelProxyConfig: sum},
			},
			HostConfig: &container.HostConfig{
				NetworkMode:    container.NetworkMode(EgressNetwork),
				ReadonlyRootfs: true,
				CapDrop:        []string{"ALL"},
				SecurityOpt:    []string{"no-new-privileges"},
				Init:           &yes,
				RestartPolicy:  container.RestartPolicy{Name: container.RestartPolicyUnlessStopped},
			},
		})
		if err != nil {
			return Proxy{}, fmt.Errorf("create the proxy sidecar: %w", err)
		}
		p.ContainerID, p.Replaced = created.ID, true
		if _, err := d.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
			return Proxy{}, fmt.Errorf("start the proxy sidecar: %w", err)
		}
	}
	for _, sb := range sandboxes {
		if err := JoinNetwork(ctx, d, sb.Network.Name, p.ContainerID); err != nil {
			return Proxy{}, err
		}
	}
	cur, err = d.ContainerInspect(ctx, p.ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		return Proxy{}, fmt.Errorf("inspect the proxy sidecar: %w", err)
	}
	p.Addrs = map[string]netip.Addr{}
	for _, sb := range sandboxes {
		ep := cur.Container.NetworkSettings.Networks[sb.Network.Name]
		if ep == nil || !ep.IPAddress.IsValid() {
			return Proxy{}, fmt.Errorf("the proxy sidecar has no address on network %s", sb.Network.Name)
		}
		p.Addrs[sb.Name] = ep.IPAddress
	}
	return p, nil
}

// proxyConfig is the sidecar's JSON config (see package proxy) and the checksum that
// labels it.
func proxyConfig(image string, sandboxes []ProxySandbox) (string, string, error) {
	type sandbox struct {
		Name    string   `json:"name"`
		Subnets []string `json:"subnets"`
		Allowed []string `json:"allowed"`
	}
	var cfg struct {
		Listen    string    `json:"listen"`
		Sandboxes []sandbox `json:"sandboxes"`
	}
	cfg.Listen = fmt.Sprintf(":%d", ProxyPort)
	for _, sb := range sandboxes {
		allowed := append([]string(nil), sb.Allowed...)
		sort.Strings(allowed)
		cfg.Sandboxes = append(cfg.Sandboxes, sandbox{Name: sb.Name, Subnets: []string{sb.Network.Subnet.String()}, Allowed: allowed})
	}
	sort.Slice(cfg.Sandboxes, func(i, j int) bool { return cfg.Sandboxes[i].Name < cfg.Sandboxes[j].Name })
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", "", fmt.Errorf("proxy config: %w", err)
	}
	h := sha256.Sum256(append([]byte(image+"\n"), b...))
	return string(b), hex.EncodeToString(h[:8]), nil
}

// ensureEgressNetwork creates the routed bridge the sidecar reaches the outside
// through, if it is missing.
func ensureEgressNetwork(ctx context.Context, d NetworkDocker) error {
	_, err := d.NetworkInspect(ctx, EgressNetwork, client.NetworkInspectOptions{})
	if errdefs.IsNotFound(err) {
		_, err = d.NetworkCreate(ctx, EgressNetwork, client.NetworkCreateOptions{Driver: "bridge", Labels: map[string]string{LabelManaged: "true"}})
		if errdefs.IsConflict(err) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("network %s: %w", EgressNetwork, err)
	}
	return nil
}
