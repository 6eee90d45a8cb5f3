package imagebuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/proxy"
)

// ProxyDocker is the part of the Engine API the proxy sidecar needs; *client.Client
// satisfies it.
type ProxyDocker interface {
	NetworkCreate(ctx context.Context, name string, options client.NetworkCreateOptions) (client.NetworkCreateResult, error)
	NetworkInspect(ctx context.Context, networkID string, options client.NetworkInspectOptions) (client.NetworkInspectResult, error)
	ContainerCreate(ctx context.Context, options client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerStart(ctx context.Context, containerID string, options client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerInspect(ctx context.Context, containerID string, options client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerRemove(ctx context.Context, containerID string, options client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
}

var _ ProxyDocker = (*client.Client)(nil)

// Names, paths and labels of the sidecar.
const (
	// ProxyContainer is the sidecar's container name: one per Docker host.
	ProxyContainer = "jazzmine-proxy"
	// EgressNetwork is the routed network the sidecar reaches the outside through.
	EgressNetwork = "jazzmine-egress"
	// ProxyDir is where the sidecar mounts each sandbox's egress volume, at
	// ProxyDir/<sandbox>.
	ProxyDir = "/run/jazzmine/egress"
	// ProxySocket is the file name of the proxy's socket in an egress volume.
	ProxySocket = "proxy.sock"
	// LabelProxyConfig holds the checksum of the sidecar's image, allowlists,
	// private ranges and volumes; a sidecar whose label differs from the wanted
	// one is replaced.
	LabelProxyConfig = "jazzmine.proxy.config"
)

// ProxySandbox is one sandbox behind the proxy: its egress volume and its allowlist.
type ProxySandbox struct {
	Name string
	// Volume is the sandbox's egress volume (EnsureEgressVolume).
	Volume  string
	Allowed []string
	// PrivateRanges are the CIDR prefixes Allowed's names may resolve to
	// although not global (Network.PrivateRanges).
	PrivateRanges []string
}

// Proxy is a running sidecar.
type Proxy struct {
	ContainerID string
	// Replaced reports that a sidecar was (re)started by this call.
	Replaced bool
}

// EnsureProxy runs the egress proxy sidecar, a container called name (ProxyContainer
// in production), from image with the sandboxes' own allowlists and private ranges,
// on EgressNetwork, with each sandbox's volume mounted at ProxyDir/<sandbox>, where
// the proxy listens on ProxySocket for that sandbox. A sidecar already running with
// the same image, allowlists, private ranges and volumes is kept; one with others, or
// not running, is replaced. It returns once the sidecar is started, not once it
// listens: a client that connects earlier is refused, and the caller starts the
// sandboxes' containers after it.
func EnsureProxy(ctx context.Context, d ProxyDocker, name, image string, sandboxes []ProxySandbox) (Proxy, error) {
	cfg, mounts, sum, err := proxyConfig(image, sandboxes)
	if err != nil {
		return Proxy{}, err
	}
	cur, err := d.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	switch {
	case errdefs.IsNotFound(err):
	case err != nil:
		return Proxy{}, fmt.Errorf("inspect the proxy sidecar: %w", err)
	case cur.Container.Config.Labels[LabelProxyConfig] == sum && cur.Container.State != nil && cur.Container.State.Running:
		return Proxy{ContainerID: cur.Container.ID}, nil
	default:
		if _, err := d.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
			return Proxy{}, fmt.Errorf("remove the outdated proxy sidecar: %w", err)
		}
	}
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
			Mounts:         mounts,
		},
	})
	if err != nil {
		return Proxy{}, fmt.Errorf("create the proxy sidecar: %w", err)
	}
	if _, err := d.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return Proxy{}, fmt.Errorf("start the proxy sidecar: %w", err)
	}
	return Proxy{ContainerID: created.ID, Replaced: true}, nil
}

// proxyConfig is the sidecar's JSON config (see package proxy), validated as the
// proxy will, its mounts, and the checksum of both and the image that labels it.
func proxyConfig(image string, sandboxes []ProxySandbox) (string, []mount.Mount, string, error) {
	type sandbox struct {
		Name          string   `json:"name"`
		Socket        string   `json:"socket"`
		Allowed       []string `json:"allowed"`
		PrivateRanges []string `json:"private_ranges,omitempty"`
	}
	var cfg struct {
		Sandboxes []sandbox `json:"sandboxes"`
	}
	sorted := slices.Clone(sandboxes)
	slices.SortFunc(sorted, func(a, b ProxySandbox) int { return strings.Compare(a.Name, b.Name) })
	var mounts []mount.Mount
	for _, sb := range sorted {
		if sb.Volume == "" {
			return "", nil, "", fmt.Errorf("proxy config: sandbox %q has no egress volume", sb.Name)
		}
		dir := path.Join(ProxyDir, sb.Name)
		allowed, private := slices.Clone(sb.Allowed), slices.Clone(sb.PrivateRanges)
		slices.Sort(allowed)
		slices.Sort(private)
		cfg.Sandboxes = append(cfg.Sandboxes, sandbox{Name: sb.Name, Socket: path.Join(dir, ProxySocket), Allowed: allowed, PrivateRanges: private})
		mounts = append(mounts, mount.Mount{Type: mount.TypeVolume, Source: sb.Volume, Target: dir, VolumeOptions: &mount.VolumeOptions{NoCopy: true}})
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", nil, "", fmt.Errorf("proxy config: %w", err)
	}
	// Refused here, not by a sidecar that would restart forever.
	if _, err := proxy.ParseConfig(b); err != nil {
		return "", nil, "", fmt.Errorf("proxy config: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", image, b)
	for _, m := range mounts {
		fmt.Fprintf(h, "%s:%s\n", m.Source, m.Target)
	}
	return string(b), mounts, hex.EncodeToString(h.Sum(nil)[:8]), nil
}

// ensureEgressNetwork creates the routed bridge the sidecar reaches the outside
// through, if it is missing.
func ensureEgressNetwork(ctx context.Context, d ProxyDocker) error {
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
