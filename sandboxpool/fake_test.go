package sandboxpool_test

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jazzmine/worker/internal/fakeengine"
	"github.com/jazzmine/worker/sandboxpool"
)

// engine and startPlan are the engine in memory the logic tests run the pool on.
type (
	engine    = fakeengine.Engine
	startPlan = fakeengine.StartPlan
)

// logic runs a logic test in a synctest bubble: time is fake (a timeout or backoff
// passes as soon as every goroutine waits), and a goroutine still blocked when the
// test ends fails it.
func logic(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, f)
}

var discard = slog.New(slog.DiscardHandler)

func fakeSandbox(name string, poolSize, overflow int) sandboxpool.Sandbox {
	return sandboxpool.Sandbox{Name: name, Image: "fake", PoolSize: poolSize, MaxOverflow: overflow}
}

// fakePoolStart makes a pool on e and starts it, returning Start's error. At cleanup
// it closes the pool and checks that e has no container left.
func fakePoolStart(t *testing.T, e *engine, cfg sandboxpool.Config) (*sandboxpool.Pool, error) {
	t.Helper()
	cfg.Docker, cfg.WorkerID, cfg.Logger = e, "logic", discard
	p, err := sandboxpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("close pool: %v", err)
		}
		if left := e.Live(); len(left) > 0 {
			t.Errorf("containers left after Close: %v", left)
		}
	})
	return p, p.Start(context.Background())
}

// fakePool is fakePoolStart for a pool that must start well.
func fakePool(t *testing.T, e *engine, cfg sandboxpool.Config) *sandboxpool.Pool {
	t.Helper()
	p, err := fakePoolStart(t, e, cfg)
	if err != nil {
		t.Fatalf("start pool: %v", err)
	}
	return p
}

// settle waits, on the bubble's clock, until cond holds, and fails the test if it
// does not within the given time; what names the wait.
func settle(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for synctest.Wait(); !cond(); synctest.Wait() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
