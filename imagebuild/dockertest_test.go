package imagebuild

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// testLabel is on every container the tests run, so that they can be told apart.
const testLabel = "jazzmine.test=imagebuild"

// requireDocker returns a client of the local engine. Without one the test is
// skipped, or fails when JAZZMINE_REQUIRE_DOCKER=1 (as in CI). It also needs the
// docker CLI (to run containers) and the base image.
func requireDocker(t *testing.T) *client.Client {
	t.Helper()
	unavailable := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("JAZZMINE_REQUIRE_DOCKER") == "1" {
			t.Fatalf("JAZZMINE_REQUIRE_DOCKER=1: "+format, args...)
		}
		t.Skipf(format+" (JAZZMINE_REQUIRE_DOCKER=1 makes this a failure)", args...)
	}
	if testing.Short() && os.Getenv("JAZZMINE_REQUIRE_DOCKER") != "1" {
		t.Skip("builds images on the local Docker engine; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cli, err := Connect(ctx)
	if err != nil {
		unavailable("no Docker engine: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	if _, err := exec.LookPath("docker"); err != nil {
		unavailable("the docker CLI is not on PATH: %v", err)
	}
	if _, err := cli.ImageInspect(ctx, DefaultBaseImage); err != nil {
		if errdefs.IsNotFound(err) {
			unavailable("the base image %s is missing: run make base-image", DefaultBaseImage)
		}
		t.Fatalf("inspect %s: %v", DefaultBaseImage, err)
	}
	return cli
}

// uniqueName returns a sandbox name no other test run uses: test<random hex>.
func uniqueName(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "test" + hex.EncodeToString(b)
}

// removeImageAtCleanup removes the image with id, and its untagged parents, when
// the test ends.
func removeImageAtCleanup(t *testing.T, cli *client.Client, id string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := cli.ImageRemove(ctx, id, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("remove image %s: %v", id, err)
		}
	})
}

// dockerRun runs `docker run --rm` with args (options, image, command) and
// stdin, and returns stdout; a non-zero exit fails the test.
func dockerRun(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := append([]string{"run", "--rm", "-i", "--label", testLabel, "--network", "none"}, args...)
	cmd := exec.CommandContext(ctx, "docker", full...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("docker %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(full, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}
