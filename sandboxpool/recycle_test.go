package sandboxpool_test

// The pool's recycling and its failures, on the engine in memory of fake_test.go (see
// logic_test.go).

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/sandboxpool"
)

func TestLogicAContainerIsRecycledAfterMaxUses(t *testing.T) {
	for _, maxUses := range []int{1, 3} {
		t.Run(map[int]string{1: "after one use", 3: "after three uses"}[maxUses], func(t *testing.T) {
			logic(t, func(t *testing.T) {
				e := &engine{}
				sb := fakeSandbox("s", 1, 0)
				sb.MaxUses = maxUses
				p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
				var ids []string
				for range maxUses + 1 {
					l := checkout(t, p, "s")
					ids = append(ids, l.ContainerID())
					run(t, l, "ok")
					l.Release()
					synctest.Wait()
				}
				for i, id := range ids {
					if first := i < maxUses; first != (id == ids[0]) {
						t.Fatalf("containers of %d uses = %v, want the first %d times, then another", len(ids), ids, maxUses)
					}
				}
				worn := uint64((maxUses + 1) / maxUses) // containers that reached MaxUses
				if s := stats(p, "s"); s.Retired[sandboxpool.RetireMaxUses] != worn || s.Total != 1 || !e.WasRemoved(ids[0]) {
					t.Errorf("stats %+v, first removed: %v; want %d retired for max uses, the first removed and one left", s, e.WasRemoved(ids[0]), worn)
				}
			})
		})
	}
}

func TestLogicAWornOutContainerServesOnUntilItsReplacementIsReady(t *testing.T) {
	logic(t, func(t *testing.T) {
		e := &engine{Start: func(n int) startPlan {
			if n == 2 {
				return startPlan{Delay: 10 * time.Second}
			}
			return startPlan{}
		}}
		sb := fakeSandbox("s", 1, 0)
		sb.MaxUses = 1
		p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
		first := checkout(t, p, "s") // its only use: the replacement starts now
		first.Release()
		began := time.Now()
		again := checkout(t, p, "s")
		if again.ContainerID() != first.ContainerID() || time.Since(began) != 0 {
			t.Errorf("while the replacement starts, got %s after %v, want the worn-out %s at once", again.ContainerID(), time.Since(began), first.ContainerID())
		}
		if s := stats(p, "s"); s.InUse != 1 || s.Starting != 1 || s.Busy != 0 || s.Total != 2 {
			t.Errorf("while the worn-out container serves on: %+v, want it in use and its replacement starting", s)
		}
		again.Release()
		settle(t, time.Minute, "the replacement to take over", func() bool {
			s := stats(p, "s")
			return s.Retired[sandboxpool.RetireMaxUses] == 1 && s.Idle == 1 && s.Total == 1
		})
		next := checkout(t, p, "s")
		defer next.Release()
		if next.ContainerID() == first.ContainerID() || !e.WasRemoved(first.ContainerID()) {
			t.Errorf("got %s once the replacement was ready, want it and %s removed", next.ContainerID(), first.ContainerID())
		}
	})
}

func TestLogicAWornOutContainerWhoseReplacementIsReadyDuringItsResetGoes(t *testing.T) {
	logic(t, func(t *testing.T) {
		e := &engine{Start: func(n int) startPlan {
			if n == 2 {
				return startPlan{Delay: 500 * time.Millisecond}
			}
			return startPlan{}
		}}
		sb := fakeSandbox("s", 1, 0)
		sb.MaxUses = 1
		p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
		l := checkout(t, p, "s") // its only use: the replacement starts now
		run(t, l, "slowreset")   // its harness resets in a second, the replacement starts in half
		l.Release()
		settle(t, time.Minute, "the worn-out container to go", func() bool { return stats(p, "s").Retired[sandboxpool.RetireMaxUses] == 1 })
		if s := stats(p, "s"); s.Total != 1 || s.Idle != 1 || !e.WasRemoved(l.ContainerID()) {
			t.Errorf("stats %+v, want the replacement alone and %s removed", s, l.ContainerID())
		}
	})
}

func TestLogicAContainerIsRetiredNotReusedWhen(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		retire       string // what the lease holder calls Retire with
		wantKind     string // of the run's result
		wantReason   string
	}{
		{"its harness dies during the run", "exit", "", harness.KindCrashed, sandboxpool.RetireCrashed},
		{"Docker kills it for memory", "oom", "", harness.KindOOM, sandboxpool.RetireOOM},
		{"its harness ends the run without the execute's nonce", "forge", "", harness.KindCrashed, sandboxpool.RetireViolation},
		{"the run passes the host-side deadline", "hang", "", harness.KindTimeout, sandboxpool.RetireLimit},
		{"its harness does not reset after the run", "noreset", "", "", sandboxpool.RetireResetFailed},
		{"the lease holder retires it", "ok", "policy", "", "policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logic(t, func(t *testing.T) {
				e := &engine{}
				p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
				l := checkout(t, p, "s")
				res := run(t, l, tc.script)
				if res.ErrorKind != tc.wantKind {
					t.Errorf("result kind %q (%s), want %q", res.ErrorKind, res.Error, tc.wantKind)
				}
				if tc.retire != "" {
					l.Retire(tc.retire)
				}
				l.Release()
				settle(t, time.Minute, "a replacement", func() bool { return stats(p, "s").Idle == 1 })
				if s := stats(p, "s"); s.Retired[tc.wantReason] != 1 || s.Total != 1 {
					t.Errorf("stats %+v, want one container retired as %s and one in its place", s, tc.wantReason)
				}
				if !e.WasRemoved(l.ContainerID()) {
					t.Errorf("container %s is still in the engine", l.ContainerID())
				}
				next := checkout(t, p, "s")
				defer next.Release()
				if next.ContainerID() == l.ContainerID() {
					t.Error("the retired container was lent again")
				}
			})
		})
	}
}

