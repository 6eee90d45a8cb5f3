package nats_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/wire"
)

// BenchmarkScale is the control plane at scale, by simulation: worker processes (this
// test binary in simWorkerEnv's mode) whose pools run on an engine in memory
// (internal/fakeengine, a harness that answers in microseconds), so that the jobs
// cost what NATS and the workers spend on them and no container, against the
// three-node cluster of deploy/nats (separate nats-server processes, with auth.conf:
// the jobs are a tenant's). A backlog of trivial jobs is
// published at once and drained: jobs/s, each job's time from publish to its
// script_done (mostly its wait in the queue), and CPU per job of the NATS servers, of
// the workers and of this process (the agents), as the workers grow, as the backlog
// grows, and as the same backlog is spread over more tenants (a cluster whose
// auth.conf has 50 tenants); how long a cancel of the last job queued takes at that
// depth; and 1,000 sessions opened at once (simulateSessions). Run it with
// -benchtime 1x (each iteration drains one backlog).
//
//	go test -run '^$' -bench 'Scale' -benchtime 1x -timeout 60m ./deploy/nats/
func BenchmarkScale(b *testing.B) {
	for _, c := range []struct{ workers, backlog, tenants int }{
		{1, 10_000, 1}, {2, 10_000, 1}, {4, 10_000, 1}, {8, 10_000, 1}, {16, 10_000, 1},
		{4, 1_000, 1}, {4, 100_000, 1},
		{4, 10_000, 10}, {4, 10_000, 50},
	} {
		name := fmt.Sprintf("workers=%d/backlog=%d", c.workers, c.backlog)
		if c.tenants > 1 {
			name += fmt.Sprintf("/tenants=%d", c.tenants)
		}
		b.Run(name, func(b *testing.B) { simulate(b, c.workers, c.backlog, c.tenants) })
	}
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("workers=8/sessions=%d", n), func(b *testing.B) { simulateSessions(b, 8, n) })
	}
}

// simCluster starts the three nodes, with an auth.conf of the given number of
// tenants (t01, t02, ...), or the static one (its one tenant, agents) for one; it
// returns the cluster's URL and a connection of each tenant's agents.
func simCluster(b *testing.B, tenants int) (url string, keys clusterKeys, servers []*natsServer, agents []*nats.Conn) {
	var names []string
	if tenants > 1 {
		for i := range tenants {
			names = append(names, fmt.Sprintf("t%02d", i+1))
		}
	}
	servers, keys = startClusterOf(b, 3, names)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.url)
	}
	url = strings.Join(urls, ",")
	if len(names) == 0 {
		return url, keys, servers, []*nats.Conn{testenv.ConnectSeed(b, url, keys.agent, nil)}
	}
	for _, name := range names {
		agents = append(agents, testenv.ConnectSeed(b, url, keys.tenants[name], nil))
	}
	return url, keys, servers, agents
}

func simulate(b *testing.B, workers, backlog, tenants int) {
	url, keys, servers, agents := simCluster(b, tenants)
	sandbox := "sim"
	procs := startSimWorkers(b, url, keys, sandbox, workers, 0)
	var jss []jetstream.JetStream
	for _, nc := range agents {
		jss = append(jss, simJS(b, nc))
	}
	done := newDoneWatch(b, agents...)
	var lat []time.Duration
	var cancelTook []time.Duration
	var failed, ranFirst int
	var elapsed time.Duration
	var natsCPU, workersCPU, agentCPU time.Duration
	var republished int
	b.ResetTimer()
	for range b.N {
		ids := make([]string, backlog)
		for i := range ids {
			ids[i] = client.NewExecutionID()
		}
		done.expect(ids)
		nats0, workers0, agent0 := serversCPU(servers), processesCPU(procs), testenv.SelfCPU()
		start := time.Now()
		published, again := publishSpread(b, jss, sandbox, ids)
		republished += again
		// A cancel at depth: the last job queued, while the rest drain.
		c0 := time.Now()
		last := len(ids) - 1
		if err := agents[last%len(agents)].Publish(wire.CancelSubject(ids[last]), nil); err != nil {
			b.Fatal(err)
		}
		ends := done.wait(b, 10*time.Minute)
		elapsed += time.Since(start)
		natsCPU += serversCPU(servers) - nats0
		workersCPU += processesCPU(procs) - workers0
		agentCPU += testenv.SelfCPU() - agent0
		for i, id := range ids {
			end := ends[id]
			if i == last {
				cancelTook = append(cancelTook, end.at.Sub(c0))
				if end.success {
					ranFirst++ // the job was taken before the cancel found it
				}
				continue
			}
			if !end.success {
				failed++
				continue
			}
			lat = append(lat, end.at.Sub(published[i]))
		}
	}
	b.StopTimer()
	jobs := float64(b.N * backlog)
	perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / jobs }
	slices.Sort(lat)
	b.ReportMetric(jobs/elapsed.Seconds(), "jobs/s")
	b.ReportMetric(float64(failed), "failed")
	b.ReportMetric(perJob(natsCPU), "nats-cpu-ms/job")
	b.ReportMetric(perJob(workersCPU), "workers-cpu-ms/job")
	b.ReportMetric(perJob(agentCPU), "agents-cpu-ms/job")
	b.ReportMetric(float64(testenv.Quantile(lat, 0.5).Microseconds())/1000, "wait-median-ms")
	b.ReportMetric(float64(testenv.Quantile(lat, 0.99).Microseconds())/1000, "wait-p99-ms")
	b.ReportMetric(float64(slices.Max(cancelTook).Microseconds())/1000, "cancel-at-depth-ms")
	b.ReportMetric(float64(ranFirst), "cancel-too-late")
	b.ReportMetric(float64(republished), "republished")
}

