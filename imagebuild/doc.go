// Package imagebuild owns the sandbox registry (the YAML config file), the
// image checksum and tag, the generated hardened Dockerfile and image builds
// over the Docker Engine API. The egress proxy sidecar and the volumes that
// hold its per-sandbox sockets belong here too.
//
// [LoadConfig] reads the config file into a [Config]: one [Spec] per sandbox,
// with defaults applied, tool files read and wheelhouses hashed, and every
// problem reported with the sandbox and field it concerns.
//
// A sandbox's image is tagged jazzmine-sandbox-<name>:<checksum prefix> (see
// [Tag]). The [Checksum] covers the base image's id, the generated
// [Dockerfile], the harness, the tools, the Debian packages (apt_packages,
// installed from the base image's apt sources), the requirements and the
// wheelhouse;
// [Builder.Ensure] builds only when no image has that tag, so an unchanged
// sandbox never rebuilds, and concurrent callers share one build. Images are
// built with the classic builder from an in-memory build context; nothing is
// ever pulled: the base image comes from "make base-image".
//
// The image runs the harness as its entrypoint, as user sandbox (uid 10001; the
// pool runs each container as a uid of its own, with the group sandbox),
// with the tools read-only in /tools, and without curl, wget, netcat, socat,
// compilers, assemblers, linkers, make, apt, dpkg or pip, whatever its
// apt_packages brought in.
//
// Docker is reached through the narrow [Docker] interface (implemented by the
// Engine SDK's *client.Client, see [Connect]) so that tests can fake it. The
// package knows Docker but not NATS. It does not run containers for executions
// (sandboxpool does, with the Spec's resources, mounts and pool settings, and
// the sandbox's egress volume).
package imagebuild
