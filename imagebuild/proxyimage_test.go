package imagebuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTheProxyImageRunsTheStaticWorkerFromScratch builds the sidecar's image from a
// static build of cmd/worker and runs it: it listens on the socket of its config,
// as nobody, with nothing else in the image.
func TestTheProxyImageRunsTheStaticWorkerFromScratch(t *testing.T) {
	cli := requireDocker(t)
	binary := append(staticWorker(t), []byte(t.Name())...) // a tag of this test's own, removed after it
	b, err := NewBuilder(BuilderConfig{Docker: cli})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	img, err := b.EnsureProxyImage(ctx, binary)
	if err != nil {
		t.Fatal(err)
	}
	removeImageAtCleanup(t, cli, img.ID)
	if !img.Built || !strings.HasPrefix(img.Tag, ProxyRepository+":") {
		t.Errorf("first EnsureProxyImage = %+v, want a build", img)
	}
	again, err := b.EnsureProxyImage(ctx, binary)
	if err != nil || again.Built || again.ID != img.ID {
		t.Errorf("second EnsureProxyImage = %+v, %v; want the same image, not built", again, err)
	}
	cfg := `{"sandboxes":[{"name":"a","socket":"/run/egress/a/proxy.sock","allowed":["svc-a:8080"]}]}`
	out, err := exec.Command("docker", "run", "-d", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
		"--tmpfs", "/run/egress/a:uid=65534,gid=65534,mode=0755", "--label", testLabel, "-e", "JAZZMINE_PROXY_CONFIG="+cfg, img.Tag).Output()
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", id).Run() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		logs, _ := exec.Command("docker", "logs", id).CombinedOutput()
		if strings.Contains(string(logs), `"msg":"proxy: listening"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not start:\n%s", logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	user, _ := exec.Command("docker", "inspect", "-f", "{{.Config.User}}", id).Output()
	if strings.TrimSpace(string(user)) != "65534:65534" {
		t.Errorf("the proxy runs as %q, want nobody", user)
	}
}

var (
	staticOnce sync.Once
	staticBin  []byte
	staticErr  error
)

// staticWorker is cmd/worker built with CGO_ENABLED=0, once per test binary.
func staticWorker(t *testing.T) []byte {
	t.Helper()
	staticOnce.Do(func() {
		dir, err := os.MkdirTemp("", "jazzmine-static-")
		if err != nil {
			staticErr = err
			return
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "worker")
		build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/worker")
		build.Dir = ".."
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			staticErr = fmt.Errorf("static build of cmd/worker: %v\n%s", err, out)
			return
		}
		staticBin, staticErr = os.ReadFile(bin)
	})
	if staticErr != nil {
		t.Fatal(staticErr)
	}
	return staticBin
}
