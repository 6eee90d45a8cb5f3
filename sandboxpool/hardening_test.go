package sandboxpool_test

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// hardeningProbe reports what a script sees of its sandbox's hardening.
const hardeningProbe = `
import os, shutil, socket
found = {}
found["uid"] = os.getuid()
found["gid"] = os.getgid()
import getpass
found["user"] = getpass.getuser()
found["workspace_uid"] = os.stat("/workspace").st_uid
for line in open("/proc/self/status"):
    key, _, value = line.partition(":")
    if key == "CapEff":
        found["cap_eff"] = int(value.strip(), 16)
    if key == "NoNewPrivs":
        found["no_new_privs"] = int(value.strip())
try:
    open("/planted", "w")
    found["root_writable"] = True
except OSError:
    found["root_writable"] = False
open("/workspace/ok.txt", "w").write("fine")
found["workspace_writable"] = open("/workspace/ok.txt").read() == "fine"
try:
    with open("/workspace/big", "wb") as f:
        for _ in range(100):
            f.write(b"\0" * (1 << 20))
            f.flush()
    found["workspace_bounded"] = False
except OSError as e:
    found["workspace_bounded"] = e.errno == 28  # ENOSPC
found["tools"] = sorted(t for t in ("curl", "wget", "gcc", "cc", "make", "pip", "pip3", "apt-get", "dpkg", "nc") if shutil.which(t))
try:
    import pip
    found["pip_importable"] = True
except ImportError:
    found["pip_importable"] = False
found["interfaces"] = sorted(name for _, name in socket.if_nameindex())
found["netns"] = os.readlink("/proc/self/ns/net")
srv = socket.create_server(("127.0.0.1", 0))
cli = socket.create_connection(srv.getsockname(), timeout=5)
conn, _ = srv.accept()
cli.sendall(b"ping")
found["loopback_works"] = conn.recv(4) == b"ping"
emit_result(found)
`

// TestTheSandboxIsHardened proves the hardening of DESIGN.md section 6 from inside a
// running sandbox, with a script, as an attacker would find it, under each runtime.
func TestTheSandboxIsHardened(t *testing.T) {
	testenv.EachRuntime(t, testHardened)
}

func testHardened(t *testing.T, rt string) {
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandboxUnder(t, rt, "hard", 1, 1)}})
	l := checkout(t, p, "hard")
	defer l.Release()
	res := run(t, l, hardeningProbe)
	if !res.Success {
		t.Fatalf("probe failed: %s\n%s", res.Error, res.Traceback)
	}
	var got struct {
		UID               int      `json:"uid"`
		GID               int      `json:"gid"`
		User              string   `json:"user"`
		WorkspaceUID      int      `json:"workspace_uid"`
		CapEff            int      `json:"cap_eff"`
		NoNewPrivs        int      `json:"no_new_privs"`
		RootWritable      bool     `json:"root_writable"`
		WorkspaceWritable bool     `json:"workspace_writable"`
		WorkspaceBounded  bool     `json:"workspace_bounded"`
		Tools             []string `json:"tools"`
		PipImportable     bool     `json:"pip_importable"`
		Interfaces        []string `json:"interfaces"`
		NetNS             string   `json:"netns"`
		LoopbackWorks     bool     `json:"loopback_works"`
	}
	if err := json.Unmarshal(res.FinalData, &got); err != nil {
		t.Fatal(err)
	}
	hostNetNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		what string
		ok   bool
	}{
		{"uid is not 0", got.UID != 0},
		{"the uid is the container's own, of the sandboxes' range, the group sandbox's", got.UID >= sandboxpool.SandboxUIDBase && got.UID < sandboxpool.SandboxUIDBase+sandboxpool.SandboxUIDs && got.GID == sandboxpool.SandboxUID},
		{"getpass.getuser() is sandbox", got.User == sandboxpool.SandboxUser},
		{"the workspace is the uid's", got.WorkspaceUID == got.UID},
		{"effective capabilities are 0", got.CapEff == 0},
		{"NoNewPrivs is 1", got.NoNewPrivs == 1},
		{"writing to / fails", !got.RootWritable},
		{"the workspace is writable", got.WorkspaceWritable},
		{"the workspace is bounded (64 MiB tmpfs)", got.WorkspaceBounded},
		{"curl, wget, gcc, make, pip, apt and dpkg are absent", len(got.Tools) == 0 && !got.PipImportable},
		{"there is no network but loopback", len(got.Interfaces) == 1 && got.Interfaces[0] == "lo"},
		{"the network namespace is the container's own", got.NetNS != "" && got.NetNS != hostNetNS},
		{"loopback is up", got.LoopbackWorks},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: probe saw %s", c.what, res.FinalData)
		}
	}
}

