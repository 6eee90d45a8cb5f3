package nats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	mobyclient "github.com/moby/moby/client"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// The fault test's load: faultJobs jobs from faultAgents agents, each following up to
// agentWindow executions at once, on two workers of four container slots each.
const (
	faultJobs   = 1000
	faultAgents = 8
	agentWindow = 8
	// The kills land while jobs run: the worker after killWorkerAfter results, the
	// NATS server after killServerAfter.
	killWorkerAfter = 200
	killServerAfter = 400
)

// TestAClusterLosesNoJobWhenAWorkerAndANATSServerDie runs three nats-server processes
// (deploy/nats/cluster.conf) and two `worker serve` processes with replicas: 3, and
// 1,000 jobs from eight concurrent agents. While the jobs run it kills one worker with
// SIGKILL, then, with SIGKILL too and for good, the NATS server that leads both
// streams and the jobs consumer (the harshest loss of one node: no leadership handed
// over, three elections). Every job must end with its own result and exactly one
// script_done in the events stream, and none may run again after an attempt ended it;
// the test reports how many ran more than once (started in more than one attempt:
// cut by the kill). The dead worker's containers must be reaped by the survivor, and
// a container of a worker of another fleet on the same Docker host must be left alone.
// The nodes enforce auth.conf: the workers connect as the fleet's workers, the agents
// as the tenant agents (whose jobs and events cross from their account to the
// fleet's and back), and the test reads the fleet's streams as a worker.
func TestAClusterLosesNoJobWhenAWorkerAndANATSServerDie(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault test runs 1,000 jobs; -short skips it")
	}
	began := time.Now()
	img := testenv.SandboxImage(t) // built once, before two workers race to build it
	servers, keys := startCluster(t, 3)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.url)
	}
	natsURL := strings.Join(urls, ",")
	foreign := createForeignContainer(t, img.Tag)

	// The workers start while the cluster may still be electing its meta leader, as
	// in a fleet started together with its cluster: they wait for JetStream.
	config := writeWorkerConfig(t)
	suffix := time.Now().UnixNano() % 1_000_000
	var workers []*process
	for _, name := range []string{"a", "b"} {
		id := fmt.Sprintf("fault-%s-%d", name, suffix)
		t.Cleanup(func() { testenv.RemoveContainersOf(t, id) }) // after the process is gone
		workers = append(workers, start(t, id, 90*time.Second, []string{"NATS_URL=" + natsURL, "NATS_NKEY=" + keys.worker}, testenv.WorkerBinary(t),
			"serve", "--config", config, "--worker-id", id, "--metrics-addr", "127.0.0.1:0"))
	}
	for _, w := range workers {
		w.waitUntil(t, 3*time.Minute, w.name+" to serve", func() bool { return strings.Contains(w.log.String(), "msg=serving") })
	}
	observer := connect(t, natsURL, "observer", keys.worker)
	js, err := jetstream.New(observer)
	if err != nil {
		t.Fatal(err)
	}
	checkReplicas(t, js, 8)
	createTenantEvents(t, natsURL, keys.agent)

	// A bound for a failed run only: alone on two cores the load takes under a minute.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	load := &faultLoad{results: map[string]*client.Result{}}
	jobs := faultJobList()
	var agents sync.WaitGroup
	agentsDone := make(chan struct{})
	loadStart := time.Now()
	for g := range faultAgents {
		agents.Add(1)
		go func() {
			defer agents.Done()
			load.agent(ctx, natsURL, keys.agent, g, jobs[g*len(jobs)/faultAgents:(g+1)*len(jobs)/faultAgents])
		}()
	}
	go func() { agents.Wait(); close(agentsDone) }()
	t.Cleanup(func() { cancel(); <-agentsDone }) // no agent outlives the test, even a failed one
	after := func(n int64) bool {
		for load.done.Load() < n {
			select {
			case <-agentsDone:
				return false
			case <-time.After(10 * time.Millisecond):
			}
		}
		return true
	}

	victim := workers[0]
	running := watchRunning(t, connect(t, natsURL, "watcher", keys.agent), victim.name)
	if !after(killWorkerAfter) {
		t.Fatalf("the agents ended before the worker was killed: %s", load.failureSummary())
	}
	// The kill lands while the victim runs one of the sleeping jobs: one that its
	// worker started (its started event stored) and has not ended. On a slow machine
	// a kill at any moment could find the victim between jobs, and prove nothing.
	if !running.waitSleeper(time.Minute) {
		t.Fatalf("worker %s ran none of the sleeping jobs within a minute of %d results", victim.name, killWorkerAfter)
	}
	victim.kill(t)
	workerKilled := fault{what: "worker " + victim.name, after: load.done.Load(), at: time.Since(loadStart)}
	if len(testenv.ContainersOf(t, victim.name)) == 0 {
		t.Fatal("the killed worker left no container: the reaper check below would prove nothing")
	}

	if !after(killServerAfter) {
		t.Fatalf("the agents ended before the NATS server was killed: %s", load.failureSummary())
	}
	// The server to kill leads the tenant's events stream, which sources the
	// tenant's events from the fleet's (when they came unacknowledged, a kill of its
	// leader lost some); the jobs stream, the fleet's events stream and the jobs
	// consumer are led there too first, so that one kill costs every part a new
	// leader.
	tenantLeader := tenantEventsLeader(t, natsURL, keys.agent)
	var doomed *natsServer
	for _, s := range servers {
		if s.name == tenantLeader {
			doomed = s
		}
	}
	if doomed == nil {
		t.Fatalf("no server of the cluster leads the tenant's events stream: %q", tenantLeader)
	}
	leaders := gatherLeaders(t, observer, js, doomed.name)
	leaders["the tenant's "+wire.StreamEvents] = tenantLeader
	doomed.kill(t)
	serverKilled := fault{what: fmt.Sprintf("NATS server %s (leader of %s)", doomed.name, describeLeaders(leaders, doomed.name)),
		after: load.done.Load(), at: time.Since(loadStart)}

	<-agentsDone
	loadTook := time.Since(loadStart)
	for _, f := range load.failures {
		t.Error(f)
	}
	if n := len(load.results); n != faultJobs {
		t.Errorf("%d of %d jobs ended with a result", n, faultJobs)
	}

	// Nothing may still be queued or running before the events are counted: a late
	// redelivery would run a job once more.
	drained := waitUntil(2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := js.Stream(ctx, wire.StreamExec)
		if err != nil {
			return false
		}
		info, err := stream.Info(ctx)
		if err != nil || info.State.Msgs != 0 {
			return false
		}
		cons, err := stream.Consumer(ctx, wire.ConsumerName("default"))
		if err != nil {
			return false
		}
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0
	})
	if !drained {
		t.Errorf("jobs still queued or unacknowledged 2 minutes after the load: %s", backlog(js))
	}
	runs := readHistories(t, js)
	var ranTwice, doneTwice, ranAfterEnd, lost, movedFromVictim int
	for _, job := range jobs {
		h := runs[job.ExecutionID]
		if h == nil || len(h.done) == 0 {
			lost++
			t.Errorf("job %s has no script_done in the events stream; its events: %s", job.ExecutionID, h)
			continue
		}
		res := load.results[job.ExecutionID]
		if res == nil {
			lost++
			t.Errorf("job %s has a script_done, but its agent did not get it; its events: %s", job.ExecutionID, h)
			continue
		}
		if len(h.started) > 1 {
			ranTwice++
		}
		if len(h.done) > 1 {
			doneTwice++
			t.Errorf("job %s has %d script_done events; its events: %s", job.ExecutionID, len(h.done), h)
		}
		if ended := slices.Min(slices.Collect(maps.Keys(h.done))); len(h.started) > 0 && slices.Max(slices.Collect(maps.Keys(h.started))) > ended {
			ranAfterEnd++
			t.Errorf("job %s ran again after attempt %d had ended it; its events: %s", job.ExecutionID, ended, h)
		}
		if slices.Contains(slices.Collect(maps.Values(h.started)), victim.name) && res.WorkerID != victim.name && res.Attempt > 1 {
			movedFromVictim++
		}
	}
	if movedFromVictim == 0 {
		t.Error("no job that the killed worker was running was finished by the other: the kill did not land mid-job, and the test proved nothing")
	}

	testenv.WaitFor(t, time.Minute, "the dead worker's containers to be removed", func() bool { return len(testenv.ContainersOf(t, victim.name)) == 0 })
	if _, err := testenv.Docker(t).ContainerInspect(context.Background(), foreign, mobyclient.ContainerInspectOptions{}); err != nil {
		t.Errorf("the container of another fleet's worker was removed: %v", err)
	}

	t.Logf("%s killed with SIGKILL after %d results (%v into the load)", workerKilled.what, workerKilled.after, workerKilled.at.Round(time.Millisecond))
	t.Logf("%s killed with SIGKILL after %d results (%v into the load), not restarted", serverKilled.what, serverKilled.after, serverKilled.at.Round(time.Millisecond))
	t.Logf("jobs the killed worker was running, finished by the other: %d", movedFromVictim)
	t.Logf("agents: %d submissions tried again, %d executions followed again, %d events consumers replaced by the client",
		load.submitRetries.Load(), load.followRetries.Load(), load.consumerResumes.Load())
	t.Logf("workers: %d times events were sent again to a stream that could not store them yet; %d redelivered jobs acked without running again, their script_done stored by an earlier attempt",
		strings.Count(workers[1].log.String(), "events not stored yet"), strings.Count(workers[0].log.String()+workers[1].log.String(), "had ended already"))
	t.Logf("SUMMARY fault test: %d jobs from %d agents, %d ended with their own result, %d failed, %d lost; %d with more than one script_done, %d ran again after their end; %d ran more than once (cut by the kill); load %v, whole test %v",
		faultJobs, faultAgents, faultJobs-len(load.failures), len(load.failures), lost, doneTwice, ranAfterEnd, ranTwice, loadTook.Round(time.Millisecond), time.Since(began).Round(time.Second))
	if len(load.failures) != 0 || lost != 0 || doneTwice != 0 || ranAfterEnd != 0 {
		t.Errorf("every job must end once, with its own result: %d failed, %d lost, %d with more than one script_done, %d ran again after their end",
			len(load.failures), lost, doneTwice, ranAfterEnd)
	}
}

