package nats_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mobyclient "github.com/moby/moby/client"
	"github.com/nats-io/nats.go"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// TestAWorkerInAContainerMountsAWorkerSidePathThroughHostPathMap runs the worker's
// image (worker.Dockerfile, built by images.sh around the static binary) as a
// container that drives the host's Docker through its socket, its embedded NATS
// server published on a loopback port. Its sandbox bind-mounts /data, a path in the
// worker's container, which host_path_map maps to the host directory that the
// worker's container mounts at /data. A job reads a file the test wrote there and
// writes one back, which the test reads on the host. At SIGTERM the worker removes
// its sandboxes.
func TestAWorkerInAContainerMountsAWorkerSidePathThroughHostPathMap(t *testing.T) {
	testenv.SandboxImage(t) // the worker finds the image of the same sandbox and builds nothing
	docker := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("docker", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	suffix := time.Now().UnixNano() % 1_000_000
	image := fmt.Sprintf("jazzmine-worker:dood-test-%d", suffix)
	build := exec.Command(filepath.Join(testenv.RepoRoot(), "deploy", "nats", "images.sh"), "worker")
	build.Env = append(os.Environ(), "WORKER_BINARY="+testenv.WorkerBinary(t), "WORKER_IMAGE="+image)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("images.sh worker: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "image", "rm", image).Run() })

	// The host's directory, which the worker knows as /data only.
	hostData := t.TempDir()
	if err := os.Chmod(hostData, 0o777); err != nil { // sandboxes run as uid 10001
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostData, "input.txt"), []byte("written on the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	confDir := t.TempDir()
	config := fmt.Sprintf(`host_path_map:
  /data: %q
sandboxes:
  default:
    tools: [tools/*.py]
    mounts: [{source: /data, target: /data, read_only: false}]
    pool: {size: 1, max_overflow: 0}
`, hostData)
	if err := os.WriteFile(filepath.Join(confDir, "config.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}

	id := fmt.Sprintf("dood-%d", suffix)
	t.Cleanup(func() { testenv.RemoveContainersOf(t, id) }) // after the worker's container is gone
	worker := docker("run", "--detach",
		"--label", "jazzmine.managed=true", "--label", "jazzmine.test=deploy",
		"--volume", "/var/run/docker.sock:/var/run/docker.sock",
		"--volume", hostData+":/data",
		"--volume", filepath.Join(confDir, "config.yaml")+":/etc/jazzmine/config.yaml:ro",
		"--volume", filepath.Join(testenv.RepoRoot(), "examples", "tools")+":/etc/jazzmine/tools:ro",
		"--tmpfs", "/var/lib/jazzmine", // the embedded NATS server's store
		"--publish", "127.0.0.1::4222",
		image, "serve", "--config", "/etc/jazzmine/config.yaml", "--worker-id", id,
		"--nats-listen", "0.0.0.0:4222", "--store-dir", "/var/lib/jazzmine/nats", "--metrics-addr", "")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("docker", "logs", worker).CombinedOutput()
			t.Logf("log of the worker's container:\n%s", out)
		}
		_ = exec.Command("docker", "rm", "--force", worker).Run()
	})
	testenv.WaitFor(t, 3*time.Minute, "the worker in its container to serve", func() bool {
		if state := docker("inspect", "--format", "{{.State.Status}}", worker); state != "running" {
			t.Fatalf("the worker's container is %s", state)
		}
		out, _ := exec.Command("docker", "logs", worker).CombinedOutput()
		return strings.Contains(string(out), "msg=serving")
	})

	nc, err := nats.Connect("nats://" + docker("port", worker, "4222/tcp"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: `text = open("/data/input.txt").read()
open("/data/output.txt", "w").write(text.upper())
emit_result(text)`})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || res.FinalData != "written on the host" {
		t.Errorf("result: success %v, data %v, error %s %s", res.Success, res.FinalData, res.ErrorKind, res.Error)
	}
	if out, err := os.ReadFile(filepath.Join(hostData, "output.txt")); err != nil || string(out) != "WRITTEN ON THE HOST" {
		t.Errorf("output.txt on the host: %q, %v", out, err)
	}
	// Docker was given the host's path, not the worker's.
	sandboxes := testenv.ContainersOf(t, id)
	if len(sandboxes) == 0 {
		t.Fatal("the worker has no sandbox container")
	}
	info, err := testenv.Docker(t).ContainerInspect(ctx, sandboxes[0], mobyclient.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for _, m := range info.Container.Mounts {
		if m.Destination == "/data" {
			sources = append(sources, m.Source)
		}
	}
	if len(sources) != 1 || sources[0] != hostData {
		t.Errorf("the sandbox mounts %v at /data, want the host's %s", sources, hostData)
	}

	docker("stop", "--time", "60", worker) // SIGTERM, then the worker's shutdown
	if code := docker("inspect", "--format", "{{.State.ExitCode}}", worker); code != "0" {
		t.Errorf("the worker exited with %s", code)
	}
	if left := testenv.ContainersOf(t, id); len(left) != 0 {
		t.Errorf("sandboxes left after the worker's shutdown: %v", left)
	}
}
