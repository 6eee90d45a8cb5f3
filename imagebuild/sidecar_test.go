package imagebuild

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

// TestTheSidecarJoinsEverySandboxNetworkAndRestartsOnlyWhenAllowlistsChange.
func TestTheSidecarJoinsEverySandboxNetworkAndRestartsOnlyWhenAllowlistsChange(t *testing.T) {
	cli := requireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := NewBuilder(BuilderConfig{Docker: cli})
	if err != nil {
		t.Fatal(err)
	}
	img, err := b.EnsureProxyImage(ctx, append(staticWorker(t), []byte(t.Name())...))
	if err != nil {
		t.Fatal(err)
	}
	removeImageAtCleanup(t, cli, img.ID)
	var sandboxes []ProxySandbox
	for _, allowed := range []string{"svc-a:8080", "svc-b:8080"} {
		name := uniqueName(t)
		removeNetworkAtCleanup(t, cli, NetworkName(name))
		nw, err := EnsureNetwork(ctx, cli, name)
		if err != nil {
			t.Fatal(err)
		}
		sandboxes = append(sandboxes, ProxySandbox{Name: name, Network: nw, Allowed: []string{allowed}})
	}
	sidecar := "jazzmine-proxy-" + uniqueName(t)
	t.Cleanup(func() {
		_, _ = cli.ContainerRemove(context.Background(), sidecar, client.ContainerRemoveOptions{Force: true})
	})
	first, err := EnsureProxy(ctx, cli, sidecar, img.Tag, sandboxes)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Replaced {
		t.Error("the first EnsureProxy did not start a sidecar")
	}
	for _, sb := range sandboxes {
		if a := first.Addrs[sb.Name]; !sb.Network.Subnet.Contains(a) {
			t.Errorf("sidecar address for %s = %v, want one in %v", sb.Name, a, sb.Network.Subnet)
		}
	}
	same, err := EnsureProxy(ctx, cli, sidecar, img.Tag, sandboxes)
	if err != nil || same.Replaced || same.ContainerID != first.ContainerID {
		t.Errorf("unchanged allowlists: %+v, %v; want the same sidecar, not restarted", same, err)
	}
	sandboxes[0].Allowed = append(sandboxes[0].Allowed, "svc-c:443")
	changed, err := EnsureProxy(ctx, cli, sidecar, img.Tag, sandboxes)
	if err != nil || !changed.Replaced || changed.ContainerID == first.ContainerID {
		t.Errorf("changed allowlist: %+v, %v; want a new sidecar", changed, err)
	}
}
