package harness

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
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
