package worker_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// workerBinary is the static worker executable (the proxy sidecar runs it from scratch).
func workerBinary(t testing.TB) string { return testenv.WorkerBinary(t) }

// workerProcess is `worker serve` running as its own process.
type workerProcess struct {
	id  string
	cmd *exec.Cmd
	log *syncWriter
}

// startProcess starts `worker serve` with the config against the NATS server at url.
func startProcess(t testing.TB, config, url, id string) *workerProcess {
	t.Helper()
	log := &syncWriter{w: &bytes.Buffer{}}
	cmd := exec.Command(workerBinary(t), "serve", "--config", config, "--worker-id", id, "--log-level", "debug", "--metrics-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "NATS_URL="+url)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &workerProcess{id: id, cmd: cmd, log: log}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(90 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
		if t.Failed() {
			t.Logf("log of worker %s:\n%s", id, log.String())
		}
		testenv.RemoveContainersOf(t, id) // a killed worker's, if the test failed before the reaper ran
	})
	return p
}

// serving waits until the worker says it serves: its streams, buckets and consumers
// are made (a job or session call published before its stream exists fails: no
// stream answers it).
func (p *workerProcess) serving(t testing.TB) {
	t.Helper()
	testenv.WaitFor(t, 3*time.Minute, "worker "+p.id+" to serve", func() bool { return strings.Contains(p.log.String(), "msg=serving") })
}

// stop ends the worker with SIGTERM, as an operator would, and checks that it left
// no container behind.
func (p *workerProcess) stop(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("worker %s: %v", p.id, err)
	}
	if left := testenv.ContainersOf(t, p.id); len(left) != 0 {
		t.Errorf("worker %s left containers %v after its shutdown", p.id, left)
	}
}

// httpGetter returns a function that GETs a path of the worker's metrics and health
// listener (its address read from the log) and returns the status and the body.
func (p *workerProcess) httpGetter(t testing.TB) func(path string) (int, string) {
	t.Helper()
	urlRe := regexp.MustCompile(`url=http://(127\.0\.0\.1:\d+)/metrics`)
	var base string
	testenv.WaitFor(t, time.Minute, "the metrics listener", func() bool {
		if m := urlRe.FindStringSubmatch(p.log.String()); m != nil {
			base = "http://" + m[1]
		}
		return base != ""
	})
	return func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
}

// startChild starts cmd with its output into the returned log, and stops it at the
// end of the test: SIGTERM, SIGKILL if it has not exited within 90 s, then after, if
// not nil. exited is closed once it has exited.
func startChild(t testing.TB, cmd *exec.Cmd, after func()) (log *syncWriter, exited <-chan struct{}) {
	t.Helper()
	log = &syncWriter{w: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if after != nil {
			after()
		}
	})
	return log, done
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// writeConfig writes a config with the example sandbox and fast failure detection.
func writeConfig(t testing.TB, extra string) string {
	t.Helper()
	return writeConfigWith(t, extra, "pool: {size: 1, max_overflow: 1}")
}

// writeConfigWith is writeConfig with the sandbox's settings beyond its tools: YAML
// lines at the sandbox's indentation, its pool line first.
func writeConfigWith(t testing.TB, extra, pool string) string {
	t.Helper()
	tools := filepath.Join(testenv.RepoRoot(), "examples", "tools", "*.py")
	cfg := fmt.Sprintf(`worker:
  ack_wait: 3s
  heartbeat: 500ms
  liveness_ttl: 2s
  reap_interval: 1s
  reap_min_age: 1ms
  reap_grace: 1ms
  shutdown_grace: 5s
%ssandboxes:
  default:
    tools: [%q]
    %s
`, extra, tools, pool)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAJobSurvivesItsWorkerBeingKilled kills the worker process running a job with
// SIGKILL: another worker runs it again (attempt 2) to a terminal event, and removes
// the dead worker's containers.
func TestAJobSurvivesItsWorkerBeingKilled(t *testing.T) {
	testenv.SandboxImage(t) // built once, before the processes race to build it
	srv, nc := testenv.NATS(t)
	config := writeConfig(t, "")
	suffix := time.Now().UnixNano() % 1_000_000
	procs := map[string]*workerProcess{}
	for _, name := range []string{"a", "b"} {
		id := fmt.Sprintf("proc-%s-%d", name, suffix)
		procs[id] = startProcess(t, config, srv.ClientURL(), id)
	}
	a := newAgent(t, nc)
	testenv.WaitFor(t, 2*time.Minute, "both workers to serve", func() bool {
		for id := range procs {
			if len(testenv.ContainersOf(t, id)) == 0 {
				return false
			}
		}
		return true
	})
	id := newID("survivor")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", TimeoutSec: 60,
		Script: "import os, time\nprint('attempt starting', flush=True)\ntime.sleep(4)\nemit_result('finished')"})
	var victim *workerProcess
	testenv.WaitFor(t, time.Minute, "the job to start", func() bool {
		if ev := find(a.allEvents(id), wire.EventStdout); ev != nil {
			victim = procs[ev.WorkerID]
			return true
		}
		return false
	})
	if err := victim.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = victim.cmd.Wait()
	if left := testenv.ContainersOf(t, victim.id); len(left) == 0 {
		t.Fatal("the killed worker left no container: the reaper test below would prove nothing")
	}

	evs := a.events(id, 2*time.Minute) // the first script_done: attempt 1 never published one
	done := last(evs)
	if done.Attempt != 2 || !done.Success || done.WorkerID == victim.id {
		t.Errorf("script_done = attempt %d on %s, success %v; want attempt 2 on the other worker: %s", done.Attempt, done.WorkerID, done.Success, describe(evs))
	}
	testenv.WaitFor(t, time.Minute, "the dead worker's containers to be removed", func() bool { return len(testenv.ContainersOf(t, victim.id)) == 0 })
}

