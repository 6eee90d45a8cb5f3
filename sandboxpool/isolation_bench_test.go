package sandboxpool_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/jazzmine/worker/harness"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// The benchmarks of this file show what the isolation of each execution costs, and
// the floor under it: make bench puts them in docs/BENCHMARKS.md.

// BenchmarkAttachFloor measures the physical floor of the protocol: one line written
// to a container's attached stdin and read back from its stdout, through Docker's
// attach stream, with cat at the other end, 5 ms between lines as between the other
// benchmarks' calls (back to back, it is faster: nothing on the way has gone idle).
func BenchmarkAttachFloor(b *testing.B) {
	floor := testenv.NewFloor(b, testImage(b))
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		time.Sleep(callGap)
		b.StartTimer()
		lat = append(lat, floor.RoundTrip(b))
	}
	b.StopTimer()
	testenv.ReportLatency(b, "", lat)
}

// noForkPeer is the harness protocol without its isolation: one long-lived Python
// process that runs every script in itself, with no fork, no cleanup and no reset. It
// exists only to measure what those cost; nothing else may run it.
const noForkPeer = `
import sys, json, time
out = sys.stdout
for line in sys.stdin:
    req = json.loads(line)
    if req.get("type") != "execute":
        continue
    t0, res = time.monotonic(), []
    exec(compile(req["script"], "<script>", "exec"), {"__name__": "__main__", "emit_result": lambda data=None: res.append(data)})
    eid = req["execution_id"]
    out.write(json.dumps({"type": "final_result", "execution_id": eid, "data": res[0] if res else None}) + "\n")
    out.write(json.dumps({"type": "script_done", "execution_id": eid, "exit_code": 0, "signal": None, "duration_ms": (time.monotonic() - t0) * 1000, "nonce": req.get("nonce")}) + "\n")
    out.flush()
`

// BenchmarkIsolation runs the same trivial job, one caller with 5 ms (untimed) between
// calls, three ways:
//
//	fork+reset           the default: a forked child per execution, and the reset the
//	                     harness does after it (the container is lent again at its
//	                     unasked reset_done)
//	fork+reset-request   the same, with an explicit reset request on return
//	                     (Config.ResetOnReturn), a round trip through Docker
//	no-isolation         one Python process that runs every script in itself
//
// It reports the latency of the execution (checkout to result) and the CPU the
// containers used per job, from Docker's stats.
func BenchmarkIsolation(b *testing.B) {
	req := func(i int) harness.Request {
		return harness.Request{ExecutionID: fmt.Sprintf("i%d", i), Script: "emit_result(1)", Timeout: 10 * time.Second}
	}
	for _, v := range []struct {
		name  string
		reset bool
	}{{"fork+reset", false}, {"fork+reset-request", true}} {
		b.Run(v.name, func(b *testing.B) {
			sb := sandbox(b, "iso", 2, 0)
			sb.MaxUses = 1 << 30 // the same two containers throughout: isolation, not recycling
			p := newPool(b, sandboxpool.Config{Sandboxes: []sandboxpool.Sandbox{sb}, ResetOnReturn: v.reset})
			ctx := context.Background()
			ids := map[string]bool{}
			for i := range 4 { // learn the containers, warm up
				l, err := p.Checkout(ctx, "iso")
				if err != nil {
					b.Fatal(err)
				}
				ids[l.ContainerID()] = true
				if _, err := l.Run(ctx, req(-1-i), nil); err != nil {
					b.Fatal(err)
				}
				l.Release()
			}
			before := containersCPU(b, ids)
			lat := paced(b, func(i int) (*harness.Result, error) {
				l, err := p.Checkout(ctx, "iso")
				if err != nil {
					return nil, err
				}
				defer l.Release()
				return l.Run(ctx, req(i), nil)
			})
			waitIdle(b, p, "iso", 2)
			reportIsolation(b, lat, containersCPU(b, ids)-before)
		})
	}
	b.Run("no-isolation", func(b *testing.B) {
		raw := testenv.RawContainer(b, testImage(b), []string{"python3", "-u", "-c", noForkPeer})
		conn := harness.NewConn(raw.R, raw.W, 0)
		b.Cleanup(func() { conn.Close() })
		exe := harness.Executor{}
		ctx := context.Background()
		for i := range 4 {
			if _, err := exe.Run(ctx, conn, req(-1-i), nil); err != nil {
				b.Fatal(err)
			}
		}
		ids := map[string]bool{raw.ID: true}
		before := containersCPU(b, ids)
		lat := paced(b, func(i int) (*harness.Result, error) { return exe.Run(ctx, conn, req(i), nil) })
		reportIsolation(b, lat, containersCPU(b, ids)-before)
	})
}

// callGap is the pause between one caller's calls: see worker's benchmarks.
const callGap = 5 * time.Millisecond

// paced calls run b.N times, callGap apart (untimed), and returns how long each call
// took; a call that fails or whose script fails stops the benchmark.
func paced(b *testing.B, run func(i int) (*harness.Result, error)) []time.Duration {
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		time.Sleep(callGap)
		b.StartTimer()
		t0 := time.Now()
		res, err := run(i)
		lat = append(lat, time.Since(t0))
		if err != nil || !res.Success {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
	b.StopTimer()
	return lat
}

func reportIsolation(b *testing.B, lat []time.Duration, cpu time.Duration) {
	perJob := float64(cpu.Microseconds()) / float64(len(lat))
	b.ReportMetric(perJob, "container-cpu-us/job")
	testenv.ReportLatencyValues(b, "", lat, map[string]float64{"container_cpu_us_per_job": perJob})
}

// containersCPU is the CPU time the containers have used, from Docker's stats.
func containersCPU(b *testing.B, ids map[string]bool) time.Duration {
	var total time.Duration
	for id := range ids {
		res, err := docker(b).ContainerStats(context.Background(), id, client.ContainerStatsOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var st container.StatsResponse
		err = json.NewDecoder(res.Body).Decode(&st)
		res.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		total += time.Duration(st.CPUStats.CPUUsage.TotalUsage)
	}
	return total
}
