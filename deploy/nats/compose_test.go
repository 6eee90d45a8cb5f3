package nats_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
// sandboxes. The nodes enforce auth.conf with the keys compose.sh made: a client
// without them is refused, the job is submitted by an agent of the tenant agents
// (agent.seed), and the fleet's streams and buckets are read as a worker
// (worker.seed).
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
	runDir := t.TempDir()
	env := []string{
		fmt.Sprintf("COMPOSE_PROJECT_NAME=jazzmine-test-%d", suffix),
		"JAZZMINE_DATA_DIR=" + data, "JAZZMINE_RUN_DIR=" + runDir, "WORKER_IMAGE=" + workerImage, "WAIT_SECONDS=240",
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
	var upOut, upLog strings.Builder
	up.Stdout, up.Stderr = &upOut, &upLog
	if err := up.Run(); err != nil {
		logs := exec.Command(filepath.Join(dir, "compose.sh"), "logs", "--no-color", "--tail", "50")
		logs.Env = up.Env
		more, _ := logs.CombinedOutput()
		t.Fatalf("compose.sh up: %v\n%s%s\n%s", err, upLog.String(), upOut.String(), more)
	}

	// What compose.sh up prints an agent to run works: the worker binary, the
	// cluster's URL and the agent's seed.
	hint := strings.TrimSpace(upOut.String())
	if !strings.Contains(hint, "./bin/worker submit --nkey "+filepath.Join(runDir, "agent.seed")) {
		t.Fatalf("compose.sh up does not say how an agent submits with its seed: %q", hint)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer scancel()
	submit := exec.CommandContext(sctx, "sh", "-c", strings.Replace(hint, "./bin/worker", testenv.WorkerBinary(t), 1))
	if out, err := submit.CombinedOutput(); err != nil || !strings.Contains(string(out), "done: success") {
		t.Errorf("%s: %v\n%s", hint, err, out)
	}

	natsURL := strings.Join(urls, ",")
	if nc, err := nats.Connect(natsURL); !errors.Is(err, nats.ErrAuthorization) {
		if err == nil {
			nc.Close()
		}
		t.Errorf("connect without credentials: err = %v, want an authorization violation", err)
	}
	wnc := connect(t, natsURL, "compose-test-worker", filepath.Join(runDir, "worker.seed"))
	js, err := jetstream.New(wnc)
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

	anc := connect(t, natsURL, "compose-test-agent", filepath.Join(runDir, "agent.seed"))
	c, err := client.New(client.Config{Conn: anc})
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
	// The job went through the tenant's account: the fleet stored its result under
	// the tenant's name.
	events, err := js.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	testenv.StoredMsg(t, events, wire.EventSubject("agents."+res.ExecutionID, wire.EventScriptDone))

	run(env, "compose.sh", "down") // SIGTERM to the workers first, then the nodes
	for _, id := range workerIDs {
		if left := testenv.ContainersOf(t, id); len(left) != 0 {
			t.Errorf("sandboxes of %s left after compose down: %v", id, left)
		}
	}
}