// runningJobs are the sleeping jobs a worker has started and not ended, as its
// events say.
type runningJobs struct {
	mu  sync.Mutex
	now map[string]time.Time // by execution id: when its started event came
}

// watchRunning follows the started and script_done events of the jobs that worker
// runs, from now on, over nc, a connection of the tenant agents (the workers' own
// may not subscribe to events).
func watchRunning(t *testing.T, nc *nats.Conn, worker string) *runningJobs {
	t.Helper()
	r := &runningJobs{now: map[string]time.Time{}}
	sub, err := nc.Subscribe(wire.SubjectPrefixEvents+".>", func(msg *nats.Msg) {
		ev, err := wire.DecodeEvent(msg.Header.Get(wire.HeaderContentType), msg.Data)
		if err != nil || ev.WorkerID != worker {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		switch ev.Type {
		case wire.EventStarted:
			if job, _ := strconv.Atoi(ev.Metadata["job"]); job%3 == 0 {
				r.now[ev.ExecutionID] = time.Now()
			}
		case wire.EventScriptDone:
			delete(r.now, ev.ExecutionID)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return r
}

// waitSleeper waits until a sleeping job started 5 to 150 ms ago and has not ended
// (its script sleeps 200 ms or more), and says whether one did within the time.
func (r *runningJobs) waitSleeper(within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		r.mu.Lock()
		for _, at := range r.now {
			if since := time.Since(at); since > 5*time.Millisecond && since < 150*time.Millisecond {
				r.mu.Unlock()
				return true
			}
		}
		r.mu.Unlock()
	}
	return false
}

// faultJobList returns the jobs: a third of them sleep 200 to 590 ms, so that the kills
// find scripts running; each emits a result with its number, which its metadata
// holds too.
func faultJobList() []wire.Job {
	suffix := time.Now().UnixNano() % 1_000_000
	var jobs []wire.Job
	for i := range faultJobs {
		script := fmt.Sprintf("emit_result({'job': %d})", i)
		if i%3 == 0 {
			script = fmt.Sprintf("import time\ntime.sleep(0.%02d)\n", 20+i%40) + script
		}
		jobs = append(jobs, wire.Job{ExecutionID: fmt.Sprintf("fault-%d-%04d", suffix, i), Sandbox: "default", Script: script, TimeoutSec: 30,
			Metadata: map[string]string{"job": fmt.Sprint(i)}})
	}
	return jobs
}

// faultLoad is the agents' side of the fault test.
type faultLoad struct {
	done          atomic.Int64 // jobs that ended, with a result or a failure
	submitRetries atomic.Int64 // submissions tried again after an error
	followRetries atomic.Int64 // executions followed again after reading their events failed
	// consumerResumes counts the events consumers the client replaced, lost with
	// their server (the client logs each at debug level).
	consumerResumes atomic.Int64

	mu       sync.Mutex // guards the fields below
	results  map[string]*client.Result
	failures []string
}

// agent runs its jobs, agentWindow at a time, over its own connection to the
// cluster as an agent of the tenant agents (seed is its seed file), as a separate
// agent process would.
func (l *faultLoad) agent(ctx context.Context, natsURL, seed string, g int, jobs []wire.Job) {
	nkey, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		l.fail(fmt.Sprintf("agent %d: %v", g, err))
		return
	}
	nc, err := nats.Connect(natsURL, nkey, nats.Name(fmt.Sprintf("agent-%d", g)), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		l.fail(fmt.Sprintf("agent %d: connect: %v", g, err))
		return
	}
	defer nc.Close()
	ct := wire.ContentTypeMsgpack
	if g%2 == 1 {
		ct = wire.ContentTypeJSON
	}
	c, err := client.New(client.Config{Conn: nc, ContentType: ct, Logger: slog.New(&resumeCounter{n: &l.consumerResumes})})
	if err != nil {
		l.fail(fmt.Sprintf("agent %d: %v", g, err))
		return
	}
	window := make(chan struct{}, agentWindow)
	var wg sync.WaitGroup
	for _, job := range jobs {
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-window; wg.Done() }()
			var notes []string
			res, err := l.run(ctx, c, job, &notes)
			l.mu.Lock()
			defer l.mu.Unlock()
			switch {
			case err != nil:
				l.failures = append(l.failures, fmt.Sprintf("job %s: %v (agent %d: %s)", job.ExecutionID, err, g, strings.Join(notes, "; ")))
			case !res.Success:
				l.failures = append(l.failures, fmt.Sprintf("job %s: attempt %d on %s failed: %s: %s", job.ExecutionID, res.Attempt, res.WorkerID, res.ErrorKind, res.Error))
			default:
				got, _ := json.Marshal(res.FinalData)
				if want := fmt.Sprintf(`{"job":%s}`, job.Metadata["job"]); string(got) != want {
					l.failures = append(l.failures, fmt.Sprintf("job %s: result %s, want %s", job.ExecutionID, got, want))
				}
			}
			if err == nil {
				l.results[job.ExecutionID] = res
			}
			l.done.Add(1)
		}()
	}
	wg.Wait()
}

