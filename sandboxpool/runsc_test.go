package sandboxpool_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/sandboxpool"
)

// requireRuntime skips the test unless the engine has the OCI runtime name registered
// (daemon.json "runtimes"). CI does not register runsc, so this never fails a run there.
func requireRuntime(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := docker(t).Info(ctx, client.InfoOptions{})
	if err != nil {
		t.Fatalf("engine info: %v", err)
	}
	if _, ok := info.Info.Runtimes[name]; !ok {
		t.Skipf("the engine has no %q runtime (it has %v)", name, info.Info.Runtimes)
	}
}

// TestExecutionsRunUnderGVisorWhenTheSandboxAsksForRunsc runs the harness's executions
// in a sandbox with runtime: runsc, where the engine has gVisor registered. gVisor's
// runsc of Debian bookworm (release 20221219) needs "runtimeArgs": ["--network=none"]
// beside its path in daemon.json: with its default network mode it fails to start a
// container of network "none" ("cannot run with network enabled in root network
// namespace"), and a sandbox has no network.
func TestExecutionsRunUnderGVisorWhenTheSandboxAsksForRunsc(t *testing.T) {
	requireRuntime(t, "runsc")
	sb := sandbox(t, "gvisor", 1, 0)
	sb.Runtime = "runsc"
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
	hostRelease, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}

	// Three executions in turn, so that each but the first runs after a reset.
	var container string
	for i := range 3 {
		l := checkout(t, p, "gvisor")
		res := run(t, l, `
import os
found = {"uid": os.getuid(), "release": os.uname().release, "leftover": os.listdir("/workspace")}
open("/workspace/mark", "w").write("from an earlier execution")
emit_result(found)
`)
		id := l.ContainerID()
		l.Release()
		if !res.Success {
			t.Fatalf("execution %d under runsc: %s\n%s", i, res.Error, res.Traceback)
		}
		var got struct {
			UID      int      `json:"uid"`
			Release  string   `json:"release"`
			Leftover []string `json:"leftover"`
		}
		if err := json.Unmarshal(res.FinalData, &got); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			container = id
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			info, err := docker(t).ContainerInspect(ctx, id, client.ContainerInspectOptions{})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if rt := info.Container.HostConfig.Runtime; rt != "runsc" {
				t.Errorf("the container's runtime is %q, want runsc", rt)
			}
		}
		if id != container {
			t.Errorf("execution %d ran in container %s, want the reset %s again", i, id, container)
		}
		if got.Release == strings.TrimSpace(string(hostRelease)) {
			t.Errorf("the script saw the host's kernel (%s): not gVisor's", got.Release)
		}
		if got.UID < sandboxpool.SandboxUIDBase || got.UID >= sandboxpool.SandboxUIDBase+sandboxpool.SandboxUIDs || len(got.Leftover) != 0 {
			t.Errorf("execution %d saw uid %d and /workspace %v, want a uid of the sandboxes' range and nothing left", i, got.UID, got.Leftover)
		}
	}
}
