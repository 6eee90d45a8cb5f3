package worker_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/moby/moby/client"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/internal/testworker"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// BenchmarkWarmMemory is what one warm container holds, by sandbox of the example
// config: default, datascience as configured (numpy, pandas and matplotlib.pyplot
// preloaded), and datascience with nothing preloaded (what the preload costs each
// warm container). One container, after 20 jobs, settled: Docker's stats (the cgroup's
// usage and anonymous memory), and each of its processes' proportional set size
// (PSS, shared pages divided among their sharers) and private memory, read from
// /proc on the host. Run it with -benchtime 1x.
func BenchmarkWarmMemory(b *testing.B) {
	for _, c := range []struct {
		name, spec, script string
		env                map[string]string
	}{
		{"default", "default", trivial, nil},
		{"datascience", "datascience", "import pandas as pd\nemit_result(int(pd.Series([1, 2]).sum()))", nil},
		{"datascience-no-preload", "datascience", "import pandas as pd\nemit_result(int(pd.Series([1, 2]).sum()))", map[string]string{"JAZZMINE_PRELOAD": ""}},
	} {
		b.Run(c.name, func(b *testing.B) { warmMemory(b, c.spec, c.script, c.env) })
	}
}

func warmMemory(b *testing.B, spec, script string, env map[string]string) {
	_, nc := testenv.NATS(b)
	opts := testworker.Options{Sandbox: sandboxpool.Sandbox{PoolSize: 1}}
	if spec != "default" {
		opts.Spec = spec
	}
	opts.Pool = func(c *sandboxpool.Config) {
		for k, v := range env {
			if c.Sandboxes[0].Env == nil {
				c.Sandboxes[0].Env = map[string]string{}
			}
			c.Sandboxes[0].Env[k] = v
		}
	}
	w, _ := testworker.Start(b, nc, opts)
	c := newClient(b, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for range 20 {
		res, err := c.Run(ctx, wire.Job{Sandbox: spec, Script: script, TimeoutSec: 60})
		if err != nil || !res.Success {
			b.Fatalf("run: %v %+v", err, res)
		}
	}
	time.Sleep(2 * time.Second) // the last container resets, its next child warms
	b.ResetTimer()
	ids := testenv.ContainersOf(b, w.ID())
	if len(ids) != 1 {
		b.Fatalf("worker has %d containers, want 1", len(ids))
	}
	usage, anon := containerMemory(b, ids[0])
	values := map[string]float64{"usage_mb": usage, "anon_mb": anon}
	procs := containerProcesses(b, ids[0])
	// The report names them: the harness, the zygote it forked, the warm child the
	// zygote forked: a chain of three.
	if len(procs) != 3 || procs[0].children != 1 || procs[1].children != 1 || procs[2].children != 0 {
		b.Fatalf("the warm container's processes are not the harness, the zygote and the warm child: %+v", procs)
	}
	for i, p := range procs {
		values[fmt.Sprintf("proc_%d_pss_mb", i+1)], values[fmt.Sprintf("proc_%d_private_mb", i+1)] = p.pss, p.private
		b.Logf("process %d: %s: PSS %.1f MiB, private %.1f MiB", i+1, p.cmd, p.pss, p.private)
	}
	b.StopTimer()
	for k, v := range values {
		b.ReportMetric(v, strings.ReplaceAll(k, "_", "-"))
	}
	testenv.Record(b, "", nil, values)
}

// memProcess is one process of a container: its command line, and its proportional
// set size and private memory in MiB.
type memProcess struct {
	cmd          string
	pss, private float64
	children     int
}

// containerProcesses walks a container's process tree from its init, depth first,
// reading each process's smaps_rollup on the host (runc: the container's processes
// are the host's).
func containerProcesses(b *testing.B, id string) []memProcess {
	res, err := testenv.Docker(b).ContainerInspect(context.Background(), id, dockerclient.ContainerInspectOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var out []memProcess
	var walk func(pid int)
	walk = func(pid int) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		p := memProcess{cmd: strings.TrimSpace(string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))}
		p.pss, p.private = smapsRollup(b, pid)
		children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		p.children = len(strings.Fields(string(children)))
		out = append(out, p)
		for _, f := range strings.Fields(string(children)) {
			if child, err := strconv.Atoi(f); err == nil {
				walk(child)
			}
		}
	}
	walk(res.Container.State.Pid)
	return out
}

// smapsRollup is a process's PSS and private memory (clean and dirty), in MiB.
func smapsRollup(b *testing.B, pid int) (pss, private float64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "Pss:":
			pss = kb / 1024
		case "Private_Clean:", "Private_Dirty:":
			private += kb / 1024
		}
	}
	return pss, private
}
