package main

import (
	"context"
	"debug/elf"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"strconv"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/sandboxpool"
)

// egressPort is the port on 127.0.0.1 where the harness relays, in every execution of
// a sandbox with an allowlist, to the proxy's socket (JAZZMINE_EGRESS_PORT).
const egressPort = 3128

// setUpEgress gives every sandbox with an allowlist its egress volume and the proxy
// sidecar (built from this very binary) listening on a socket in it, with the
// sandbox's allowlist and private ranges, and points the sandbox's containers at it:
// the volume mounted read-only, the harness told where the socket is, and HTTP
// clients told to use the harness's relay as their proxy. Every sandbox keeps
// network none; one without an allowlist has no way out at all.
func setUpEgress(ctx context.Context, docker *client.Client, builder *imagebuild.Builder, cfg *imagebuild.Config, sandboxes []sandboxpool.Sandbox, log *slog.Logger) error {
	var proxied []imagebuild.ProxySandbox
	for _, name := range cfg.Names() {
		network := cfg.Sandboxes[name].Network
		if len(network.AllowedHosts) == 0 {
			continue
		}
		vol, err := imagebuild.EnsureEgressVolume(ctx, docker, name)
		if err != nil {
			return err
		}
		proxied = append(proxied, imagebuild.ProxySandbox{Name: name, Volume: vol, Allowed: network.AllowedHosts, PrivateRanges: network.PrivateRanges})
	}
	if len(proxied) == 0 {
		return nil
	}
	binary, err := staticSelf()
	if err != nil {
		return err
	}
	img, err := builder.EnsureProxyImage(ctx, binary)
	if err != nil {
		return err
	}
	px, err := imagebuild.EnsureProxy(ctx, docker, imagebuild.ProxyContainer, img.Tag, proxied)
	if err != nil {
		return err
	}
	log.Info("egress proxy", "container", px.ContainerID[:12], "restarted", px.Replaced, "sandboxes", len(proxied))
	relay := fmt.Sprintf("http://127.0.0.1:%d", egressPort)
	for _, p := range proxied {
		for i := range sandboxes {
			if sandboxes[i].Name != p.Name {
				continue
			}
			env := maps.Clone(sandboxes[i].Env)
			if env == nil {
				env = map[string]string{}
			}
			env["JAZZMINE_EGRESS_SOCKET"] = path.Join(sandboxpool.EgressDir, imagebuild.ProxySocket)
			env["JAZZMINE_EGRESS_PORT"] = strconv.Itoa(egressPort)
			for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
				env[k] = relay
			}
			env["NO_PROXY"], env["no_proxy"] = "localhost,127.0.0.1", "localhost,127.0.0.1"
			sandboxes[i].Env = env
			sandboxes[i].EgressVolume = p.Volume
		}
	}
	return nil
}

// staticSelf returns this executable, which must be statically linked: the sidecar's
// image has nothing else in it.
func staticSelf() ([]byte, error) {
	path, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("egress proxy: find this executable: %w", err)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: read %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("egress proxy: %s is dynamically linked; the proxy image needs a static build (make build, or CGO_ENABLED=0 go build)", path)
		}
	}
	return os.ReadFile(path)
}
