package sandboxpool_test

// The pool's logic on the engine in memory of fake_test.go, on synctest's clock:
// fast, with no Docker engine. `go test ./sandboxpool -run Logic` runs them alone.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/sandboxpool"
)

var errBoom = errors.New("runtime: boom")

func TestLogicWaitersAreServedInTheOrderTheyCame(t *testing.T) {
	for _, tc := range []struct {
		name          string
		run           bool // each holder runs a script before it releases
		resetOnReturn bool
	}{
		{"when a container comes back unused", false, false},
		{"when a container comes back after a run, once its harness has reset", true, false},
		{"when a container comes back after a run and an explicit reset", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logic(t, func(t *testing.T) {
				p := fakePool(t, &engine{}, sandboxpool.Config{ResetOnReturn: tc.resetOnReturn, Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
				use := func(l *sandboxpool.Lease) {
					if tc.run {
						if res, err := l.Run(context.Background(), harness.Request{ExecutionID: "x", Script: "ok"}, nil); err != nil || !res.Success {
							t.Errorf("run: %+v, %v", res, err)
						}
					}
					l.Release()
				}
				first := checkout(t, p, "s")
				served := make(chan int, 3)
				var waiters sync.WaitGroup
				for i := range 3 {
					waiters.Go(func() {
						l, err := p.Checkout(context.Background(), "s")
						if err != nil {
							t.Errorf("waiter %d: %v", i, err)
							served <- -1
							return
						}
						served <- i
						use(l)
					})
					synctest.Wait() // it waits, behind the ones before it
				}
				if s := stats(p, "s"); s.Waiting != 3 {
					t.Fatalf("waiting = %d, want 3", s.Waiting)
				}
				use(first)
				waiters.Wait()
				var order []int
				for range 3 {
					order = append(order, <-served)
				}
				if !slices.Equal(order, []int{0, 1, 2}) {
					t.Errorf("served in the order %v, want 0, 1, 2", order)
				}
				if s := stats(p, "s"); s.Checkouts != 4 || s.CheckoutWaits != 3 || s.Spawned != 1 {
					t.Errorf("stats = %+v, want 4 checkouts of the one container, 3 of them waited", s)
				}
			})
		})
	}
}

func TestLogicACallerWhoGivesUpLeavesTheContainerStartedForItToTheNextCaller(t *testing.T) {
	logic(t, func(t *testing.T) {
		e := &engine{Start: func(int) startPlan { return startPlan{Delay: 2 * time.Second} }}
		p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 0, 1)}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		began := time.Now()
		if _, err := p.Checkout(ctx, "s"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("checkout with a 1 s ctx on a 2 s start: %v, want deadline exceeded", err)
		}
		if waited := time.Since(began); waited != time.Second {
			t.Errorf("the caller waited %v, want its ctx's 1 s", waited)
		}
		if s := stats(p, "s"); s.Starting != 1 || s.Waiting != 0 {
			t.Errorf("after the caller gave up: %+v, want the start going on and nobody waiting", s)
		}
		settle(t, time.Minute, "the container to go idle", func() bool { return stats(p, "s").Idle == 1 })
		began = time.Now()
		l := checkout(t, p, "s")
		defer l.Release()
		if time.Since(began) != 0 || e.CreateCount() != 1 {
			t.Errorf("the next caller waited %v and the engine made %d containers, want the idle one at once", time.Since(began), e.CreateCount())
		}
		if s := stats(p, "s"); s.Checkouts != 1 || s.CheckoutWaits != 0 || s.Spawned != 1 {
			t.Errorf("stats = %+v, want one checkout, without a wait", s)
		}
	})
}

