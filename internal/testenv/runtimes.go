package testenv

import (
	"context"
	"maps"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/sandboxpool"
)

// Runtimes are the isolation tiers that the red-team, hostile and isolation suites
// run under: runc, the host's kernel behind the seccomp profile, and gVisor's runsc,
// a kernel of its own (make gvisor registers it).
var Runtimes = []string{"runc", sandboxpool.GVisor}

// EachRuntime runs f as a subtest named after each of Runtimes, side by side
// (t.Parallel): each builds a world of its own. The subtest of a runtime the engine
// lacks is skipped, or fails with JAZZMINE_REQUIRE_GVISOR=1 (as in CI; see
// RequireRuntime).
func EachRuntime(t *testing.T, f func(t *testing.T, runtime string)) {
	t.Helper()
	eachRuntime(t, true, f)
}

// EachRuntimeInTurn is EachRuntime one runtime after the other, for worlds that share
// what a Docker host has one of (the egress proxy's sidecar).
func EachRuntimeInTurn(t *testing.T, f func(t *testing.T, runtime string)) {
	t.Helper()
	eachRuntime(t, false, f)
}

func eachRuntime(t *testing.T, parallel bool, f func(t *testing.T, runtime string)) {
	t.Helper()
	for _, rt := range Runtimes {
		t.Run(rt, func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			RequireRuntime(t, rt)
			f(t, rt)
		})
	}
}

// RequireRuntime skips the test unless the engine has the OCI runtime name
// (daemon.json "runtimes"). For gVisor's runsc it fails instead when
// JAZZMINE_REQUIRE_GVISOR=1, as CI sets it after make gvisor: there a missing runsc
// is a broken setup, not a machine without it.
func RequireRuntime(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := Docker(t).Info(ctx, client.InfoOptions{})
	if err != nil {
		t.Fatalf("engine info: %v", err)
	}
	if _, ok := info.Info.Runtimes[name]; ok {
		return
	}
	have := slices.Sorted(maps.Keys(info.Info.Runtimes))
	if name == sandboxpool.GVisor && os.Getenv("JAZZMINE_REQUIRE_GVISOR") == "1" {
		t.Fatalf("gVisor is required (JAZZMINE_REQUIRE_GVISOR=1) but the engine has no %q runtime (it has %v): run make gvisor", name, have)
	}
	t.Skipf("the engine has no %q runtime (it has %v; make gvisor registers runsc)", name, have)
}
