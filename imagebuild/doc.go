// Package imagebuild owns sandbox specifications (the YAML registry), the image
// checksum and tag, the generated hardened Dockerfile, image builds over the
// Docker Engine API, sandbox networks and the egress proxy sidecar.
//
// It knows Docker but not NATS. It does not run containers for executions
// (see sandboxpool).
package imagebuild