func TestLogicAWaiterWhoGivesUpIsSkipped(t *testing.T) {
	logic(t, func(t *testing.T) {
		p := fakePool(t, &engine{}, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
		held := checkout(t, p, "s")
		quitter, quit := context.WithCancel(context.Background())
		gaveUp := make(chan error, 1)
		go func() { _, err := p.Checkout(quitter, "s"); gaveUp <- err }()
		synctest.Wait()
		got := make(chan *sandboxpool.Lease, 1)
		go func() {
			l, err := p.Checkout(context.Background(), "s")
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		synctest.Wait()
		quit()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Errorf("the first waiter: %v, want canceled", err)
		}
		held.Release()
		l := <-got
		if l == nil || l.ContainerID() != held.ContainerID() {
			t.Fatalf("the second waiter got %v, want %s", l, held.ContainerID())
		}
		l.Release()
	})
}

// TestLogicAContainerHandedOverAsItsCallerGivesUpIsNotLost: a release and the end of
// the waiting caller's ctx at once. Whichever the caller sees first, the container is
// counted once and lent again.
func TestLogicAContainerHandedOverAsItsCallerGivesUpIsNotLost(t *testing.T) {
	logic(t, func(t *testing.T) {
		sb := fakeSandbox("s", 1, 0)
		sb.MaxUses = 1000
		p := fakePool(t, &engine{}, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
		held := checkout(t, p, "s")
		gaveUp := 0
		for round := range 20 {
			ctx, cancel := context.WithCancel(context.Background())
			got := make(chan *sandboxpool.Lease, 1)
			go func() { l, _ := p.Checkout(ctx, "s"); got <- l }()
			synctest.Wait()
			cancel()
			held.Release()
			if held = <-got; held == nil {
				gaveUp++
				held = checkout(t, p, "s")
			}
			synctest.Wait()
			if s := stats(p, "s"); s.InUse != 1 || s.Idle != 0 || s.Busy != 0 || s.Total != 1 {
				t.Fatalf("after round %d: %+v, want the one container, in use once", round, s)
			}
		}
		held.Release()
		t.Logf("%d of 20 callers gave up", gaveUp)
	})
}

// TestLogicOverflowContainersStartOnDemandAndGoWhenIdle: the idle timeout (1 min here)
// is longer than the health checks' interval (30 s), as with the defaults (10 min):
// a check must not make an idle container look freshly used.
func TestLogicOverflowContainersStartOnDemandAndGoWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		name               string
		poolSize, overflow int
	}{
		{"a pool of two warm containers and no overflow", 2, 0},
		{"a pool of one warm container and two overflow", 1, 2},
		{"a pool of containers all on demand", 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logic(t, func(t *testing.T) {
				e := &engine{}
				sb := fakeSandbox("s", tc.poolSize, tc.overflow)
				sb.IdleTimeout = time.Minute
				p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
				capacity := tc.poolSize + tc.overflow
				if s := stats(p, "s"); s.Idle != tc.poolSize || e.CreateCount() != tc.poolSize {
					t.Fatalf("after Start: %+v, %d containers made, want %d warm", s, e.CreateCount(), tc.poolSize)
				}
				var leases []*sandboxpool.Lease
				ids := map[string]bool{}
				for range capacity {
					l := checkout(t, p, "s")
					leases = append(leases, l)
					ids[l.ContainerID()] = true
				}
				if s := stats(p, "s"); len(ids) != capacity || s.InUse != capacity || s.Total != capacity {
					t.Fatalf("%d leases on %d containers, stats %+v, want %d of each", capacity, len(ids), s, capacity)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if _, err := p.Checkout(ctx, "s"); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("a checkout past capacity: %v, want it to wait until its ctx ends", err)
				}
				if n := e.CreateCount(); n != capacity {
					t.Errorf("the engine made %d containers, want no more than the capacity %d", n, capacity)
				}
				for _, l := range leases {
					l.Release()
				}
				if s := stats(p, "s"); s.Idle != capacity {
					t.Errorf("after release: %d idle, want %d", s.Idle, capacity)
				}
				settle(t, 5*time.Minute, "the idle overflow to go", func() bool { return stats(p, "s").Total == tc.poolSize })
				if s := stats(p, "s"); s.Idle != tc.poolSize || s.Retired[sandboxpool.RetireIdle] != uint64(tc.overflow) || len(e.Live()) != tc.poolSize {
					t.Errorf("after the idle timeout: %+v, %d containers in the engine, want the %d warm ones", s, len(e.Live()), tc.poolSize)
				}
			})
		})
	}
}

