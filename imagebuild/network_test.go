package imagebuild

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

func removeNetworkAtCleanup(t *testing.T, cli *client.Client, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = cli.NetworkRemove(ctx, name, client.NetworkRemoveOptions{})
	})
}

func TestASandboxNetworkIsInternalWithoutMasqueradeAndMadeOnce(t *testing.T) {
	cli := requireDocker(t)
	ctx := context.Background()
	name := uniqueName(t)
	removeNetworkAtCleanup(t, cli, NetworkName(name))
	first, err := EnsureNetwork(ctx, cli, name)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cli.NetworkInspect(ctx, first.ID, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nw := res.Network
	if !nw.Internal || nw.Driver != "bridge" || nw.Options[maskOption] != "false" || nw.Labels[LabelManaged] != "true" || nw.Labels[LabelSandbox] != name {
		t.Errorf("network %s: internal=%v driver=%s options=%v labels=%v", nw.Name, nw.Internal, nw.Driver, nw.Options, nw.Labels)
	}
	if !first.Subnet.IsValid() || !first.Subnet.Addr().Is4() {
		t.Errorf("subnet = %v", first.Subnet)
	}
	again, err := EnsureNetwork(ctx, cli, name)
	if err != nil || again != first {
		t.Errorf("second EnsureNetwork = %+v, %v; want the same %+v", again, err, first)
	}
}

func TestANetworkOfTheSameNameThatIsNotInternalIsRefused(t *testing.T) {
	cli := requireDocker(t)
	ctx := context.Background()
	name := uniqueName(t)
	removeNetworkAtCleanup(t, cli, NetworkName(name))
	if _, err := cli.NetworkCreate(ctx, NetworkName(name), client.NetworkCreateOptions{Driver: "bridge", Labels: map[string]string{LabelSandbox: name, testLabel[:strings.IndexByte(testLabel, '=')]: "imagebuild"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureNetwork(ctx, cli, name); err == nil || !strings.Contains(err.Error(), "not internal") {
		t.Errorf("err = %v, want a refusal of the routed network", err)
	}
}

func TestJoiningANetworkTwiceIsNoError(t *testing.T) {
	cli := requireDocker(t)
	ctx := context.Background()
	name := uniqueName(t)
	removeNetworkAtCleanup(t, cli, NetworkName(name))
	nw, err := EnsureNetwork(ctx, cli, name)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("docker", "run", "-d", "--rm", "--label", testLabel, "--entrypoint", "sleep", DefaultBaseImage, "120").Output()
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", id).Run() })
	for i := range 2 {
		if err := JoinNetwork(ctx, cli, nw.Name, id); err != nil {
			t.Fatalf("join #%d: %v", i+1, err)
		}
	}
	res, err := cli.NetworkInspect(ctx, nw.ID, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Network.Containers[id]; !ok || len(res.Network.Containers) != 1 {
		t.Errorf("containers on the network: %v, want %s once", res.Network.Containers, id[:12])
	}
}