// publishSpread publishes ids[i] through jss[i%len(jss)], each tenant's share from a
// goroutine of its own, and returns when each job was published.
func publishSpread(b *testing.B, jss []jetstream.JetStream, sandbox string, ids []string) (at []time.Time, again int) {
	at = make([]time.Time, len(ids))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for t, js := range jss {
		wg.Go(func() {
			var mine []int
			for i := t; i < len(ids); i += len(jss) {
				mine = append(mine, i)
			}
			n := publishAll(b, js, sandbox, ids, mine, at)
			mu.Lock()
			again += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return at, again
}

// simulateSessions opens sessions sessions at once on workers workers (each with
// room for its share and a few more), through the Go client: every session's first
// call (which opens it: a claim in the sessions bucket and a consumer of its own),
// then a second call of each with all of them open, then a close of each. Per phase:
// its wall time, the calls' median and p99, and the NATS servers' CPU per session.
func simulateSessions(b *testing.B, workers, sessions int) {
	url, keys, servers, agents := simCluster(b, 1)
	sandbox := "simsessions"
	room := sessions/workers + sessions/(2*workers) + 4
	procs := startSimWorkers(b, url, keys, sandbox, workers, room)
	c, err := client.New(client.Config{Conn: agents[0]})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	b.ResetTimer()
	for range b.N {
		all := make([]*client.Session, sessions)
		for i := range all {
			all[i] = c.NewSession(sandbox)
		}
		for _, phase := range []struct {
			name string
			call func(*client.Session) error
		}{
			{"open", func(s *client.Session) error { return sessionCall(ctx, s) }},
			{"call", func(s *client.Session) error { return sessionCall(ctx, s) }},
			{"close", func(s *client.Session) error { return s.Close(ctx) }},
		} {
			nats0, workers0 := serversCPU(servers), processesCPU(procs)
			took, lat, errs, first := eachAtOnce(all, phase.call)
			b.ReportMetric(took.Seconds(), phase.name+"-all-s")
			b.ReportMetric(float64(testenv.Quantile(lat, 0.5).Microseconds())/1000, phase.name+"-median-ms")
			b.ReportMetric(float64(testenv.Quantile(lat, 0.99).Microseconds())/1000, phase.name+"-p99-ms")
			perSession := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(sessions) }
			b.ReportMetric(perSession(serversCPU(servers)-nats0), phase.name+"-nats-cpu-ms/session")
			b.ReportMetric(perSession(processesCPU(procs)-workers0), phase.name+"-workers-cpu-ms/session")
			b.ReportMetric(float64(errs), phase.name+"-errors")
			if errs > 0 {
				b.Logf("%s: %d of %d sessions failed, the first with: %v", phase.name, errs, sessions, first)
			}
		}
	}
}

// sessionCall runs a trivial call of s, and fails unless it succeeds.
func sessionCall(ctx context.Context, s *client.Session) error {
	res, err := s.Run(ctx, wire.Job{Script: "pass"})
	if err != nil {
		return err
	}
	if !res.Success {
		return fmt.Errorf("%s: %s", res.ErrorKind, res.Error)
	}
	return nil
}

// eachAtOnce calls call for every session at once, and returns the wall time, the
// latencies of the calls that succeeded (sorted), how many failed and the first
// error.
func eachAtOnce(all []*client.Session, call func(*client.Session) error) (time.Duration, []time.Duration, int, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var errs int
	var first error
	start := time.Now()
	var wg sync.WaitGroup
	for _, s := range all {
		wg.Go(func() {
			t0 := time.Now()
			err := call(s)
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if errs++; first == nil {
					first = err
				}
				return
			}
			lat = append(lat, d)
		})
	}
	wg.Wait()
	slices.Sort(lat)
	return time.Since(start), lat, errs, first
}

// publishAll publishes a trivial job for each ids[i] of the indexes mine,
// asynchronously, and writes when each was published into at[i]; it returns once
// the stream acknowledged them all.
func publishAll(b *testing.B, js jetstream.JetStream, sandbox string, ids []string, mine []int, at []time.Time) (again int) {
	msgs := make(map[int]*nats.Msg, len(mine))
	acks := make(map[int]jetstream.PubAckFuture, len(mine))
	for _, i := range mine {
		id := ids[i]
		data, err := wire.EncodeJob(wire.ContentTypeMsgpack, &wire.Job{ExecutionID: id, Sandbox: sandbox, Script: "pass"})
		if err != nil {
			b.Error(err)
			return again
		}
		msg := nats.NewMsg(wire.ExecSubject(sandbox))
		msg.Data = data
		msg.Header.Set(wire.HeaderMsgID, id)
		msg.Header.Set(wire.HeaderContentType, wire.ContentTypeMsgpack)
		msgs[i] = msg
		at[i] = time.Now()
		// As fast as the acks come: nats.go holds 4,000 unacknowledged at most.
		ack, err := js.PublishMsgAsync(msg)
		for ; errors.Is(err, jetstream.ErrTooManyStalledMsgs); ack, err = js.PublishMsgAsync(msg) {
			at[i] = time.Now()
		}
		if err != nil {
			b.Errorf("publish job %d: %v", i, err)
			return again
		}
		acks[i] = ack
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Error("the backlog's publish acks did not come")
		return again
	}
	// An ack lost (a stream leader elected meanwhile; seen once in ten tenants'
	// backlogs) times out (simJS): the job is published again, as an agent would,
	// under the same Nats-Msg-Id, which the stream deduplicates.
	for i, ack := range acks {
		select {
		case <-ack.Ok():
			continue
		case <-ack.Err():
		}
		again++
		if _, err := js.PublishMsg(context.Background(), msgs[i], jetstream.WithRetryAttempts(5)); err != nil {
			b.Errorf("publish job %d again: %v", i, err)
			return again
		}
	}
	return again
}

// simJS is a JetStream context of nc whose asynchronous publishes time out.
func simJS(b *testing.B, nc *nats.Conn) jetstream.JetStream {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	return js
}

// serversCPU is the CPU time of the cluster's server processes.
func serversCPU(servers []*natsServer) time.Duration {
	var total time.Duration
	for _, s := range servers {
		total += testenv.PIDCPU(s.cmd.Process.Pid)
	}
	return total
}

// processesCPU is the CPU time of procs.
func processesCPU(procs []*process) time.Duration {
	var total time.Duration
	for _, p := range procs {
		total += testenv.PIDCPU(p.cmd.Process.Pid)
	}
	return total
}

// doneWatch receives the script_done events of the tenants' executions, on a core
// subscription of each (a tenant's account receives the fleet's events as they are
// published), and says when each expected execution ended.
type doneWatch struct {
	mu      sync.Mutex
	ends    map[string]ended
	waiting map[string]bool // expected, no script_done yet
	all     chan struct{}   // closed when waiting is empty
}

type ended struct {
	at      time.Time
	success bool
}

func newDoneWatch(b *testing.B, ncs ...*nats.Conn) *doneWatch {
	d := &doneWatch{}
	for _, nc := range ncs {
		sub, err := nc.Subscribe(wire.SubjectPrefixEvents+".*."+wire.EventScriptDone, d.see)
		if err != nil {
			b.Fatal(err)
		}
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = sub.Unsubscribe() })
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	return d
}

func (d *doneWatch) expect(ids []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ends, d.waiting, d.all = map[string]ended{}, map[string]bool{}, make(chan struct{})
	for _, id := range ids {
		d.waiting[id] = true
	}
}

func (d *doneWatch) see(m *nats.Msg) {
	at := time.Now()
	ev, err := wire.DecodeEvent(m.Header.Get(wire.HeaderContentType), m.Data)
	if err != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.waiting[ev.ExecutionID] {
		return
	}
	delete(d.waiting, ev.ExecutionID)
	d.ends[ev.ExecutionID] = ended{at: at, success: ev.Success}
	if len(d.waiting) == 0 {
		close(d.all)
	}
}

// wait waits until every expected execution ended, and returns their ends.
func (d *doneWatch) wait(b *testing.B, within time.Duration) map[string]ended {
	d.mu.Lock()
	all := d.all
	d.mu.Unlock()
	select {
	case <-all:
	case <-time.After(within):
		d.mu.Lock()
		left := len(d.waiting)
		d.mu.Unlock()
		b.Fatalf("%d of the executions had no script_done within %v", left, within)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ends
}
