// Command benchreport turns the samples that make bench records (see
// internal/testenv.Record) into docs/BENCHMARKS.md and its plots.
//
//	go run ./internal/benchreport -in bench-out -out docs
//
// It reads every *.json of -in, writes -out/BENCHMARKS.md and SVG plots under
// -out/bench/, and says which of the project's performance aims the run met.
package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/jazzmine/worker/internal/testenv"
)

func main() {
	in := flag.String("in", "bench-out", "directory of the recorded samples")
	out := flag.String("out", "docs", "directory of BENCHMARKS.md; plots go to its bench/")
	command := flag.String("command", "make bench", "the command that produced the samples, for the report")
	tiersOnly := flag.Bool("tiers", false, "print only the isolation tiers' table (BenchmarkTiers) to stdout, and write nothing")
	flag.StringVar(&plotExt, "format", "svg", "format of the plots: svg or png")
	flag.Parse()
	if *tiersOnly {
		all, err := load(*in)
		if err == nil {
			r := &report{}
			if err = r.tiers(all); err == nil {
				r.summary()
				fmt.Print(r.b.String())
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*in, *out, *command); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

// plotExt is the plots' file extension, which gonum/plot takes as their format.
var plotExt = "svg"

// series is one recorded benchmark, its latencies sorted.
type series struct {
	testenv.Sample
	lat []time.Duration
}

func (s *series) q(p float64) time.Duration { return testenv.Quantile(s.lat, p) }

func load(dir string) (map[string]*series, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no samples in %s: run the benchmarks with %s=%s first", dir, testenv.BenchOutEnv, dir)
	}
	all := map[string]*series{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var s series
		if err := json.Unmarshal(data, &s.Sample); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, ns := range s.LatencyNS {
			s.lat = append(s.lat, time.Duration(ns))
		}
		slices.Sort(s.lat)
		all[s.Name] = &s
	}
	return all, nil
}

// report accumulates the markdown.
type report struct {
	b     strings.Builder
	plots string // directory of the plots
	aims  []aim
	// floor is the attach floor measured in the same run (BenchmarkOneAgent's, in
	// turn with the jobs, else BenchmarkAttachFloor's): every job latency is also
	// given as a multiple of it.
	floor *series
}

type aim struct {
	what, want, got string
	met             bool
}

func (r *report) p(format string, args ...any) { fmt.Fprintf(&r.b, format+"\n", args...) }

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

// tail is the median, p90, p99 and max of s as the cells of a table row, the median
// and the p99 also as multiples of the floor's.
func (r *report) tail(s *series) string {
	return fmt.Sprintf("%s%s | %s | %s%s | %s", ms(s.q(0.5)), r.x(s, 0.5), ms(s.q(0.9)), ms(s.q(0.99)), r.x(s, 0.99), ms(s.q(1)))
}

// x is the q quantile of s as a multiple of the floor's, " (7.2×)"; "" without a floor.
func (r *report) x(s *series, q float64) string {
	if r.floor == nil || r.floor.q(q) <= 0 || s == r.floor {
		return ""
	}
	return fmt.Sprintf(" (%.1f×)", r.ratio(s, q))
}

func (r *report) ratio(s *series, q float64) float64 {
	return float64(s.q(q)) / float64(r.floor.q(q))
}

// sortedBy is the series whose names keep accepts, in the order of their value key.
func sortedBy(all map[string]*series, key string, keep func(name string) bool) []*series {
	var pts []*series
	for _, s := range all {
		if keep(s.Name) {
			pts = append(pts, s)
		}
	}
	slices.SortFunc(pts, func(a, b *series) int { return cmp.Compare(a.Values[key], b.Values[key]) })
	return pts
}

func run(in, out, command string) error {
	all, err := load(in)
	if err != nil {
		return err
	}
	r := &report{plots: filepath.Join(out, "bench"), floor: cmp.Or(all["BenchmarkOneAgent/floor"], all["BenchmarkAttachFloor"])}
	if err := os.MkdirAll(r.plots, 0o755); err != nil {
		return err
	}
	sections := []func(map[string]*series) error{r.latency, r.pace, r.sequential, r.throughput, r.pool, r.memory, r.isolation, r.tiers}
	for _, f := range sections {
		if err := f(all); err != nil {
			return err
		}
	}
	body := r.b.String()
	r.b.Reset()
	r.p("# Benchmarks")
	r.p("")
	r.p("Written by `%s` (`internal/benchreport` from the samples the benchmarks record); every number below comes from one run on the machine described here. The machine is shared and noisy: read medians and ratios, and the tails with care.", command)
	r.p("")
	r.machine()
	r.summary() // the aims first: they are what a reader looks for
	r.b.WriteString(body)
	return os.WriteFile(filepath.Join(out, "BENCHMARKS.md"), []byte(r.b.String()), 0o644)
}

func (r *report) machine() {
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	dockerVersion, _ := exec.Command("docker", "version", "--format", "{{.Server.Version}} (API {{.Server.APIVersion}})").Output()
	r.p("| machine | |")
	r.p("|---|---|")
	r.p("| date | %s |", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	r.p("| CPUs | %d |", runtime.NumCPU())
	r.p("| kernel | %s |", strings.TrimSpace(string(kernel)))
	r.p("| Docker engine | %s |", strings.TrimSpace(string(dockerVersion)))
	r.p("| Go | %s |", runtime.Version())
	r.p("")
}

// latencyRow is one way of running the trivial job.
type latencyRow struct {
	label, name string
	short       string // under its box in the plot
}

func (r *report) latency(all map[string]*series) error {
	rows := []latencyRow{
		{"jazzmine worker, the Go client: publish to script_done (default recycling)", "BenchmarkOneAgent", "worker"},
		{"jazzmine worker, an agent with plain nats.go and JSON (no jazzmine code)", "BenchmarkOneAgent/plain-nats", "plain nats.go"},
		{"jazzmine worker, the Go client, containers never recycled", "BenchmarkEndToEnd/pool=2-no-recycling", "no recycling"},
		{"docker exec into a running container", "BenchmarkDockerExec", "docker exec"},
		{"docker run --rm per call", "BenchmarkDockerRun", "docker run --rm"},
		{"floor (a): one line through Docker's attach stream and back (cat), in turn with the first two rows", "BenchmarkOneAgent/floor", "attach floor"},
		{"floor (b): nats.go alone, no container: a publish into a work-queue stream (file storage), a pull consumer's fetch, one core message back", "BenchmarkOneAgent/floor-nats", "NATS floor"},
		{"floor (c): one line to a forked Python child over a pipe and back", "BenchmarkOneAgent/floor-pipe", "pipe floor"},
	}
	r.p("## A trivial job, one agent")
	r.p("")
	r.p("`emit_result(1)`, one call at a time with 5 ms between calls (an agent thinks between tool calls; back to back, one agent is the first row of the throughput table). The worker's figure is the agent's: from publish to the `script_done` event, with the job through JetStream, a warm container and the harness's fork, the default settings (pool of 2, recycling after %s uses or an hour). The first two rows and the floor are measured in turn in each round of one benchmark (`BenchmarkOneAgent`), so that they share the machine's moments; `(n×)` is a multiple of the floor's same quantile. `docker exec` and `docker run --rm` run `python3 -c 'print(1)'` in the same sandbox image.", maxUses(all["BenchmarkOneAgent"]))
	r.p("")
	r.p("| how | runs | median | p90 | p99 | max | median vs the worker |")
	r.p("|---|---|---|---|---|---|---|")
	worker := cmp.Or(all["BenchmarkOneAgent"], all["BenchmarkEndToEnd/pool=2"])
	var boxes []*series
	var labels []string
	for _, row := range rows {
		s := all[row.name]
		if s == nil || len(s.lat) == 0 {
			continue
		}
		ratio := ""
		if worker != nil && s != worker {
			x := float64(s.q(0.5)) / float64(worker.q(0.5))
			ratio = fmt.Sprintf("%.1f× slower", x)
			if x < 1 {
				ratio = fmt.Sprintf("%.2f× (%.1f× faster)", x, 1/x)
			}
		}
		r.p("| %s | %d | %s | %s |", row.label, len(s.lat), r.tail(s), ratio)
		boxes = append(boxes, s)
		labels = append(labels, row.short)
	}
	r.p("")
	r.hops(all["BenchmarkOneAgent/plain-nats"])
	r.latencyAims(all, worker)
	if len(boxes) > 0 {
		file := "latency." + plotExt
		if err := boxPlot(filepath.Join(r.plots, file), "A trivial job, one agent (log scale)", labels, boxes); err != nil {
			return err
		}
		r.p("![latency of a trivial job, one agent](bench/%s)", file)
		r.p("")
		r.p("Boxes span the 25th to the 75th percentile with the median across; whiskers reach the 1st and 99th.")
		r.p("")
	}
	return nil
}

// maxUses is the max uses a series recorded, as text.
func maxUses(s *series) string {
	if s == nil || s.Values["max_uses"] == 0 {
		return "the default number of"
	}
	return fmt.Sprintf("%.0f", s.Values["max_uses"])
}

// hops is where the plain agent's job spent its time, from the times the worker
// wrote in its events.
func (r *report) hops(plain *series) {
	if plain == nil || plain.Values["hop_in_container_ms"] == 0 {
		return
	}
	r.p("Where the plain agent's job goes (medians of each hop, from the times the worker writes in the events; one clock, the same machine):")
	r.p("")
	r.p("| hop | median |")
	r.p("|---|---|")
	r.p("| publish to `started`: JetStream stores the job and hands it to the worker's waiting pull; the worker decodes it, looks for a cancel, takes a warm container | %.2f ms |", plain.Values["hop_to_started_ms"])
	r.p("| `started` to `script_done`: the execute line through the attach stream, the harness, the pre-forked child running the script, the events back | %.2f ms |", plain.Values["hop_in_container_ms"])
	r.p("| `script_done` to the agent: the worker's publish, the server, the agent's subscription | %.2f ms |", plain.Values["hop_back_ms"])
	r.p("")
}

// latencyAims are the one-agent aims, against the floors of the same run: the sum
// of the medians of (a) the attach stream, (b) the least NATS needs for a durable
// job and (c) a forked Python child's pipe, which every job crosses.
func (r *report) latencyAims(all map[string]*series, worker *series) {
	a, b, c := all["BenchmarkOneAgent/floor"], all["BenchmarkOneAgent/floor-nats"], all["BenchmarkOneAgent/floor-pipe"]
	if a == nil || b == nil || c == nil {
		return
	}
	sum := a.q(0.5) + b.q(0.5) + c.q(0.5)
	r.p("The floors' sum, (a)+(b)+(c) of their medians: %s.", ms(sum))
	r.p("")
	for _, w := range []struct {
		s    *series
		note string
	}{{worker, "the Go client"}, {all["BenchmarkOneAgent/plain-nats"], "plain nats.go"}} {
		if w.s == nil {
			continue
		}
		med, tail := float64(w.s.q(0.5))/float64(sum), float64(w.s.q(0.99))/float64(sum)
		r.aim(fmt.Sprintf("trivial job, one agent, %s: median vs (a)+(b)+(c)", w.note), "at most 1.75×", fmt.Sprintf("%s, %.2f×", ms(w.s.q(0.5)), med), med <= 1.75)
		r.aim(fmt.Sprintf("trivial job, one agent, %s: p99 vs (a)+(b)+(c)", w.note), "at most 4×", fmt.Sprintf("%s, %.2f×", ms(w.s.q(0.99)), tail), tail <= 4)
	}
}

// pace is the default recycling at one agent's different paces.
func (r *report) pace(all map[string]*series) error {
	pts := sortedBy(all, "gap_ms", func(name string) bool {
		return name == "BenchmarkEndToEnd/pool=2" || strings.HasPrefix(name, "BenchmarkAgentPace/")
	})
	if len(pts) < 2 {
		return nil
	}
	r.p("## Recycling and the agent's pace")
	r.p("")
	r.p("One agent with the default recycling (`BenchmarkEndToEnd/pool=2` and `BenchmarkAgentPace`), with more time between its calls. Each container is replaced after %s uses, and a replacement's spawn and the old one's removal take about 0.4 s of the machine's CPU (dockerd, containerd, runc, fuse-overlayfs and the new harness): the agent's pace sets how often that runs beside its calls. An agent that waits for a language model between tool calls calls far less often than the slowest row.", maxUses(pts[0]))
	r.p("")
	r.p("| time between calls | calls/s | a spawn every | runs | median | p90 | p99 | max |")
	r.p("|---|---|---|---|---|---|---|---|")
	for _, s := range pts {
		rate := s.Values["calls_per_s"]
		every := "?"
		if rate > 0 && s.Values["max_uses"] > 0 {
			every = fmt.Sprintf("%.1f s", s.Values["max_uses"]/rate)
		}
		r.p("| %.0f ms | %.0f | %s | %d | %s |", s.Values["gap_ms"], rate, every, len(s.lat), r.tail(s))
	}
	r.p("")
	return nil
}

// sequential is BenchmarkSequentialAgent: one agent back to back against the default
// pool, and the containers it made the pool spawn beyond the warm ones.
func (r *report) sequential(all map[string]*series) error {
	s := all["BenchmarkSequentialAgent"]
	if s == nil {
		return nil
	}
	v := s.Values
	r.p("## One agent back to back, the default pool")
	r.p("")
	r.p("One agent sending the trivial job as soon as the last one ended (`BenchmarkSequentialAgent`), against the default pool: %.0f warm containers and room for %.0f more (never recycled here, so that every spawn is one a job asked for). Each job arrives while the last one's container is being reset; it waits for that container rather than spawn one (about 0.4 s of the machine's CPU, memory held for the idle timeout) that would then sit idle.", v["warm"], v["overflow"])
	r.p("")
	r.p("| runs | spawned beyond the warm | checkouts that waited for a reset | median | p90 | p99 | max |")
	r.p("|---|---|---|---|---|---|---|")
	r.p("| %d | %.0f | %.0f | %s |", len(s.lat), v["spawned_beyond_warm"], v["checkout_waits"], r.tail(s))
	r.p("")
	r.aim("containers spawned beyond the warm size, one agent back to back", "none", fmt.Sprintf("%.0f in %d jobs", v["spawned_beyond_warm"], len(s.lat)), v["spawned_beyond_warm"] == 0)
	return nil
}

// throughputRecycled is 8 agents with the default recycling.
const throughputRecycled = "BenchmarkThroughput/agents=8-default-recycling"

// recyclingAims: 8 agents with the default recycling, and what the recycling costs
// against none in the same run.
func (r *report) recyclingAims(recycled, none *series) {
	rate, errs := recycled.Values["jobs_per_s"], recycled.Values["errors"]
	r.aim("throughput, 8 agents, pool of 4, default recycling", "no error (jobs/s reported)", fmt.Sprintf("%.0f jobs/s, %.0f errors", rate, errs), errs == 0)
	if none != nil && none.Values["jobs_per_s"] > 0 {
		cost := 1 - rate/none.Values["jobs_per_s"]
		r.aim("the default recycling's cost at 8 agents, against none in the same run", "at most 10%", fmt.Sprintf("%.1f%% (%.0f against %.0f jobs/s)", 100*cost, rate, none.Values["jobs_per_s"]), cost <= 0.10)
	}
}

func (r *report) throughput(all map[string]*series) error {
	pts := sortedBy(all, "agents", func(name string) bool {
		return strings.HasPrefix(name, "BenchmarkThroughput/agents=") && !strings.Contains(name, "recycling")
	})
	if len(pts) == 0 {
		return nil
	}
	r.p("## Throughput as agents grow")
	r.p("")
	r.p("One worker with a pool of 4 warm containers, never recycled; each agent submits the trivial job through the Go client and waits for its result, again and again. Agents, worker and NATS share the machine's 2 cores. The last row is 8 agents with the default recycling (a container retired after %s uses): each retirement is a container spawn.", maxUses(all[throughputRecycled]))
	r.p("")
	r.p("| agents | jobs | errors | jobs/s | median | p90 | p99 | max |")
	r.p("|---|---|---|---|---|---|---|---|")
	rate, p50, p99 := plotter.XYs{}, plotter.XYs{}, plotter.XYs{}
	row := func(label string, s *series) {
		r.p("| %s | %d | %.0f | %.0f | %s |", label, len(s.lat), s.Values["errors"], s.Values["jobs_per_s"], r.tail(s))
	}
	for _, s := range pts {
		a := s.Values["agents"]
		row(fmt.Sprintf("%.0f", a), s)
		rate = append(rate, plotter.XY{X: a, Y: s.Values["jobs_per_s"]})
		p50 = append(p50, plotter.XY{X: a, Y: float64(s.q(0.5).Microseconds()) / 1000})
		p99 = append(p99, plotter.XY{X: a, Y: float64(s.q(0.99).Microseconds()) / 1000})
	}
	if s := all[throughputRecycled]; s != nil {
		row("8, default recycling", s)
		r.recyclingAims(s, all["BenchmarkThroughput/agents=8"])
	}
	r.p("")
	r.cpuByProcess(append(pts, all[throughputRecycled]))
	r.processes(all["BenchmarkCPUByProcess"])
	if err := linePlot(filepath.Join(r.plots, "throughput."+plotExt), "Throughput, pool of 4", "agents", "jobs/s", map[string]plotter.XYs{"jobs/s": rate}, false); err != nil {
		return err
	}
	if err := linePlot(filepath.Join(r.plots, "throughput-latency."+plotExt), "Latency as agents grow, pool of 4", "agents", "ms", map[string]plotter.XYs{"median": p50, "p99": p99}, true); err != nil {
		return err
	}
	r.p("![throughput](bench/throughput.%s) ![latency as agents grow](bench/throughput-latency.%s)", plotExt, plotExt)
	r.p("")
	return nil
}

// cpuByProcess is the throughput rows' CPU a job by process, beside what the same
// messages cost with nats.go alone, and the Go side's aim at 8 agents.
func (r *report) cpuByProcess(rows []*series) {
	r.p("CPU a job by process, from each process's CPU time around the load. The Go side is the benchmark's process: the agents, the embedded NATS server and the worker. The Docker engine is dockerd, containerd with the containers' shims, and fuse-overlayfs, host-wide (runc, short-lived, is not counted). Beside them, in the same process after the load: (b), the least a durable job needs from NATS with nats.go alone (a publish into a work-queue stream, a pull consumer's fetch, one core message back), and the job's whole NATS pattern with nats.go alone (the job published, fetched and acked, its cancel looked up, three acked events, the agent's subscription), each per round trip.")
	r.p("")
	r.p("| agents | Go side | Docker engine | containers | all three | (b) with nats.go | the job's pattern with nats.go | Go side / pattern |")
	r.p("|---|---|---|---|---|---|---|---|")
	for _, s := range rows {
		if s == nil {
			continue
		}
		v := s.Values
		label := fmt.Sprintf("%.0f", v["agents"])
		if v["max_uses"] < 1<<30 {
			label += ", default recycling"
		}
		goSide, engine, ctrs, pattern := v["go_side_cpu_ms_per_job"], v["docker_engine_cpu_ms_per_job"], v["container_cpu_ms_per_job"], v["job_pattern_cpu_ms"]
		ratio := "?"
		if pattern > 0 {
			ratio = fmt.Sprintf("%.2f×", goSide/pattern)
		}
		ctrsCell, all := fmt.Sprintf("%.2f ms", ctrs), fmt.Sprintf("%.2f ms", goSide+engine+ctrs)
		if v["max_uses"] < 1<<30 { // Docker's stats of a retired container go with it
			ctrsCell, all = "(retired ones not counted)", "?"
		}
		r.p("| %s | %.2f ms | %.2f ms | %s | %s | %.2f ms | %.2f ms | %s |", label, goSide, engine, ctrsCell, all, v["nats_floor_cpu_ms"], pattern, ratio)
		if v["agents"] == 8 && v["max_uses"] >= 1<<30 && pattern > 0 {
			r.aim("the Go side's CPU a job at 8 agents vs the job's NATS pattern with nats.go alone, same run", "at most 1.5×",
				fmt.Sprintf("%.2f ms against %.2f ms, %.2f×", goSide, pattern, goSide/pattern), goSide/pattern <= 1.5)
		}
	}
	r.p("")
}

// processes is BenchmarkCPUByProcess: 8 agents with each part a process of its own.
func (r *report) processes(s *series) {
	if s == nil {
		return
	}
	v := s.Values
	r.p("The same 8 agents with each part a process of its own (`BenchmarkCPUByProcess`): a nats-server process, `worker serve` as production runs it (info log, metrics served), the agents' process: %.0f jobs/s, %.0f errors, median %s, p99 %s.", v["jobs_per_s"], v["errors"], ms(s.q(0.5)), ms(s.q(0.99)))
	r.p("")
	r.p("| process | CPU a job |")
	r.p("|---|---|")
	var total float64
	for _, p := range []struct{ key, label string }{
		{"nats_server", "nats-server"}, {"worker", "worker serve"}, {"agents", "the agents (Go client)"},
		{"docker_engine", "Docker engine (dockerd, containerd and the shims, fuse-overlayfs)"}, {"containers", "containers (harness, zygote, scripts)"},
	} {
		total += v[p.key+"_cpu_ms_per_job"]
		r.p("| %s | %.2f ms |", p.label, v[p.key+"_cpu_ms_per_job"])
	}
	r.p("| all | %.2f ms |", total)
	r.p("")
}

func (r *report) pool(all map[string]*series) error {
	rows := []latencyRow{
		{"checkout of a warm container", "BenchmarkCheckout/checkout", ""},
		{"release (the reset runs in the background)", "BenchmarkCheckout/release", ""},
		{"cold spawn to ready: create, attach, start, the harness's ready line", "BenchmarkSpawn/spawn", ""},
	}
	r.p("## The pool")
	r.p("")
	r.p("| what | runs | median | p90 | p99 | max |")
	r.p("|---|---|---|---|---|---|")
	for _, row := range rows {
		if s := all[row.name]; s != nil && len(s.lat) > 0 {
			r.p("| %s | %d | %s | %s | %s | %s |", row.label, len(s.lat), us(s.q(0.5)), us(s.q(0.9)), us(s.q(0.99)), us(s.q(1)))
		}
	}
	r.p("")
	return nil
}

func us(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1000)
	}
	return ms(d)
}

func (r *report) memory(all map[string]*series) error {
	ext, emb := all["BenchmarkMemory/nats=external"], all["BenchmarkMemory/nats=embedded"]
	if ext == nil && emb == nil {
		return nil
	}
	r.p("## Memory")
	r.p("")
	r.p("`worker serve` as its own process with two sandboxes of two warm containers each, after 200 jobs on each sandbox: against a separate NATS server, and with its embedded one (as `make run` starts it), whose memory then counts as the worker's.")
	r.p("")
	r.p("| what | MiB |")
	r.p("|---|---|")
	for _, m := range []struct {
		s     *series
		label string
	}{{ext, "separate NATS server"}, {emb, "embedded NATS server"}} {
		if m.s != nil {
			r.p("| the worker's resident size (VmRSS), %s | %.1f |", m.label, m.s.Values["worker_rss_mb"])
			r.aim("worker resident memory, two sandboxes warm, "+m.label, "under 60 MB", fmt.Sprintf("%.1f MiB", m.s.Values["worker_rss_mb"]), m.s.Values["worker_rss_mb"]*1.048576 < 60)
		}
	}
	v := ext
	if v == nil {
		v = emb
	}
	for i := 1; ; i++ {
		u, ok := v.Values[fmt.Sprintf("container_%d_usage_mb", i)]
		if !ok {
			break
		}
		r.p("| idle container %d: cgroup usage (page cache included) / anonymous | %.1f / %.1f |", i, u, v.Values[fmt.Sprintf("container_%d_anon_mb", i)])
	}
	r.p("")
	r.warmMemory(all)
	return nil
}

// warmMemory is BenchmarkWarmMemory's table: one warm container of each sandbox, its
// cgroup's memory and its processes' PSS and private memory.
func (r *report) warmMemory(all map[string]*series) {
	rows := []struct{ name, label string }{
		{"BenchmarkWarmMemory/default", "default"},
		{"BenchmarkWarmMemory/datascience", "datascience (numpy, pandas and matplotlib.pyplot preloaded)"},
		{"BenchmarkWarmMemory/datascience-no-preload", "datascience, nothing preloaded"},
	}
	if all[rows[0].name] == nil {
		return
	}
	r.p("One warm container of each sandbox of the example config, after 20 jobs, settled (`BenchmarkWarmMemory`): the cgroup's usage (page cache included) and anonymous memory, and the PSS (shared pages divided among their sharers) and private memory of its three processes, read from the host's /proc: the harness, the zygote it forked after the preload, and the warm child the zygote forked for the next job.")
	r.p("")
	r.p("| sandbox | cgroup usage | anonymous | harness PSS / private | zygote PSS / private | warm child PSS / private |")
	r.p("|---|---|---|---|---|---|")
	for _, row := range rows {
		s := all[row.name]
		if s == nil {
			continue
		}
		v := s.Values
		cell := func(i int) string {
			return fmt.Sprintf("%.1f / %.1f", v[fmt.Sprintf("proc_%d_pss_mb", i)], v[fmt.Sprintf("proc_%d_private_mb", i)])
		}
		r.p("| %s | %.1f MiB | %.1f MiB | %s | %s | %s |", row.label, v["usage_mb"], v["anon_mb"], cell(1), cell(2), cell(3))
	}
	r.p("")
}

func (r *report) isolation(all map[string]*series) error {
	rows := []latencyRow{
		{"fork per execution, reset after it (the default)", "BenchmarkIsolation/fork+reset", ""},
		{"the same, with an explicit reset request on return", "BenchmarkIsolation/fork+reset-request", ""},
		{"no isolation: one Python process runs every script", "BenchmarkIsolation/no-isolation", ""},
	}
	r.p("## The cost of isolation")
	r.p("")
	r.p("The trivial job, 5 ms between calls, through the executor and Docker's attach stream (no NATS), one caller, a pool of two containers. The harness forks a pre-warmed child for each execution and, after it, kills what it left, wipes `/workspace` and `/tmp`, and forks and warms the next child; the pool lends the container again at the harness's `reset_done`. The last row is a bare Python loop that `exec`s each script in itself: what the job would cost with none of that.")
	r.p("")
	r.p("| how | runs | median | p99 | container CPU per job |")
	r.p("|---|---|---|---|---|")
	var labels []string
	var cpu plotter.Values
	for _, row := range rows {
		s := all[row.name]
		if s == nil || len(s.lat) == 0 {
			continue
		}
		c := s.Values["container_cpu_us_per_job"]
		r.p("| %s | %d | %s | %s | %.0f µs |", row.label, len(s.lat), ms(s.q(0.5)), ms(s.q(0.99)), c)
		labels = append(labels, strings.TrimPrefix(row.name, "BenchmarkIsolation/"))
		cpu = append(cpu, c/1000)
	}
	r.p("")
	if len(cpu) > 0 {
		if err := barPlot(filepath.Join(r.plots, "isolation."+plotExt), "Container CPU per trivial job", "ms of CPU", labels, cpu); err != nil {
			return err
		}
		r.p("![container CPU per job](bench/isolation.%s)", plotExt)
		r.p("")
	}
	return nil
}

// tierAim is the most gVisor's median trivial job may take, as a multiple of runc's
// in the same run.
const tierAim = 2.5

// tiers is BenchmarkTiers: runc and gVisor side by side.
func (r *report) tiers(all map[string]*series) error {
	tier := func(rt, what string) *series { return all["BenchmarkTiers/runtime="+rt+"/"+what] }
	if tier("runc", "latency") == nil && tier("runsc", "latency") == nil {
		return nil
	}
	r.p("## Isolation tiers: runc and gVisor")
	r.p("")
	r.p("The trivial job through the worker under each tier, in one run (`BenchmarkTiers`, `make bench-tiers`): runc, the host's kernel behind the seccomp profile, and gVisor's runsc on the systrap platform (`make gvisor`). One agent with 5 ms between calls and a pool of two, as in the first table; eight agents back to back and a pool of four; containers never recycled. CPU per job is the containers' (Docker's stats: under gVisor, the work of its kernel is the container's).")
	r.p("")
	r.p("| what | runc | gVisor (runsc) | gVisor / runc |")
	r.p("|---|---|---|---|")
	cell := func(s *series, f func(*series) float64, format string) (string, float64) {
		if s == nil {
			return "–", 0
		}
		v := f(s)
		return fmt.Sprintf(format, v), v
	}
	line := func(label, what string, f func(*series) float64, format string) float64 {
		a, av := cell(tier("runc", what), f, format)
		b, bv := cell(tier("runsc", what), f, format)
		ratio := "–"
		if av > 0 && bv > 0 {
			ratio = fmt.Sprintf("%.2f×", bv/av)
		}
		r.p("| %s | %s | %s | %s |", label, a, b, ratio)
		if av > 0 {
			return bv / av
		}
		return 0
	}
	msOf := func(q float64) func(*series) float64 {
		return func(s *series) float64 { return float64(s.q(q).Microseconds()) / 1000 }
	}
	value := func(key string) func(*series) float64 { return func(s *series) float64 { return s.Values[key] } }
	median := line("trivial job, one agent: median", "latency", msOf(0.5), "%.2f ms")
	line("trivial job, one agent: p99", "latency", msOf(0.99), "%.2f ms")
	line("container CPU per job, one agent", "latency", value("container_cpu_ms_per_job"), "%.2f ms")
	line("jobs/s, 8 agents", "agents=8", value("jobs_per_s"), "%.1f")
	line("container CPU per job, 8 agents", "agents=8", value("container_cpu_ms_per_job"), "%.2f ms")
	line("spawn to ready: median", "spawn", msOf(0.5), "%.0f ms")
	line("memory per warm container (cgroup usage)", "memory", value("container_mean_usage_mb"), "%.1f MiB")
	line("memory per warm container (anonymous)", "memory", value("container_mean_anon_mb"), "%.1f MiB")
	r.p("")
	if median > 0 {
		r.aim("gVisor's median trivial job against runc's, same run", fmt.Sprintf("at most %.1f×", tierAim), fmt.Sprintf("%.2f×", median), median <= tierAim)
	}
	return nil
}

func (r *report) aim(what, want, got string, met bool) {
	r.aims = append(r.aims, aim{what, want, got, met})
}

func (r *report) summary() {
	if len(r.aims) == 0 {
		return
	}
	r.p("## The aims")
	r.p("")
	r.p("| aim | wanted | measured | met |")
	r.p("|---|---|---|---|")
	for _, a := range r.aims {
		mark := "yes"
		if !a.met {
			mark = "**no**"
		}
		r.p("| %s | %s | %s | %s |", a.what, a.want, a.got, mark)
	}
	r.p("")
}

// Plots.

func newPlot(title string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Add(plotter.NewGrid())
	return p
}

func boxPlot(file, title string, labels []string, data []*series) error {
	p := newPlot(title)
	p.Y.Label.Text = "ms"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	w := vg.Points(28)
	for i, s := range data {
		vals := make(plotter.Values, 0, len(s.lat))
		// Whiskers at the 1st and 99th percentiles: trim the rest, so that the plot
		// shows the body of each distribution on one log axis.
		lo, hi := s.q(0.01), s.q(0.99)
		for _, d := range s.lat {
			if d >= lo && d <= hi {
				vals = append(vals, float64(d.Microseconds())/1000)
			}
		}
		b, err := plotter.NewBoxPlot(w, float64(i), vals)
		if err != nil {
			return err
		}
		b.FillColor = color.RGBA{R: 120, G: 160, B: 220, A: 255}
		b.GlyphStyle.Radius = 0 // no outlier dots: the table has the tail
		p.Add(b)
	}
	p.NominalX(labels...)
	return p.Save(vg.Length(160*len(labels)+80), 10*vg.Centimeter, file)
}

// linePlot draws lines over a log x axis ticked at their points; the legend goes
// top left when legendTop (where rising lines leave room), else bottom right.
func linePlot(file, title, x, y string, lines map[string]plotter.XYs, legendTop bool) error {
	p := newPlot(title)
	p.X.Label.Text, p.Y.Label.Text = x, y
	p.Y.Min = 0
	names := make([]string, 0, len(lines))
	for name := range lines {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		l, pts, err := plotter.NewLinePoints(lines[name])
		if err != nil {
			return err
		}
		c := palette[i%len(palette)]
		l.Color, pts.Color = c, c
		p.Add(l, pts)
		p.Legend.Add(name, l, pts)
	}
	var ticks []plot.Tick
	longest := names[0]
	for _, name := range names {
		if len(lines[name]) > len(lines[longest]) {
			longest = name
		}
	}
	for _, pt := range lines[longest] {
		ticks = append(ticks, plot.Tick{Value: pt.X, Label: fmt.Sprintf("%g", pt.X)})
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Legend.Top, p.Legend.Left = legendTop, legendTop
	return p.Save(12*vg.Centimeter, 9*vg.Centimeter, file)
}

func barPlot(file, title, y string, labels []string, vals plotter.Values) error {
	p := newPlot(title)
	p.Y.Label.Text = y
	bars, err := plotter.NewBarChart(vals, vg.Points(40))
	if err != nil {
		return err
	}
	bars.Color = palette[0]
	p.Add(bars)
	p.NominalX(labels...)
	return p.Save(14*vg.Centimeter, 9*vg.Centimeter, file)
}

var palette = []color.Color{
	color.RGBA{R: 31, G: 119, B: 180, A: 255},
	color.RGBA{R: 214, G: 39, B: 40, A: 255},
	color.RGBA{R: 44, G: 160, B: 44, A: 255},
}