func TestLogicAnIdleContainerIsReplacedWhen(t *testing.T) {
	runThenRelease := func(script string) func(*engine, *sandboxpool.Lease) {
		return func(_ *engine, l *sandboxpool.Lease) {
			l.Run(context.Background(), harness.Request{ExecutionID: "x", Script: script}, nil)
			l.Release()
		}
	}
	for _, tc := range []struct {
		name       string
		spoil      func(e *engine, l *sandboxpool.Lease) // releases l
		idle       time.Duration                         // before the next checkout
		wantReason string
	}{
		{"it stops answering its health checks", runThenRelease("mute"), time.Minute, sandboxpool.RetireUnhealthy},
		{"its harness says something nobody asked", runThenRelease("chatter"), 0, sandboxpool.RetireViolation},
		{"it is killed from outside", func(e *engine, l *sandboxpool.Lease) {
			l.Release()
			synctest.Wait()
			e.Kill(l.ContainerID())
		}, 0, sandboxpool.RetireExited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logic(t, func(t *testing.T) {
				e := &engine{}
				p := fakePool(t, e, sandboxpool.Config{HealthInterval: 10 * time.Second, Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
				l := checkout(t, p, "s")
				tc.spoil(e, l)
				synctest.Wait()
				time.Sleep(tc.idle)
				next := checkout(t, p, "s")
				defer next.Release()
				if next.ContainerID() == l.ContainerID() {
					t.Fatal("the spoiled container was lent again")
				}
				synctest.Wait() // for its removal
				if s := stats(p, "s"); s.Retired[tc.wantReason] != 1 || s.Total != 1 || !e.WasRemoved(l.ContainerID()) {
					t.Errorf("stats %+v, want the container retired as %s and removed", s, tc.wantReason)
				}
			})
		})
	}
}

func TestLogicAFailedStart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		plan     startPlan
		wantErr  error
		wantText string
	}{
		{"gives the runtime's error to the caller who waits for it", startPlan{Err: errBoom}, errBoom, "start container"},
		{"of a harness that dies before ready gives its stderr", startPlan{Stderr: "ImportError: no module named tools\n"}, harness.ErrClosed, "container stderr: ImportError"},
		{"of a harness that never says ready ends at the ready timeout", startPlan{Silent: true}, context.DeadlineExceeded, "sent no ready line within 30s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logic(t, func(t *testing.T) {
				e := &engine{Start: func(n int) startPlan {
					if n == 1 {
						return tc.plan
					}
					return startPlan{}
				}}
				p := fakePool(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 0, 1)}})
				_, err := p.Checkout(context.Background(), "s")
				if err == nil || !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantText) {
					t.Fatalf("checkout: %v, want %v and %q", err, tc.wantErr, tc.wantText)
				}
				synctest.Wait()
				if s := stats(p, "s"); s.SpawnFailures != 1 || s.Total != 0 || len(e.Live()) != 0 {
					t.Errorf("stats %+v, containers %v: want the failure counted, its slot free and its container removed", s, e.Live())
				}
				l := checkout(t, p, "s")
				l.Release()
			})
		})
	}
}

func TestLogicThePoolWaitsOutTheBackoffBeforeItStartsAgain(t *testing.T) {
	logic(t, func(t *testing.T) {
		e := &engine{Start: func(n int) startPlan {
			if n <= 3 {
				return startPlan{Err: errBoom}
			}
			return startPlan{}
		}}
		p, err := fakePoolStart(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
		if !errors.Is(err, errBoom) {
			t.Fatalf("Start: %v, want the warm start's error", err)
		}
		settle(t, 5*time.Minute, "a warm container", func() bool { return stats(p, "s").Idle == 1 })
		time.Sleep(time.Minute) // and no start after it
		starts := e.StartTimes()
		if len(starts) != 4 {
			t.Fatalf("%d starts, want 3 that fail and 1 that works", len(starts))
		}
		for i := 1; i < len(starts); i++ {
			if gap := starts[i].Sub(starts[i-1]); gap < sandboxpool.Backoff || gap > sandboxpool.Backoff+2*sandboxpool.MaintainInterval {
				t.Errorf("start %d came %v after a failed one, want the backoff of %v and at most two ticks more", i+1, gap, sandboxpool.Backoff)
			}
		}
		if s := stats(p, "s"); s.SpawnFailures != 3 || s.Spawned != 1 || s.Total != 1 {
			t.Errorf("stats = %+v", s)
		}
	})
}

func TestLogicACallerDoesNotWaitOutTheBackoff(t *testing.T) {
	logic(t, func(t *testing.T) {
		e := &engine{Start: func(n int) startPlan {
			if n == 1 {
				return startPlan{Err: errBoom}
			}
			return startPlan{}
		}}
		p, err := fakePoolStart(t, e, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{fakeSandbox("s", 1, 0)}})
		if !errors.Is(err, errBoom) {
			t.Fatalf("Start: %v, want the warm start's error", err)
		}
		began := time.Now()
		l := checkout(t, p, "s")
		defer l.Release()
		if waited := time.Since(began); waited != 0 {
			t.Errorf("the caller waited %v, want a start of its own at once", waited)
		}
	})
}
