package sandboxpool_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// TestExecutionsRunUnderGVisorWhenTheSandboxAsksForRunsc runs the harness's executions
// in a sandbox with runtime: runsc, as make gvisor registers it: each in gVisor's
// kernel, not the host's, after a reset of the same container.
func TestExecutionsRunUnderGVisorWhenTheSandboxAsksForRunsc(t *testing.T) {
	testenv.RequireRuntime(t, sandboxpool.GVisor)
	sb := sandboxUnder(t, sandboxpool.GVisor, "gvisor", 1, 0)
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
			if rt := info.Container.HostConfig.Runtime; rt != sandboxpool.GVisor {
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