func TestLogicCloseIsIdempotentAndBoundedByItsContext(t *testing.T) {
	t.Run("a second Close succeeds and does nothing more", func(t *testing.T) {
		logic(t, func(t *testing.T) {
			e := &engine{}
			p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 2, 1)}})
			held := checkout(t, p, "s")
			for range 2 {
				if err := p.Close(context.Background()); err != nil {
					t.Fatalf("close: %v", err)
				}
				if live := e.Live(); len(live) != 0 {
					t.Fatalf("containers after Close: %v", live)
				}
			}
			held.Release() // a lease outlives the pool: nothing to do
			if _, err := p.Checkout(context.Background(), "s"); !errors.Is(err, sandboxpool.ErrClosed) {
				t.Errorf("checkout after Close: %v, want ErrClosed", err)
			}
			if s := stats(p, "s"); s.Retired[sandboxpool.RetireClosing] != 2 || s.Total != 0 {
				t.Errorf("stats after Close: %+v, want its 2 containers retired as closing", s)
			}
		})
	})
	t.Run("Close returns when its ctx ends though Docker does not answer", func(t *testing.T) {
		logic(t, func(t *testing.T) {
			e := &engine{}
			p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
			gate := e.HoldRemovals()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			began := time.Now()
			if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) || time.Since(began) != time.Second {
				t.Errorf("close: %v after %v, want deadline exceeded after its ctx's 1 s", err, time.Since(began))
			}
			close(gate) // Docker answers again; the cleanup's Close waits for the removal
		})
	})
	t.Run("Close abandons a start under way and tells its waiter", func(t *testing.T) {
		logic(t, func(t *testing.T) {
			e := &engine{Start: func(int) startPlan { return startPlan{Delay: time.Hour} }}
			p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 0, 1)}})
			waited := make(chan error, 1)
			go func() { _, err := p.Checkout(context.Background(), "s"); waited <- err }()
			synctest.Wait()
			began := time.Now()
			if err := p.Close(context.Background()); err != nil || time.Since(began) != 0 {
				t.Errorf("close: %v after %v, want at once", err, time.Since(began))
			}
			if err := <-waited; !errors.Is(err, sandboxpool.ErrClosed) {
				t.Errorf("the waiter: %v, want ErrClosed", err)
			}
			if live := e.Live(); len(live) != 0 {
				t.Errorf("the container of the abandoned start is left: %v", live)
			}
		})
	})
	t.Run("Close waits for a create under way and removes what it made", func(t *testing.T) {
		logic(t, func(t *testing.T) {
			// The engine finishes a create whose request was aborted: had the pool
			// given up on it, the container would appear after Close, created and
			// never started, with nobody to remove it.
			e := &engine{CreateDelay: time.Second}
			p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 0, 1)}})
			waited := make(chan error, 1)
			go func() { _, err := p.Checkout(context.Background(), "s"); waited <- err }()
			synctest.Wait()
			began := time.Now()
			if err := p.Close(context.Background()); err != nil || time.Since(began) != time.Second {
				t.Errorf("close: %v after %v, want it to wait for the create's 1 s", err, time.Since(began))
			}
			if err := <-waited; !errors.Is(err, sandboxpool.ErrClosed) {
				t.Errorf("the waiter: %v, want ErrClosed", err)
			}
			time.Sleep(time.Minute) // anything the engine still had to make, it has made
			if live := e.Live(); len(live) != 0 || e.CreateCount() != 1 {
				t.Errorf("after Close: %d created, %v left, want the one created and removed", e.CreateCount(), live)
			}
		})
	})
}

