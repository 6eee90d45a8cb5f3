package main

import (
	"context"
	"debug/elf"
	"fmt"
	"log/slog"
	"maps"
	"os"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/sandboxpool"
)

// setUpEgress gives every sandbox with an allowlist its own internal network and the
// proxy sidecar (built from this very binary) as its only way out, and points the
// sandbox's containers at it. Sandboxes without an allowlist keep network none.
func setUpEgress(ctx context.Context, docker *client.Client, builder *imagebuild.Builder, cfg *imagebuild.Config, sandboxes []sandboxpool.Sandbox, log *slog.Logger) error {
	var proxied []imagebuild.ProxySandbox
	for _, name := range cfg.Names() {
		allowed := cfg.Sandboxes[name].Network.AllowedHosts
		if len(allowed) == 0 {
			continue
		}
		nw, err := imagebuild.EnsureNetwork(ctx, docker, name)
		if err != nil {
			return err
		}
		proxied = append(proxied, imagebuild.ProxySandbox{Name: name, Network: nw, Allowed: allowed})
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
	for _, p := range proxied {
		for i := range sandboxes {
			if sandboxes[i].Name != p.Name {
				continue
			}
			env := maps.Clone(sandboxes[i].Env)
			if env == nil {
				env = map[string]string{}
			}
			url := px.URL(p.Name)
			for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
				env[k] = url
			}
			env["NO_PROXY"], env["no_proxy"] = "localhost,127.0.0.1", "localhost,127.0.0.1"
			sandboxes[i].Env = env
			sandboxes[i].Network = p.Network.Name
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
