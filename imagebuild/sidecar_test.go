package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/proxy"
)

// removeVolumeAtCleanup removes the volume when the test ends, after the containers
// that the test removes later in its cleanups (they run last first).
func removeVolumeAtCleanup(t *testing.T, cli *client.Client, name string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true})
	})
}

func TestAnEgressVolumeIsATmpfsOfTheProxysUserMadeOnce(t *testing.T) {
	cli := requireDocker(t)
	ctx := context.Background()
	name := uniqueName(t)
	removeVolumeAtCleanup(t, cli, EgressVolume(name))
	first, err := EnsureEgressVolume(ctx, cli, name)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cli.VolumeInspect(ctx, first, client.VolumeInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := res.Volume
	if v.Name != "jazzmine-egress-"+name || v.Driver != "local" || v.Labels[LabelManaged] != "true" || v.Labels[LabelSandbox] != name ||
		v.Options["type"] != "tmpfs" || !strings.Contains(v.Options["o"], "uid=65534,gid=65534") || !strings.Contains(v.Options["o"], "mode=0755") {
		t.Errorf("volume %s: driver=%s options=%v labels=%v", v.Name, v.Driver, v.Options, v.Labels)
	}
	again, err := EnsureEgressVolume(ctx, cli, name)
	if err != nil || again != first {
		t.Errorf("second EnsureEgressVolume = %q, %v; want the same %q", again, err, first)
	}

	// A volume of that name made otherwise (a plain directory, root's) is refused:
	// the proxy could not bind its socket in it.
	other := uniqueName(t)
	removeVolumeAtCleanup(t, cli, EgressVolume(other))
	labels := map[string]string{LabelSandbox: other}
	maps.Copy(labels, map[string]string{strings.Split(testLabel, "=")[0]: "imagebuild"})
	if _, err := cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: EgressVolume(other), Driver: "local", Labels: labels}); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureEgressVolume(ctx, cli, other); err == nil || !strings.Contains(err.Error(), "not the egress proxy's") {
		t.Errorf("err = %v, want a refusal of the plain volume", err)
	}
}