func TestLogicReleaseIsSafeTwice(t *testing.T) {
	logic(t, func(t *testing.T) {
		p := fakePool(t, &engine{}, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
		first := checkout(t, p, "s")
		first.Release()
		first.Release()
		if s := stats(p, "s"); s.Idle != 1 || s.InUse != 0 || s.Total != 1 {
			t.Fatalf("after two releases: %+v, want one idle container", s)
		}
		second := checkout(t, p, "s")
		defer second.Release()
		first.Release() // the container is another caller's now
		synctest.Wait()
		if s := stats(p, "s"); second.ContainerID() != first.ContainerID() || s.InUse != 1 || s.Idle != 0 {
			t.Errorf("a stale Release gave back the container another caller holds: %+v", s)
		}
	})
}

func TestLogicStatsCountWhatHappened(t *testing.T) {
	logic(t, func(t *testing.T) {
		e := &engine{Start: func(n int) startPlan {
			switch n {
			case 2:
				return startPlan{Delay: 2 * time.Second}
			case 3:
				return startPlan{Err: errBoom}
			}
			return startPlan{}
		}}
		p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 2)}})
		want := sandboxpool.SandboxStats{Idle: 1, Total: 1, Capacity: 3, PoolSize: 1, Spawned: 1, Retired: map[string]uint64{}}
		check := func(when string) {
			t.Helper()
			synctest.Wait()
			if got := stats(p, "s"); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s:\n got %+v\nwant %+v", when, got, want)
			}
		}
		check("after Start")

		a := checkout(t, p, "s")
		want.Idle, want.InUse, want.Checkouts = 0, 1, 1
		check("after a checkout of the warm container")

		got := make(chan *sandboxpool.Lease, 1)
		go func() {
			l, err := p.Checkout(context.Background(), "s")
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		want.Starting, want.Waiting, want.Total = 1, 1, 2
		check("while a caller waits for a start")

		b := <-got
		want.Starting, want.Waiting, want.InUse = 0, 0, 2
		want.Checkouts, want.CheckoutWaits, want.CheckoutWaitTotal, want.Spawned = 2, 1, 2*time.Second, 2
		check("after the 2 s start")

		if _, err := p.Checkout(context.Background(), "s"); !errors.Is(err, errBoom) {
			t.Fatalf("checkout on a failing start: %v", err)
		}
		want.SpawnFailures = 1
		check("after a failed start")

		run(t, a, "slowreset")
		a.Release()
		want.InUse, want.Busy = 1, 1
		check("while a container resets")

		time.Sleep(time.Second)
		want.Busy, want.Idle = 0, 1
		check("after the reset")

		b.Retire("policy")
		b.Release()
		want.InUse, want.Total, want.Retired = 0, 1, map[string]uint64{"policy": 1}
		check("after a retirement")
	})
}

// TestLogicANilDockerMeansTheEngineTheEnvironmentNames: a pool without a Docker client
// makes one from DOCKER_HOST, as the docker CLI does; Close's sweep asks it.
func TestLogicANilDockerMeansTheEngineTheEnvironmentNames(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/jazzmine.sock")
	p, err := sandboxpool.New(sandboxpool.Config{WorkerID: "logic-env", Logger: discard, Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err == nil || !strings.Contains(err.Error(), "/nonexistent/jazzmine.sock") {
		t.Errorf("close: %v, want the sweep's error from the engine at DOCKER_HOST", err)
	}
}

// TestLogicAContainerPastItsAgeIsReplaced: a container an hour old (DefaultMaxAge)
// is replaced, idle as soon as nobody waits, its replacement warm before it goes; in
// use, at its release.
func TestLogicAContainerPastItsAgeIsReplaced(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		logic(t, func(t *testing.T) {
			e := &engine{}
			p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
			l := checkout(t, p, "s")
			old := l.ContainerID()
			l.Release()
			time.Sleep(sandboxpool.DefaultMaxAge - time.Minute)
			synctest.Wait()
			if e.WasRemoved(old) || e.CreateCount() != 1 {
				t.Fatalf("a container younger than its max age was replaced (%d made)", e.CreateCount())
			}
			settle(t, 2*time.Minute, "the old container to be replaced", func() bool { return e.WasRemoved(old) })
			s := stats(p, "s")
			if s.Retired[sandboxpool.RetireMaxAge] != 1 || s.Idle != 1 || s.Total != 1 || e.CreateCount() != 2 {
				t.Fatalf("after its max age: %+v, %d made; want it retired for max_age and one new idle", s, e.CreateCount())
			}
			if l := checkout(t, p, "s"); l.ContainerID() == old {
				t.Error("the checkout after the max age got the old container")
			} else {
				l.Release()
			}
		})
	})
	t.Run("in use", func(t *testing.T) {
		logic(t, func(t *testing.T) {
			e := &engine{}
			p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
			l := checkout(t, p, "s")
			old := l.ContainerID()
			time.Sleep(sandboxpool.DefaultMaxAge + time.Minute)
			synctest.Wait()
			if e.WasRemoved(old) {
				t.Fatal("a container in use was removed for its age")
			}
			l.Release()
			settle(t, time.Minute, "a new container", func() bool { return stats(p, "s").Idle == 1 })
			if s := stats(p, "s"); !e.WasRemoved(old) || s.Retired[sandboxpool.RetireMaxAge] != 1 {
				t.Errorf("after its release past its max age: %+v; want it retired for max_age", s)
			}
		})
	})
}

