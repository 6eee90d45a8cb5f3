// Package sandboxpool owns the Docker containers of each sandbox: spawning,
// attaching, the ready handshake (and what each sandbox's harness said it loaded:
// [Pool.Ready]), the warm idle queue, checkout and return,
// overflow, recycling, health checks, reaping of orphans and shutdown; and the
// hardening of each container, under runc or gVisor's runsc (runtime.go).
//
// It knows Docker but not NATS. It does not build images (see imagebuild) and
// does not interpret executions (see harness).
package sandboxpool