// TestAJobOutOfDeliveriesStillEnds: with one delivery allowed, a job whose worker is
// killed is given up, and still ends with a terminal event, although no other worker
// ran when its delivery ran out: the next worker to start gets it again and ends it
// without running it.
func TestAJobOutOfDeliveriesStillEnds(t *testing.T) {
	testenv.SandboxImage(t)
	srv, nc := testenv.NATS(t)
	config := writeConfig(t, "  max_deliver: 1\n")
	suffix := time.Now().UnixNano() % 1_000_000
	victimID, otherID := fmt.Sprintf("once-a-%d", suffix), fmt.Sprintf("once-b-%d", suffix)
	victim := startProcess(t, config, srv.ClientURL(), victimID)
	a := newAgent(t, nc)
	testenv.WaitFor(t, 2*time.Minute, "the worker to serve", func() bool { return len(testenv.ContainersOf(t, victimID)) > 0 })
	id := newID("once")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", TimeoutSec: 60,
		Script: "print('running', flush=True)\nimport time\ntime.sleep(30)"})
	testenv.WaitFor(t, time.Minute, "the job to start", func() bool { return find(a.allEvents(id), wire.EventStdout) != nil })
	_ = victim.cmd.Process.Kill()
	_ = victim.cmd.Wait()
	startProcess(t, config, srv.ClientURL(), otherID)

	evs := a.events(id, 2*time.Minute)
	e := find(evs, wire.EventError)
	if e == nil || e.Kind != wire.KindInfrastructure || last(evs).Success || last(evs).WorkerID != otherID {
		t.Errorf("events: %s, want an infrastructure error and a failed script_done from the other worker", describe(evs))
	}
	if all := a.allEvents(id); count(all, wire.EventStarted) != 1 || count(all, wire.EventScriptDone) != 1 {
		t.Errorf("events: %s, want the one run and the one end", describe(all))
	}
	js := a.js
	stream, err := js.Stream(t.Context(), wire.StreamExec)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the given-up job to leave the backlog", func() bool {
		info, err := stream.Info(t.Context())
		return err == nil && info.State.Msgs == 0
	})
}

// TestSIGTERMLetsJobsFinishThenHandsTheRestToAnotherWorker: after SIGTERM a short job
// finishes within the grace period; a long one is stopped at its end and goes back to
// the queue without a script_done, and another worker runs it to its one end. The
// worker removes its containers.
func TestSIGTERMLetsJobsFinishThenHandsTheRestToAnotherWorker(t *testing.T) {
	testenv.SandboxImage(t)
	srv, nc := testenv.NATS(t)
	config := writeConfig(t, "") // shutdown_grace: 5s, two slots
	id := fmt.Sprintf("term-%d", time.Now().UnixNano()%1_000_000)
	p := startProcess(t, config, srv.ClientURL(), id)
	a := newAgent(t, nc)
	testenv.WaitFor(t, 2*time.Minute, "the worker to serve", func() bool { return len(testenv.ContainersOf(t, id)) > 0 })
	short, long := newID("short"), newID("long")
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: short, Sandbox: "default", Script: "print('go', flush=True)\nimport time\ntime.sleep(1)\nemit_result('made it')"})
	a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: long, Sandbox: "default", TimeoutSec: 120, Script: "print('go', flush=True)\nimport time\ntime.sleep(8)\nemit_result('outlived the grace')"})
	testenv.WaitFor(t, time.Minute, "both jobs to start", func() bool {
		return find(a.allEvents(short), wire.EventStdout) != nil && find(a.allEvents(long), wire.EventStdout) != nil
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if done := last(a.events(short, time.Minute)); !done.Success {
		t.Errorf("the short job did not finish within the grace period: %+v", done)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("worker exit: %v", err)
	}
	if evs := a.allEvents(long); count(evs, wire.EventScriptDone) != 0 || find(evs, wire.EventError) != nil {
		t.Errorf("the long job after the worker stopped: %s, want its first attempt left without an end", describe(evs))
	}
	if n := jobsQueued(t, a.js); n != 1 {
		t.Errorf("%d jobs in the stream after the worker stopped, want the long one back in the queue", n)
	}

	other := fmt.Sprintf("term-other-%d", time.Now().UnixNano()%1_000_000)
	startProcess(t, config, srv.ClientURL(), other)
	if done := last(a.events(long, 2*time.Minute)); !done.Success || done.Attempt != 2 || done.WorkerID != other {
		t.Errorf("the long job's end: attempt %d on %s, success %v; want attempt 2 on %s, a success", done.Attempt, done.WorkerID, done.Success, other)
	}
	testenv.WaitFor(t, 10*time.Second, "the long job to leave the stream", func() bool { return jobsQueued(t, a.js) == 0 })
	if evs := a.allEvents(long); count(evs, wire.EventScriptDone) != 1 {
		t.Errorf("the long job: %s, want one script_done", describe(evs))
	}
	if left := testenv.ContainersOf(t, id); len(left) != 0 {
		t.Errorf("containers left after SIGTERM: %v", left)
	}
}