// TestAForkBombIsStoppedByThePIDsLimit: a script's processes stop at the PIDs limit,
// under runc the PIDs cgroup's, under gVisor RLIMIT_NPROC counted by its kernel
// (container.go). The sandbox has 2 GiB: under gVisor each process a script forks
// costs about 11.6 MB of the sandbox's memory (0.8 MB under runc; 125 took 1.45 GB
// here), so that at the default 512 MiB the memory limit ends such a bomb first (the
// hostile suite's row).
func TestAForkBombIsStoppedByThePIDsLimit(t *testing.T) {
	testenv.EachRuntime(t, testForkBomb)
}

func testForkBomb(t *testing.T, rt string) {
	sb := sandboxUnder(t, rt, "fork", 1, 0)
	sb.MemoryBytes = 2 << 30
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
	l := checkout(t, p, "fork")
	res := run(t, l, `
import os, time
children = 0
try:
    while children < 10000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
    emit_result({"stopped": False, "children": children})
except OSError as e:
    emit_result({"stopped": True, "children": children})
`, func(r *harness.Request) { r.Timeout = 90 * time.Second }) // a fork takes up to ~100 ms under gVisor on a busy host
	var got struct {
		Stopped  bool `json:"stopped"`
		Children int  `json:"children"`
	}
	if err := json.Unmarshal(res.FinalData, &got); err != nil || !got.Stopped || got.Children > 128 {
		t.Fatalf("fork bomb result %s (%s): want it stopped below 128 processes", res.FinalData, res.Error)
	}
	id := l.ContainerID()
	l.Release()
	// The same container serves the next execution: reset killed the bomb's processes.
	next := checkout(t, p, "fork")
	defer next.Release()
	if next.ContainerID() != id {
		t.Fatalf("got container %s, want the reset %s back", next.ContainerID(), id)
	}
	after := run(t, next, "import os\nemit_result(len([p for p in os.listdir('/proc') if p.isdigit()]))")
	var procs int
	if err := json.Unmarshal(after.FinalData, &procs); err != nil || procs > 5 {
		t.Errorf("processes in the container after reset = %s (%s), want the harness (PID 1), the zygote and the script", after.FinalData, after.Error)
	}
}

func TestAMemoryBombEndsInOOMAndTheContainerIsReplaced(t *testing.T) {
	testenv.EachRuntime(t, testMemoryBomb)
}

func testMemoryBomb(t *testing.T, rt string) {
	p := newPool(t, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandboxUnder(t, rt, "oom", 1, 0)}})
	l := checkout(t, p, "oom")
	id := l.ContainerID()
	res := run(t, l, "x = bytearray(1 << 30)\nemit_result(len(x))")
	if res.Success || res.ErrorKind != harness.KindOOM {
		t.Errorf("1 GiB allocation under a 512 MiB limit: success=%v kind=%q error=%q, want an oom error", res.Success, res.ErrorKind, res.Error)
	}
	l.Release()
	testenv.WaitFor(t, 60*time.Second, "a new warm container should replace the one that ran out of memory", func() bool {
		s := stats(p, "oom")
		return s.Retired[sandboxpool.RetireOOM] == 1 && s.Idle == 1
	})
	next := checkout(t, p, "oom")
	defer next.Release()
	if next.ContainerID() == id {
		t.Error("the container that ran out of memory was lent again")
	}
}
