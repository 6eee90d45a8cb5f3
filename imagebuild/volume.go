package imagebuild

import (
	"context"
	"fmt"
	"maps"

	"github.com/moby/moby/client"
)

// VolumeDocker is the part of the Engine API that egress volumes need;
// *client.Client satisfies it.
type VolumeDocker interface {
	VolumeCreate(ctx context.Context, options client.VolumeCreateOptions) (client.VolumeCreateResult, error)
}

var _ VolumeDocker = (*client.Client)(nil)

// EgressVolume is the name of the sandbox's egress volume.
func EgressVolume(sandbox string) string { return "jazzmine-egress-" + sandbox }

// egressVolumeOptions make an egress volume a small tmpfs of the local driver,
// owned by the proxy's user, which binds the sandbox's socket in it; mode 0755
// lets the sandbox's user reach the socket and nothing else. A tmpfs, because
// a socket is no data: nothing in the volume outlives the last container that
// mounts it, and a stale socket never lies on disk.
var egressVolumeOptions = map[string]string{
	"type":   "tmpfs",
	"device": "tmpfs",
	"o":      fmt.Sprintf("size=64k,nr_inodes=16,mode=0755,uid=%d,gid=%d,nosuid,nodev,noexec", proxyUID, proxyUID),
}

// EnsureEgressVolume returns the name of the sandbox's egress volume,
// EgressVolume(sandbox), creating it if needed: a tmpfs owned by the proxy's
// user, labelled jazzmine.managed and jazzmine.sandbox. The proxy sidecar
// mounts it read-write and binds the sandbox's socket (ProxySocket) in it; the
// sandbox's containers, and only they, mount it read-only. Workers racing to
// create it end up with the same one. A volume of that name with other options
// or of another sandbox is an error, never used. Volumes are not removed: like
// the sidecar, they outlive workers.
func EnsureEgressVolume(ctx context.Context, d VolumeDocker, sandbox string) (string, error) {
	name := EgressVolume(sandbox)
	// Creating a volume that exists returns the existing one, options and all.
	res, err := d.VolumeCreate(ctx, client.VolumeCreateOptions{
		Name:       name,
		Driver:     "local",
		DriverOpts: egressVolumeOptions,
		Labels:     map[string]string{LabelManaged: "true", LabelSandbox: sandbox},
	})
	if err != nil {
		return "", fmt.Errorf("create volume %s for sandbox %q: %w", name, sandbox, err)
	}
	v := res.Volume
	if v.Driver != "local" || !maps.Equal(v.Options, egressVolumeOptions) {
		return "", fmt.Errorf("volume %s exists with driver %q and options %v, not the egress proxy's: remove it (docker volume rm %s) and restart", name, v.Driver, v.Options, name)
	}
	if v.Labels[LabelSandbox] != sandbox {
		return "", fmt.Errorf("volume %s belongs to sandbox %q, not %q", name, v.Labels[LabelSandbox], sandbox)
	}
	return name, nil
}
