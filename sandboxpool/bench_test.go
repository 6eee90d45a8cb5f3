package sandboxpool_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// BenchmarkCheckout measures Checkout of a warm container (the fast path) and Release;
// between iterations it waits, untimed, for the returned container to be reset.
func BenchmarkCheckout(b *testing.B) {
	p := newPool(b, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandbox(b, "bench", 1, 0)}})
	ctx := context.Background()
	var checkout, release []time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		l, err := p.Checkout(ctx, "bench")
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
		t2 := time.Now()
		checkout, release = append(checkout, t1.Sub(t0)), append(release, t2.Sub(t1))
		b.StopTimer()
		waitIdle(b, p, "bench", 1)
		b.StartTimer()
	}
	b.StopTimer()
	testenv.ReportLatency(b, "checkout-", checkout)
	testenv.ReportLatency(b, "release-", release)
}

// BenchmarkSpawn measures a cold start: create, attach, start and the harness's ready
// line, through Checkout of a sandbox with no warm container.
func BenchmarkSpawn(b *testing.B) {
	sb := sandbox(b, "cold", 0, 1)
	sb.MaxUses = 1
	p := newPool(b, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}})
	ctx := context.Background()
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		l, err := p.Checkout(ctx, "cold")
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
		b.StopTimer()
		waitIdle(b, p, "cold", 0)
		b.StartTimer()
	}
	b.StopTimer()
	testenv.ReportLatency(b, "spawn-", lat)
}

// BenchmarkWarmExecution measures one trivial execution as a caller sees it: checkout,
// execute, release. The reset after release runs in the background; with one warm
// container the next checkout waits for it, so ns/op is the full cycle.
func BenchmarkWarmExecution(b *testing.B) {
	for _, size := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("pool=%d", size), func(b *testing.B) {
			p := newPool(b, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandbox(b, "exec", size, 0)}})
			ctx := context.Background()
			var lat []time.Duration
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				l, err := p.Checkout(ctx, "exec")
				if err != nil {
					b.Fatal(err)
				}
				res, err := l.Run(ctx, harness.Request{ExecutionID: fmt.Sprintf("b%d", i), Script: "emit_result(1)"}, nil)
				l.Release()
				lat = append(lat, time.Since(t0))
				if err != nil || !res.Success {
					b.Fatalf("run: %v %+v", err, res)
				}
			}
			b.StopTimer()
			testenv.ReportLatency(b, "exec-", lat)
		})
	}
}

func waitIdle(b testing.TB, p *sandboxpool.Pool, name string, idle int) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := p.Stats().Sandboxes[name]
		if s.Idle == idle && s.Busy == 0 && s.Starting == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("pool did not settle: %+v", s)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// BenchmarkRunInContainer measures executions through one checked-out container's
// attached stream, jobs a few milliseconds apart (untimed), without reset: the cost of
// the Docker attach path over the local harness benchmark.
func BenchmarkRunInContainer(b *testing.B) {
	p := newPool(b, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sandbox(b, "attach", 1, 0)}})
	ctx := context.Background()
	var lat []time.Duration
	b.ResetTimer()
	for i := range b.N {
		// Untimed: the one container comes back once its harness has said reset_done.
		b.StopTimer()
		time.Sleep(3 * time.Millisecond)
		l, err := p.Checkout(ctx, "attach")
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		res, err := l.Run(ctx, harness.Request{ExecutionID: fmt.Sprintf("r%d", i), Script: "emit_result(1)"}, nil)
		lat = append(lat, time.Since(t0))
		l.Release()
		if err != nil || !res.Success {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
	b.StopTimer()
	testenv.ReportLatency(b, "run-", lat)
}