// run submits the job and waits for its result, the way an agent that must not lose
// a job does: a submission that failed (the server it talked to went away before it
// acknowledged) is tried again with the same execution id, which the jobs stream's
// duplicate window makes safe; an execution whose events could not be read is
// followed again the same way (the stream drops the job as a duplicate and the new
// Execution reads the events from the first).
func (l *faultLoad) run(ctx context.Context, c *client.Client, job wire.Job, notes *[]string) (*client.Result, error) {
	note := func(format string, args ...any) {
		*notes = append(*notes, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		exe, err := c.Submit(sctx, job)
		cancel()
		if err == nil {
			note("submitted (duplicate %v)", exe.Duplicate)
		} else {
			note("submit: %v", err)
		}
		if err != nil {
			if errors.Is(err, wire.ErrInvalidJob) || ctx.Err() != nil {
				return nil, err
			}
			l.submitRetries.Add(1)
			select {
			case <-time.After(250 * time.Millisecond):
			case <-ctx.Done():
				return nil, err
			}
			continue
		}
		res, err := exe.Wait(ctx)
		exe.Close()
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no result in time: %w", err)
		}
		note("wait: %v", err)
		l.followRetries.Add(1)
	}
}

func (l *faultLoad) fail(msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures = append(l.failures, msg)
}

