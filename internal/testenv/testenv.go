// Package testenv gives tests the real components they run against: the local Docker
// engine, the example sandbox image built by imagebuild, and an in-process NATS server
// with JetStream. It is for tests only.
package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jazzmine/worker/imagebuild"
)

var (
	dockerOnce sync.Once
	dockerCli  *client.Client
	dockerErr  error

	imagesMu sync.Mutex                   // guards images
	images   = map[string]*exampleImage{} // by sandbox name

	binMu  sync.Mutex           // guards binDir and bins
	binDir string               // holds the binaries StaticBinary built; removed by Main
	bins   = map[string]error{} // by package: the build's error, nil once built
)

// StaticBinary builds the main package pkg ("./cmd/worker", relative to the
// repository root, or a module path such as github.com/nats-io/nats-server/v2) with
// CGO_ENABLED=0, once per test binary, and returns the executable's path. A static
// executable runs as a process of the test or in an image FROM scratch.
func StaticBinary(t testing.TB, pkg string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if binDir == "" {
		dir, err := os.MkdirTemp("", "jazzmine-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	path := filepath.Join(binDir, strings.NewReplacer("/", "_", ".", "_").Replace(pkg))
	err, built := bins[pkg]
	if !built {
		cmd := exec.Command("go", "build", "-trimpath", "-o", path, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Dir = RepoRoot()
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build %s: %v\n%s", pkg, berr, out)
		}
		bins[pkg] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// WorkerBinary is the static `worker` executable (cmd/worker), built once per test
// binary.
func WorkerBinary(t testing.TB) string { return StaticBinary(t, "./cmd/worker") }

// Docker returns a client for the local engine, shared by the tests of a package.
// Without an engine the test is skipped, or fails when JAZZMINE_REQUIRE_DOCKER=1 (as
// in CI).
func Docker(t testing.TB) *client.Client {
	t.Helper()
	dockerOnce.Do(func() {
		dockerCli, dockerErr = client.New(client.FromEnv, client.WithAPIVersionNegotiation())
		if dockerErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, dockerErr = dockerCli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
		}
	})
	if dockerErr != nil {
		if os.Getenv("JAZZMINE_REQUIRE_DOCKER") == "1" {
			t.Fatalf("Docker is required (JAZZMINE_REQUIRE_DOCKER=1) but unreachable: %v", dockerErr)
		}
		t.Skipf("no Docker engine: %v", dockerErr)
	}
	return dockerCli
}

// CloseDocker closes the shared client (its idle connections would otherwise look
// like leaked goroutines); call it from TestMain after the tests.
func CloseDocker() {
	if dockerCli != nil {
		dockerCli.Close()
	}
}

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ExampleConfigPath is the example config that make run and make demo use.
func ExampleConfigPath() string { return filepath.Join(RepoRoot(), "examples", "config.yaml") }

// ExampleConfig loads the example config.
func ExampleConfig(t testing.TB) *imagebuild.Config {
	t.Helper()
	cfg, err := imagebuild.LoadConfig(ExampleConfigPath())
	if err != nil {
		t.Fatalf("load the example config: %v", err)
	}
	return cfg
}

// exampleImage is the image of one sandbox of the example config, built once.
type exampleImage struct {
	once  sync.Once
	image imagebuild.Image
	err   error
}

// SandboxImage is the image of the example config's "default" sandbox, built once
// per test binary (and only when its checksum changed) from the base image.
func SandboxImage(t testing.TB) imagebuild.Image {
	t.Helper()
	return SandboxImageOf(t, "default")
}

// SandboxImageOf is SandboxImage for the example config's sandbox name.
func SandboxImageOf(t testing.TB, name string) imagebuild.Image {
	t.Helper()
	cli := Docker(t)
	imagesMu.Lock()
	img := images[name]
	if img == nil {
		img = &exampleImage{}
		images[name] = img
	}
	imagesMu.Unlock()
	img.once.Do(func() {
		cfg, err := imagebuild.LoadConfig(ExampleConfigPath())
		if err != nil {
			img.err = err
			return
		}
		spec := cfg.Sandboxes[name]
		if spec == nil {
			img.err = fmt.Errorf("the example config has no sandbox %q", name)
			return
		}
		b, err := imagebuild.NewBuilder(imagebuild.BuilderConfig{Docker: cli, Progress: os.Stderr})
		if err != nil {
			img.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		img.image, img.err = b.Ensure(ctx, spec)
	})
	if img.err != nil {
		t.Fatalf("build the example sandbox image %s: %v", name, img.err)
	}
	return img.image
}

// BuildSandbox builds the image of spec, a sandbox of a config the test wrote (see
// imagebuild.ParseConfig), and removes the image when the test ends. The build's
// progress goes to stderr.
func BuildSandbox(t testing.TB, spec *imagebuild.Spec) imagebuild.Image {
	t.Helper()
	cli := Docker(t)
	b, err := imagebuild.NewBuilder(imagebuild.BuilderConfig{Docker: cli, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img, err := b.Ensure(ctx, spec)
	if err != nil {
		t.Fatalf("build the image of sandbox %s: %v", spec.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := cli.ImageRemove(ctx, img.ID, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("remove image %s: %v", img.Tag, err)
		}
	})
	return img
}

// NATS starts an in-process NATS server with JetStream on a free loopback port, with
// its store in a temporary directory, and returns it with a connection to it. Both are
// closed at the end of the test.
func NATS(t testing.TB) (*server.Server, *nats.Conn) {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		ServerName: "test",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nc.Close()
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv, nc
}

// Main runs the tests of a package, then closes the shared Docker client (its idle
// connections are not the code's) and fails the run if any goroutine outlived them.
// Call it from TestMain: func TestMain(m *testing.M) { testenv.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	CloseDocker()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	if code == 0 {
		// nats.go v1.55.0 races in ObjectStore.Put: the goroutine a Put's own JetStream
		// context starts (resetPendingAcksOnReconnect) reads its status channel under
		// the lock only once it runs, and Put's cleanupReplySub may have set it to nil
		// by then: the goroutine then waits on a nil channel for good (publish.go:570,
		// jetstream.go:1326). One parked goroutine, now and then, per object put; not
		// ours to fix, and nothing of the project's may leak beside it.
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// ReportLatency reports the median, p90, p99 and max of lat as metrics of b, each
// name prefixed, and records the samples for the report (see Record) under the
// benchmark's name and prefix.
func ReportLatency(b *testing.B, prefix string, lat []time.Duration) {
	ReportLatencyValues(b, prefix, lat, nil)
}

// ReportLatencyValues is ReportLatency, recording values beside the samples.
func ReportLatencyValues(b *testing.B, prefix string, lat []time.Duration, values map[string]float64) {
	if len(lat) == 0 {
		return
	}
	lat = slices.Clone(lat)
	slices.Sort(lat)
	for _, q := range []struct {
		name string
		at   float64
	}{{"median", 0.5}, {"p90", 0.9}, {"p99", 0.99}, {"max", 1}} {
		b.ReportMetric(float64(Quantile(lat, q.at).Nanoseconds())/1e6, prefix+q.name+"-ms")
	}
	Record(b, prefix, lat, values)
}

// Quantile is the q quantile (0 to 1) of sorted samples, by the nearest rank.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
