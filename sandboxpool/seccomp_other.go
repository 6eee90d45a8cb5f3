//go:build !linux

package sandboxpool

// seccompFor is empty on a worker built for another system than Linux (a developer's
// macOS with Docker Desktop): github.com/moby/profiles/seccomp exports Docker's default
// profile only on Linux, so its sandboxes get the engine's own default profile, without
// the denials of seccomp.go (ptrace among them). Production workers are Linux binaries.
func seccompFor(string) []string { return nil }