// TestLogicEachContainerRunsAsAUidOfItsOwn: the containers of a pool get uids of
// their own from the sandboxes' range, with the group sandbox; with SharedUID (an
// engine that remaps uids) every one runs as 10001. RemapsUIDs reads the engine's
// security options.
func TestLogicEachContainerRunsAsAUidOfItsOwn(t *testing.T) {
	logic(t, func(t *testing.T) {
		e := &engine{}
		fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 6, 0)}})
		users := e.Users()
		seen := map[int]bool{}
		for _, u := range users {
			var uid, gid int
			if _, err := fmt.Sscanf(u, "%d:%d", &uid, &gid); err != nil || gid != sandboxpool.SandboxUID ||
				uid < sandboxpool.SandboxUIDBase || uid >= sandboxpool.SandboxUIDBase+sandboxpool.SandboxUIDs || seen[uid] {
				t.Errorf("containers ran as %v; want uids of their own from the range, group %d", users, sandboxpool.SandboxUID)
				break
			}
			seen[uid] = true
		}
		if len(users) != 6 {
			t.Errorf("%d creates, want 6", len(users))
		}
	})
	logic(t, func(t *testing.T) {
		e := &engine{}
		fakePool(t, e, sandboxpool.Config{SharedUID: true, Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 2, 0)}})
		users := e.Users()
		if want := fmt.Sprintf("%d:%d", sandboxpool.SandboxUID, sandboxpool.SandboxUID); len(users) != 2 || users[0] != want || users[1] != want {
			t.Errorf("with SharedUID, containers ran as %v; want %s", users, want)
		}
	})
	for opts, want := range map[string]bool{"name=seccomp,profile=builtin": false, "name=seccomp,profile=builtin name=userns": true, "name=rootless": true} {
		got, err := sandboxpool.RemapsUIDs(context.Background(), infoEngine(strings.Fields(opts)))
		if err != nil || got != want {
			t.Errorf("RemapsUIDs with %q: %v, %v; want %v", opts, got, err, want)
		}
	}
}

// infoEngine answers docker info with these security options.
type infoEngine []string

func (o infoEngine) Info(context.Context, client.InfoOptions) (client.SystemInfoResult, error) {
	var res client.SystemInfoResult
	res.Info.SecurityOptions = o
	return res, nil
}

// TestLogicASandboxAddedToAStartedPoolWarmsAndServes adds a sandbox to a running
// pool, as a worker does once the sandbox's image is built: Add returns once its
// warm containers are ready, which a checkout then gets without a spawn; a second
// Add of the name, and an Add after Close, are refused.
func TestLogicASandboxAddedToAStartedPoolWarmsAndServes(t *testing.T) {
	logic(t, func(t *testing.T) {
		e := &engine{}
		p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("first", 1, 0)}})
		if _, err := p.Checkout(context.Background(), "later"); !errors.Is(err, sandboxpool.ErrUnknownSandbox) {
			t.Fatalf("checkout of a sandbox not added yet: %v, want ErrUnknownSandbox", err)
		}
		if err := p.Add(context.Background(), fakeSandbox("later", 2, 1)); err != nil {
			t.Fatalf("Add: %v", err)
		}
		if s := p.Stats().Sandboxes["later"]; s.Idle != 2 || s.Spawned != 2 {
			t.Errorf("after Add: %d idle, %d spawned; want its 2 warm containers idle", s.Idle, s.Spawned)
		}
		if _, ok := p.Ready("later"); !ok {
			t.Error("the added sandbox has no ready container")
		}
		checkout(t, p, "later").Release()
		if n := e.CreateCount(); n != 3 {
			t.Errorf("%d containers created, want 3 (1 + 2 warm, no spawn for the checkout)", n)
		}
		if err := p.Add(context.Background(), fakeSandbox("later", 1, 0)); err == nil || !strings.Contains(err.Error(), "configured twice") {
			t.Errorf("a second Add of the name: %v", err)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := p.Add(context.Background(), fakeSandbox("after", 1, 0)); !errors.Is(err, sandboxpool.ErrClosed) {
			t.Errorf("Add after Close: %v, want ErrClosed", err)
		}
	})
}
