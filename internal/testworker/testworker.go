// Package testworker starts a worker with a pool of the example sandbox image for the
// tests of several packages (worker, deploy/nats). It is test support only; the worker
// package's own internal tests cannot import it (it imports the worker).
package testworker

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/imagebuild"
	"github.com/jazzmine/worker/internal/sandboxspec"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/worker"
)

// Options shape a test worker; the zero value is a worker of the "default" sandbox
// with the pool's defaults.
type Options struct {
	// Sandbox holds the pool settings; its name, image and checksum are filled in.
	Sandbox sandboxpool.Sandbox
	// ID is the worker id; empty means one made from the test's name.
	ID string
	// Pool and Worker, if set, adjust the configs before they are used.
	Pool   func(*sandboxpool.Config)
	Worker func(*worker.Config)
	// NoPool leaves the pool unstarted: the worker answers only deliveries that need
	// no container.
	NoPool bool
	// Spec, when set, names a sandbox of the example config to run as it is
	// configured there (image, environment, resources); Sandbox's pool size and
	// overflow, when not zero, replace its own.
	Spec string
	// Build, when set, is a sandbox of a config the test wrote, run as Spec's
	// would be: its image is built for the test and removed at its end.
	Build *imagebuild.Spec
}

// Start runs a worker on nc until the end of the test, and stops it and its pool
// then. It fails the test if either cannot start.
func Start(t testing.TB, nc *nats.Conn, o Options) (*worker.Worker, *sandboxpool.Pool) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := o.ID
	if id == "" {
		id = fmt.Sprintf("test-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
	}
	sb := o.sandbox(t)
	pcfg := sandboxpool.Config{Docker: testenv.Docker(t), WorkerID: id, Sandboxes: []sandboxpool.Sandbox{sb}, WorkerAlive: worker.WorkerAlive(js)}
	if o.Pool != nil {
		o.Pool(&pcfg)
	}
	pool, err := sandboxpool.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.Config{NATS: nc, Pool: pool, WorkerID: id, Sandboxes: []worker.Sandbox{sandboxspec.Worker(sb, o.spec(t))}}
	if o.Worker != nil {
		o.Worker(&cfg)
	}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatalf("start worker %s: %v", id, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := w.Shutdown(ctx, 10*time.Second); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := pool.Close(ctx); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	if !o.NoPool {
		if err := pool.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return w, pool
}

// spec is the sandbox the options run: Build, or the example config's Spec, or
// "default".
func (o *Options) spec(t testing.TB) *imagebuild.Spec {
	if o.Build != nil {
		return o.Build
	}
	return testenv.ExampleConfig(t).Sandboxes[cmp.Or(o.Spec, "default")]
}

// sandbox is the pool sandbox the options describe, its image built.
func (o *Options) sandbox(t testing.TB) sandboxpool.Sandbox {
	if o.Spec == "" && o.Build == nil {
		img := testenv.SandboxImage(t)
		sb := o.Sandbox
		sb.Name, sb.Image, sb.Checksum = "default", img.Tag, img.Checksum
		return sb
	}
	var sb sandboxpool.Sandbox
	if o.Build != nil {
		sb = sandboxspec.Pool(o.Build, testenv.BuildSandbox(t, o.Build))
	} else {
		sb = sandboxspec.Pool(testenv.ExampleConfig(t).Sandboxes[o.Spec], testenv.SandboxImageOf(t, o.Spec))
	}
	if o.Sandbox.PoolSize != 0 {
		sb.PoolSize = o.Sandbox.PoolSize
	}
	if o.Sandbox.MaxOverflow != 0 {
		sb.MaxOverflow = o.Sandbox.MaxOverflow
	}
	return sb
}
