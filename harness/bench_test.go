package harness

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jazzmine/worker/internal/proc"
)

// BenchmarkExecuteTrivial measures one trivial execution through the Executor and a
// local harness, fork included: the time from sending execute to receiving script_done.
// Jobs arrive a few milliseconds apart (the gap is not timed), as they do from agents,
// so the harness has forked the next child by then. It reports the median and p99.
func BenchmarkExecuteTrivial(b *testing.B) {
	for _, gap := range []time.Duration{0, 3 * time.Millisecond, 5 * time.Millisecond} {
		b.Run(fmt.Sprintf("gap=%v", gap), func(b *testing.B) {
			h := startHarness(b, nil)
			var e Executor
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if gap > 0 {
					b.StopTimer()
					time.Sleep(gap)
					b.StartTimer()
				}
				start := time.Now()
				res, err := e.Run(ctx, h.Conn, Request{ExecutionID: fmt.Sprintf("b%d", i), Script: "emit_result(1)"}, nil)
				lat = append(lat, time.Since(start))
				if err != nil || !res.Success {
					b.Fatalf("run: %v %+v", err, res)
				}
				h.settle(b, res)
			}
			b.StopTimer()
			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	at := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.5), "median-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

// BenchmarkStartProcess measures a local harness's start, from StartProcess to its
// ready event: python3's own start, the harness's imports, the zygote and the first
// warm child. Closing it is not timed. It reports the median and p99.
func BenchmarkStartProcess(b *testing.B) {
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		p, err := StartProcess(ctx, ProcessConfig{})
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatalf("start: %v", err)
		}
		b.StopTimer()
		if err := p.Close(); err != nil {
			b.Fatalf("close: %v", err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkForkCost measures the CPU one trivial execution costs each process of a
// local harness, from /proc: the harness itself, the zygote (its forks) and the
// children (their runs and exits, as the zygote reaps them), with no tool and with one
// async tool, which brings asyncio into what every child is forked from. It shows
// what the zygote's memory costs each job: a fork copies, and an exit tears down, a
// page table entry for every page of it.
func BenchmarkForkCost(b *testing.B) {
	asyncTool := "import asyncio\n\nasync def pause():\n    await asyncio.sleep(0)\n"
	for _, c := range []struct {
		name  string
		tools map[string]string
	}{{"no-tools", nil}, {"async-tool", map[string]string{"pause.py": asyncTool}}} {
		b.Run(c.name, func(b *testing.B) {
			h := startHarness(b, c.tools)
			kids, err := proc.Children(h.PID())
			if err != nil || len(kids) != 1 {
				b.Skipf("the harness's zygote from /proc: %v %v", kids, err)
			}
			zygote := kids[0]
			ticks := func(pid int) (self, reaped int64) {
				self, reaped, err := proc.CPUTicks(pid)
				if err != nil {
					b.Fatal(err)
				}
				return self, reaped
			}
			var e Executor
			run := func(id string) {
				res, err := e.Run(context.Background(), h.Conn, Request{ExecutionID: id, Script: "emit_result(1)"}, nil)
				if err != nil || !res.Success {
					b.Fatalf("run: %v %+v", err, res)
				}
				h.settle(b, res)
			}
			for i := range 20 { // the first executions allocate what later ones reuse
				run(fmt.Sprintf("w%d", i))
			}
			h0, _ := ticks(h.PID())
			z0, c0 := ticks(zygote)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				run(fmt.Sprintf("b%d", i))
			}
			b.StopTimer()
			h1, _ := ticks(h.PID())
			z1, c1 := ticks(zygote)
			perOp := func(t int64) float64 { return float64(t) * 1e6 / proc.ClockTicks / float64(b.N) }
			b.ReportMetric(perOp(h1-h0), "harness-µs/op")
			b.ReportMetric(perOp(z1-z0), "zygote-µs/op")
			b.ReportMetric(perOp(c1-c0), "children-µs/op")
			anon, err := proc.StatusKB(zygote, "RssAnon")
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(anon), "zygote-anon-kB")
		})
	}
}