func (l *faultLoad) failureSummary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failures) == 0 {
		return "no failures"
	}
	return fmt.Sprintf("%d failures, the first: %s", len(l.failures), l.failures[0])
}

// resumeCounter is a slog.Handler that counts the client's records of an events
// consumer replaced, and drops every record.
type resumeCounter struct{ n *atomic.Int64 }

func (h *resumeCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *resumeCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *resumeCounter) WithGroup(string) slog.Handler            { return h }
func (h *resumeCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "new events consumer") {
		h.n.Add(1)
	}
	return nil
}

type fault struct {
	what  string
	after int64
	at    time.Duration
}

// writeWorkerConfig writes the workers' config: the example sandbox, everything on
// three replicas, and failures noticed in seconds (a job whose worker died is
// redelivered after 5 s; a dead worker's containers are reaped 6 s after its last
// heartbeat). max_ack_pending is the fleet's capacity: two workers of four slots.
func writeWorkerConfig(t *testing.T) string {
	t.Helper()
	cfg := fmt.Sprintf(`worker:
  replicas: 3
  ack_wait: 5s
  heartbeat: 1s
  liveness_ttl: 6s
  reap_interval: 1s
  reap_min_age: 1ms
  reap_grace: 1ms
  shutdown_grace: 10s
  max_ack_pending: {default: 8}
sandboxes:
  default:
    tools: [%q]
    pool: {size: 2, max_overflow: 2}
`, filepath.Join(testenv.RepoRoot(), "examples", "tools", "*.py"))
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// createForeignContainer creates (without starting it) a container labelled as the
// pool labels its own, for a worker of another fleet that this cluster never knew.
func createForeignContainer(t *testing.T, image string) string {
	t.Helper()
	ctx := context.Background()
	res, err := testenv.Docker(t).ContainerCreate(ctx, mobyclient.ContainerCreateOptions{
		Config: &container.Config{Image: image, Cmd: []string{"true"}, Labels: map[string]string{
			sandboxpool.LabelManaged: "true",
			sandboxpool.LabelWorker:  fmt.Sprintf("another-fleet-%d", time.Now().UnixNano()),
			sandboxpool.LabelSandbox: "default",
			"jazzmine.test":          "deploy",
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = testenv.Docker(t).ContainerRemove(context.Background(), res.ID, mobyclient.ContainerRemoveOptions{Force: true})
	})
	return res.ID
}

// connect opens a connection to the cluster for the test itself, as the user of the
// nkey seed file seed.
func connect(t *testing.T, natsURL, name, seed string) *nats.Conn {
	t.Helper()
	nkey, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(natsURL, nkey, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		t.Fatalf("connect as %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// createTenantEvents creates the events stream of the tenant agents, in its account,
// as the agent of the seed file seed, with three replicas: what a deployment on a
// cluster does before its agents' first submit, since the stream the first client
// creates has one replica, and the node holding it may be the one that dies. It is
// the client's stream otherwise (every event of the account, an hour of them).
func createTenantEvents(t *testing.T, natsURL, seed string) {
	t.Helper()
	nc := connect(t, natsURL, "tenant-setup", seed)
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	// The client's first job makes the stream, sourcing the tenant's events from the
	// fleet's stream (JetStream may be electing the tenant's group: tried again).
	var stream jetstream.Stream
	if !waitUntil(60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: "emit_result(1)"}); err != nil || !res.Success {
			t.Logf("the tenant's first job: %+v, %v", res, err)
			return false
		}
		stream, err = js.Stream(ctx, wire.StreamEvents)
		return err == nil
	}) {
		t.Fatalf("create the tenant's events stream: %v", err)
	}
	info := stream.CachedInfo()
	if c := info.Cluster; c == nil || len(c.Replicas) != 2 {
		t.Fatalf("the tenant's events stream: cluster %+v; want three replicas", c)
	}
	if len(info.Config.Sources) != 1 || len(info.Config.Subjects) != 0 {
		t.Fatalf("the tenant's events stream: subjects %v, sources %+v; want the fleet's stream as its only source", info.Config.Subjects, info.Config.Sources)
	}
}

// tenantEventsLeader returns the server that leads the tenant's events stream, as
// the tenant's agent sees it.
func tenantEventsLeader(t *testing.T, natsURL, seed string) string {
	t.Helper()
	stream := fleetStream(t, connect(t, natsURL, "tenant-leader", seed), wire.StreamEvents) // the tenant's own
	if c := stream.CachedInfo().Cluster; c != nil {
		return c.Leader
	}
	return ""
}

// checkReplicas asserts that the streams, the consumer and the buckets the workers
// created have three replicas, each on its own node, and the consumer the fleet's
// MaxAckPending.
func checkReplicas(t *testing.T, js jetstream.JetStream, maxAckPending int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{wire.StreamExec, wire.StreamEvents, "KV_" + worker.BucketWorkers, "KV_" + worker.BucketFleet, "KV_" + worker.BucketCancels} {
		stream, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info := stream.CachedInfo()
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Errorf("stream %s: %d replicas configured, cluster %+v; want 3 on three nodes", name, info.Config.Replicas, info.Cluster)
		}
	}
	cons, err := js.Consumer(ctx, wire.StreamExec, wire.ConsumerName("default"))
	if err != nil {
		t.Fatal(err)
	}
	if info := cons.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 || info.Config.MaxAckPending != maxAckPending {
		t.Errorf("consumer %s: %d replicas configured, cluster %+v, max ack pending %d; want 3 on three nodes and %d",
			info.Name, info.Config.Replicas, info.Cluster, info.Config.MaxAckPending, maxAckPending)
	}
}

// gatherLeaders asks the leaders of the jobs and events streams and of the jobs
// consumer to hand their leadership to the server named target, and returns the leaders after
// (some may have stayed where they were: the test goes on with those).
func gatherLeaders(t *testing.T, nc *nats.Conn, js jetstream.JetStream, target string) map[string]string {
	t.Helper()
	consumer := "consumer " + wire.ConsumerName("default")
	stepdown := map[string]string{
		wire.StreamExec:   "$JS.API.STREAM.LEADER.STEPDOWN." + wire.StreamExec,
		wire.StreamEvents: "$JS.API.STREAM.LEADER.STEPDOWN." + wire.StreamEvents,
		consumer:          "$JS.API.CONSUMER.LEADER.STEPDOWN." + wire.StreamExec + "." + wire.ConsumerName("default"),
	}
	req := fmt.Appendf(nil, `{"placement":{"preferred":%q}}`, target)
	for what, subject := range stepdown {
		if leadersOf(t, js)[what] == target {
			continue
		}
		if _, err := nc.Request(subject, req, 5*time.Second); err != nil {
			t.Logf("move the leader of %s to %s: %v", what, target, err)
		}
	}
	var leaders map[string]string
	waitUntil(10*time.Second, func() bool {
		l, err := tryLeadersOf(js)
		if err == nil {
			leaders = l
		}
		return err == nil && leaders[wire.StreamExec] == target && leaders[wire.StreamEvents] == target && leaders[consumer] == target
	})
	if leaders == nil {
		leaders = leadersOf(t, js)
	}
	return leaders
}

// leadersOf returns the name of the server leading each of the streams and the
// consumer, by their names, retrying for a while (a group electing its leader
// answers 503 meanwhile).
func leadersOf(t *testing.T, js jetstream.JetStream) map[string]string {
	t.Helper()
	var leaders map[string]string
	var err error
	if !waitUntil(30*time.Second, func() bool { leaders, err = tryLeadersOf(js); return err == nil }) {
		t.Fatalf("find the leaders: %v", err)
	}
	return leaders
}

func tryLeadersOf(js jetstream.JetStream) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leaders := map[string]string{}
	for _, name := range []string{wire.StreamExec, wire.StreamEvents} {
		stream, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		if c := stream.CachedInfo().Cluster; c != nil {
			leaders[name] = c.Leader
		}
	}
	cons, err := js.Consumer(ctx, wire.StreamExec, wire.ConsumerName("default"))
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	if c := cons.CachedInfo().Cluster; c != nil {
		leaders["consumer "+wire.ConsumerName("default")] = c.Leader
	}
	return leaders, nil
}

func describeLeaders(leaders map[string]string, server string) string {
	var led []string
	for what, who := range leaders {
		if who == server {
			led = append(led, what)
		}
	}
	slices.Sort(led)
	return strings.Join(led, ", ")
}

// history is what the events stream says of one execution.
type history struct {
	started map[int]string // worker by attempt, for the attempts that started the script
	done    map[int]bool   // attempts with a script_done
	events  []string       // every event, for a failure's message
}

func (h *history) String() string {
	if h == nil {
		return "none"
	}
	return strings.Join(h.events, " ")
}

// waitUntil polls cond until it holds or the time is up, and says which.
func waitUntil(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// backlog describes the jobs stream and its consumer, for a failure's message.
func backlog(js jetstream.JetStream) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, wire.StreamExec)
	if err != nil {
		return err.Error()
	}
	cons, err := stream.Consumer(ctx, wire.ConsumerName("default"))
	if err != nil {
		return err.Error()
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("stream %+v; consumer: pending %d, ack pending %d, redelivered %d, waiting %d, delivered %+v, ack floor %+v",
		stream.CachedInfo().State, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.Delivered, ci.AckFloor)
}

// tenantEvents are the subjects of the tenant agents' events in the fleet's account:
// jazzmine.events.agents.<execution id>.<type>.
const tenantEvents = wire.SubjectPrefixEvents + ".agents.>"

// readHistories reads every event of the tenant agents in the fleet's events stream,
// what the workers stored, through js, a worker's connection.
func readHistories(t *testing.T, js jetstream.JetStream) map[string]*history {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, err := js.Stream(ctx, wire.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(tenantEvents))
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, n := range info.State.Subjects {
		total += n
	}
	if total == 0 {
		t.Fatalf("no event on %s in the fleet's events stream (%d events in all)", tenantEvents, info.State.Msgs)
	}
	cons, err := js.OrderedConsumer(ctx, wire.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{tenantEvents}})
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]*history{}
	for read := uint64(0); read < total; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatalf("read events: %v", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			ev, err := wire.DecodeEvent(msg.Headers().Get(wire.HeaderContentType), msg.Data())
			if err != nil {
				t.Fatalf("decode an event on %s: %v", msg.Subject(), err)
			}
			h := runs[ev.ExecutionID]
			if h == nil {
				h = &history{started: map[int]string{}, done: map[int]bool{}}
				runs[ev.ExecutionID] = h
			}
			meta, _ := msg.Metadata()
			h.events = append(h.events, fmt.Sprintf("[%s a%d #%d %s %s seq %d]", ev.Type, ev.Attempt, ev.Seq, ev.WorkerID, ev.Time.Format("15:04:05.000"), meta.Sequence.Stream))
			switch ev.Type {
			case wire.EventStarted:
				h.started[ev.Attempt] = ev.WorkerID
			case wire.EventScriptDone:
				h.done[ev.Attempt] = true
			}
		}
		if n == 0 {
			// A server of the cluster was killed: the stream may be between leaders
			// (no responders) for a while. Ask again until the deadline.
			select {
			case <-ctx.Done():
				t.Fatalf("read %d of the %d events: %v", read, total, batch.Error())
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		read += uint64(n)
	}
	return runs
}