func TestTheSidecarsConfigCarriesThePrivateRangesAndItsChecksumCoversThem(t *testing.T) {
	sandboxes := []ProxySandbox{
		{Name: "b", Volume: "jazzmine-egress-b", Allowed: []string{"svc-b:8080"}},
		{Name: "a", Volume: "jazzmine-egress-a", Allowed: []string{"svc-a:8080", "*.corp.test:443"}, PrivateRanges: []string{"fd12:3456::/48", "10.20.0.0/16"}},
	}
	cfg, _, sum, err := proxyConfig("img:1", sandboxes)
	if err != nil {
		t.Fatal(err)
	}
	// The proxy reads the config as the sidecar would, with each sandbox's ranges.
	parsed, err := proxy.ParseConfig([]byte(cfg))
	if err != nil {
		t.Fatalf("the proxy refuses the sidecar's config %s: %v", cfg, err)
	}
	want := []proxy.Sandbox{
		{Name: "a", Socket: "/run/jazzmine/egress/a/proxy.sock", Allowed: []string{"*.corp.test:443", "svc-a:8080"}, PrivateRanges: []string{"10.20.0.0/16", "fd12:3456::/48"}},
		{Name: "b", Socket: "/run/jazzmine/egress/b/proxy.sock", Allowed: []string{"svc-b:8080"}},
	}
	if !reflect.DeepEqual(parsed.Sandboxes, want) {
		t.Fatalf("the proxy reads %+v from %s, want %+v", parsed.Sandboxes, cfg, want)
	}

	checksum := func(mutate func(sb []ProxySandbox)) string {
		t.Helper()
		sb := []ProxySandbox{sandboxes[0], sandboxes[1]}
		sb[1].PrivateRanges = slices.Clone(sb[1].PrivateRanges)
		mutate(sb)
		_, _, sum, err := proxyConfig("img:1", sb)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	if got := checksum(func(sb []ProxySandbox) { slices.Reverse(sb[1].PrivateRanges) }); got != sum {
		t.Errorf("the same ranges in another order changed the checksum: a sidecar would restart for nothing")
	}
	if got := checksum(func(sb []ProxySandbox) { sb[1].PrivateRanges = sb[1].PrivateRanges[:1] }); got == sum {
		t.Errorf("a range less left the checksum as it was: the sidecar would keep the old ranges")
	}
	if got := checksum(func(sb []ProxySandbox) { sb[0].PrivateRanges = []string{"10.20.0.0/16"} }); got == sum {
		t.Errorf("a range moved to another sandbox left the checksum as it was")
	}

	// What the proxy would refuse is refused before a sidecar is started.
	bad := []ProxySandbox{{Name: "a", Volume: "v", Allowed: []string{"svc-a:8080"}, PrivateRanges: []string{"127.0.0.0/8"}}}
	if _, _, _, err := proxyConfig("img:1", bad); !errors.Is(err, proxy.ErrInvalidConfig) || !strings.Contains(err.Error(), "sandboxes[0].private_ranges[0]") {
		t.Errorf("a loopback private range: got %v, want the proxy's config error", err)
	}
	var many []ProxySandbox
	for i := range proxy.DefaultMaxConns + 1 {
		many = append(many, ProxySandbox{Name: fmt.Sprintf("s%d", i), Volume: "v", Allowed: []string{"svc:80"}})
	}
	if _, _, _, err := proxyConfig("img:1", many); !errors.Is(err, proxy.ErrInvalidConfig) || !strings.Contains(err.Error(), "max_conns") {
		t.Errorf("more sandboxes than connections: got %v, want the proxy's config error", err)
	}
}

// TestTheSidecarServesEachSandboxOnItsOwnSocketAndRestartsOnlyWhenAllowlistsChange
// runs the sidecar with two sandboxes and, for each, a container as a sandbox's
// are made (uid 10001, no network, the volume read-only), which outlives the
// sidecar's restarts. The allowlists hold only addresses of the proxy's own
// loopback, so that nothing leaves the machine: an allowed target is answered
// 502 (nothing listens there), a refused one 403.
func TestTheSidecarServesEachSandboxOnItsOwnSocketAndRestartsOnlyWhenAllowlistsChange(t *testing.T) {
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
	sandboxCtr := map[string]string{}
	for _, allowed := range []string{"127.0.0.1:9", "127.0.0.1:10"} {
		name := uniqueName(t)
		removeVolumeAtCleanup(t, cli, EgressVolume(name))
		vol, err := EnsureEgressVolume(ctx, cli, name)
		if err != nil {
			t.Fatal(err)
		}
		sandboxes = append(sandboxes, ProxySandbox{Name: name, Volume: vol, Allowed: []string{allowed}})
		out, err := exec.Command("docker", "run", "-d", "--rm", "--label", testLabel, "--user", "10001:10001", "--network", "none",
			"--read-only", "--cap-drop", "ALL", "--mount", "type=volume,src="+vol+",dst=/run/jazzmine/egress,readonly,volume-nocopy",
			"--entrypoint", "sleep", DefaultBaseImage, "600").CombinedOutput()
		if err != nil {
			t.Fatalf("docker run: %v\n%s", err, out)
		}
		id := strings.TrimSpace(string(out))
		t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", id).Run() })
		sandboxCtr[name] = id
	}
	sidecar := "jazzmine-proxy-" + uniqueName(t)
	_, err = cli.NetworkInspect(ctx, EgressNetwork, client.NetworkInspectOptions{})
	egressExisted := err == nil
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", sidecar).CombinedOutput()
			t.Logf("sidecar log:\n%s", logs)
		}
		_, _ = cli.ContainerRemove(context.Background(), sidecar, client.ContainerRemoveOptions{Force: true})
		if !egressExisted { // the sidecar's network, made for this test; in use elsewhere, it stays
			_, _ = cli.NetworkRemove(context.Background(), EgressNetwork, client.NetworkRemoveOptions{})
		}
	})
	a, bName := sandboxes[0].Name, sandboxes[1].Name

	first, err := EnsureProxy(ctx, cli, sidecar, img.Tag, sandboxes)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Replaced {
		t.Error("the first EnsureProxy did not start a sidecar")
	}
	// What each sandbox sees: its own socket, and the proxy treats it as itself.
	checkAsks := func(when string, want map[string]map[string]string) {
		t.Helper()
		for sb, asks := range want {
			for target, answer := range asks {
				if got := askProxy(t, sandboxCtr[sb], target); !strings.Contains(got, answer) {
					t.Errorf("%s: sandbox %s asking for %s: got %q, want %q", when, sb, target, got, answer)
				}
			}
		}
	}
	checkAsks("first sidecar", map[string]map[string]string{
		a:     {"127.0.0.1:9": "502 Bad Gateway", "127.0.0.1:10": fmt.Sprintf("127.0.0.1:10 is not allowed for sandbox %s", a)},
		bName: {"127.0.0.1:10": "502 Bad Gateway", "127.0.0.1:9": fmt.Sprintf("127.0.0.1:9 is not allowed for sandbox %s", bName)},
	})
	// The mount is read-only: the socket can be connected to (above) but not
	// replaced, and it is the only thing there.
	out, err := exec.Command("docker", "exec", sandboxCtr[a], "python3", "-c", `
import os, socket
d = "/run/jazzmine/egress"
print(sorted(os.listdir(d)))
for what, f in [("unlink", lambda: os.unlink(d + "/proxy.sock")), ("rename", lambda: os.rename(d + "/proxy.sock", d + "/x")),
                ("bind", lambda: socket.socket(socket.AF_UNIX).bind(d + "/y.sock")), ("chmod", lambda: os.chmod(d + "/proxy.sock", 0o600))]:
    try:
        f()
        print(what, "succeeded")
    except OSError as e:
        print(what, os.strerror(e.errno))
`).CombinedOutput()
	if want := "['proxy.sock']\nunlink Read-only file system\nrename Read-only file system\nbind Read-only file system\nchmod Read-only file system\n"; err != nil || string(out) != want {
		t.Errorf("tampering with the socket: got %q, %v; want %q", out, err, want)
	}

	same, err := EnsureProxy(ctx, cli, sidecar, img.Tag, sandboxes)
	if err != nil || same.Replaced || same.ContainerID != first.ContainerID {
		t.Errorf("unchanged allowlists: %+v, %v; want the same sidecar, not restarted", same, err)
	}
	sandboxes[0].Allowed = append(sandboxes[0].Allowed, "127.0.0.1:10")
	changed, err := EnsureProxy(ctx, cli, sidecar, img.Tag, sandboxes)
	if err != nil || !changed.Replaced || changed.ContainerID == first.ContainerID {
		t.Errorf("changed allowlist: %+v, %v; want a new sidecar", changed, err)
	}
	// The new sidecar replaced the socket the old one left in the volume, which
	// the sandboxes' containers kept mounted, and a's new entry holds.
	checkAsks("after the change", map[string]map[string]string{
		a:     {"127.0.0.1:10": "502 Bad Gateway"},
		bName: {"127.0.0.1:9": fmt.Sprintf("127.0.0.1:9 is not allowed for sandbox %s", bName)},
	})
	// Private ranges are part of a sandbox's policy: a change restarts the sidecar.
	sandboxes[1].PrivateRanges = []string{"10.20.0.0/16"}
	ranged, err := EnsureProxy(ctx, cli, sidecar, img.Tag, sandboxes)
	if err != nil || !ranged.Replaced || ranged.ContainerID == changed.ContainerID {
		t.Errorf("changed private ranges: %+v, %v; want a new sidecar", ranged, err)
	}
	checkAsks("after the ranges changed", map[string]map[string]string{bName: {"127.0.0.1:10": "502 Bad Gateway"}})
}

// askProxy sends "CONNECT target" to the proxy's socket from inside the container,
// as the harness's relay would, and returns the whole answer. It retries connecting
// for a while: a sidecar just started may not listen yet.
func askProxy(t *testing.T, ctr, target string) string {
	t.Helper()
	out, err := exec.Command("docker", "exec", ctr, "python3", "-c", fmt.Sprintf(`
import socket, sys, time
deadline = time.monotonic() + 60
while True:
    c = socket.socket(socket.AF_UNIX)
    try:
        c.connect("/run/jazzmine/egress/proxy.sock")
        break
    except OSError:
        c.close()
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
c.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n")
c.settimeout(30)
out = b""
while True:
    b = c.recv(4096)
    if not b:
        break
    out += b
sys.stdout.write(out.decode())
`, target, target)).CombinedOutput()
	if err != nil {
		t.Fatalf("asking the proxy for %s from %s: %v\n%s", target, ctr[:12], err, out)
	}
	return string(out)
}
