package nats_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// TestTheComposeFileRunsAClusterAndTwoWorkers brings docker-compose.yml up with
// compose.sh, as `make compose-up` does (three NATS nodes from the image images.sh
// builds, two workers in containers driving the host's Docker), runs a job through
// it that reads and writes the data directory, checks that both workers joined and
// that everything has three replicas, and brings it down: the workers remove their
// sandboxes.
func TestTheComposeFileRunsAClusterAndTwoWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("the compose test starts five containers; -short skips it")
	}
	testenv.Docker(t)
	if exec.Command("docker-compose", "version").Run() != nil && exec.Command("docker", "compose", "version").Run() != nil {
		if os.Getenv("JAZZMINE_REQUIRE_DOCKER") == "1" {
			t.Fatal("neither docker-compose nor docker compose is installed")
		}
		t.Skip("neither docker-compose nor docker compose is installed")
	}
	testenv.SandboxImage(t) // the workers find it and build nothing
	dir := filepath.Join(testenv.RepoRoot(), "deploy", "nats")
	run := func(env []string, name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(dir, name), args...)
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	suffix := time.Now().UnixNano() % 1_000_000
	workerImage := fmt.Sprintf("jazzmine-worker:compose-test-%d", suffix)
	run(nil, "images.sh", "nats") // nothing to do when the image exists
	run([]string{"WORKER_BINARY=" + testenv.WorkerBinary(t), "WORKER_IMAGE=" + workerImage}, "images.sh", "worker")
	t.Cleanup(func() { _ = exec.Command("docker", "image", "rm", workerImage).Run() })

	data := t.TempDir()
	if err := os.Chmod(data, 0o777); err != nil { // sandboxes run as uid 10001
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "input.txt"), []byte("for the fleet"), 0o644); err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 3)
	env := []string{
		fmt.Sprintf("COMPOSE_PROJECT_NAME=jazzmine-test-%d", suffix),
		"JAZZMINE_DATA_DIR=" + data, "JAZZMINE_RUN_DIR=" + t.TempDir(), "WORKER_IMAGE=" + workerImage, "WAIT_SECONDS=240",
	}
	var urls []string
	for i, p := range ports {
		env = append(env, fmt.Sprintf("JAZZMINE_NATS_PORT_%d=%d", i+1, p))
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var workerIDs []string
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(dir, "compose.sh"), "down")
		cmd.Env = append(os.Environ(), append(env, "WIPE=1")...)
		if out, err := cmd.CombinedOutput(); err != nil || t.Failed() {
			t.Logf("compose.sh down: %v\n%s", err, out)
		}
		for _, id := range workerIDs {
			testenv.RemoveContainersOf(t, id)
		}
	})
	up := exec.Command(filepath.Join(dir, "compose.sh"), "up")
	up.Env = append(os.Environ(), env...)
	if out, err := up.CombinedOutput(); err != nil {
		logs := exec.Command(filepath.Join(dir, "compose.sh"), "logs", "--no-color", "--tail", "50")
		logs.Env = up.Env
		more, _ := logs.CombinedOutput()
		t.Fatalf("compose.sh up: %v\n%s\n%s", err, out, more)
	}

	nc := connect(t, strings.Join(urls, ","), "compose-test")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kv, err := js.KeyValue(ctx, worker.BucketWorkers)
	if err != nil {
		t.Fatal(err)
	}
	if workerIDs, err = kv.Keys(ctx); err != nil || len(workerIDs) != 2 {
		t.Fatalf("live workers: %v, %v; want the two of the compose file", workerIDs, err)
	}
	checkReplicas(t, js, 12)

	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: `text = open("/data/input.txt").read()
open("/data/output.txt", "w").write(text.upper())
emit_result(text)`})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || res.FinalData != "for the fleet" || !slices.Contains(workerIDs, res.WorkerID) {
		t.Errorf("result: success %v, data %v, worker %s, error %s %s", res.Success, res.FinalData, res.WorkerID, res.ErrorKind, res.Error)
	}
	if out, err := os.ReadFile(filepath.Join(data, "output.txt")); err != nil || string(out) != "FOR THE FLEET" {
		t.Errorf("output.txt on the host: %q, %v", out, err)
	}

	run(env, "compose.sh", "down") // SIGTERM to the workers first, then the nodes
	for _, id := range workerIDs {
		if left := testenv.ContainersOf(t, id); len(left) != 0 {
			t.Errorf("sandboxes of %s left after compose down: %v", id, left)
		}
	}
}
