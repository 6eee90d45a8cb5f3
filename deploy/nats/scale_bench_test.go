package nats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/fakeengine"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
	"github.com/jazzmine/worker/worker"
)

// BenchmarkScale is the control plane at scale, by simulation: workers whose pools run
// on an engine in memory (internal/fakeengine, a harness that answers in
// microseconds), so that the jobs cost what NATS and the workers spend on them and no
// container, against the three-node cluster of deploy/nats (separate nats-server
// processes, with auth.conf: the jobs are a tenant's). A backlog of trivial jobs is
// published at once and drained: jobs/s, each job's time from publish to its
// script_done (mostly its wait in the queue), and CPU per job of the NATS servers and
// of this process (the workers and the agent), as the workers grow and as the backlog
// grows; and how long a cancel of the last job queued takes at that depth. Run it with
// -benchtime 1x (each iteration drains one backlog).
//
//	go test -run '^$' -bench 'Scale' -benchtime 1x -timeout 60m ./deploy/nats/
func BenchmarkScale(b *testing.B) {
	servers, keys := startCluster(b, 3)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.url)
	}
	url := strings.Join(urls, ",")
	for _, c := range []struct{ workers, backlog int }{
		{1, 10_000}, {2, 10_000}, {4, 10_000}, {8, 10_000}, {16, 10_000},
		{4, 1_000}, {4, 100_000},
	} {
		b.Run(fmt.Sprintf("workers=%d/backlog=%d", c.workers, c.backlog), func(b *testing.B) {
			simulate(b, url, keys, servers, c.workers, c.backlog)
		})
	}
}

// simSlots is each simulated worker's container slots.
const simSlots = 4

func simulate(b *testing.B, url string, keys clusterKeys, servers []*natsServer, workers, backlog int) {
	sandbox := fmt.Sprintf("sim%dx%d", workers, backlog)
	startSimWorkers(b, url, keys, sandbox, workers)
	anc := testenv.ConnectSeed(b, url, keys.agent, nil)
	js, err := jetstream.New(anc)
	if err != nil {
		b.Fatal(err)
	}
	done := newDoneWatch(b, anc)
	var lat []time.Duration
	var cancelTook []time.Duration
	var failed, ranFirst int
	var elapsed time.Duration
	natsCPU, selfCPU := time.Duration(0), time.Duration(0)
	b.ResetTimer()
	for range b.N {
		ids := make([]string, backlog)
		for i := range ids {
			ids[i] = client.NewExecutionID()
		}
		done.expect(ids)
		nats0, self0 := serversCPU(servers), testenv.SelfCPU()
		start := time.Now()
		published := publishAll(b, js, sandbox, ids)
		// A cancel at depth: the last job queued, while the rest drain.
		c0 := time.Now()
		if err := anc.Publish(wire.CancelSubject(ids[len(ids)-1]), nil); err != nil {
			b.Fatal(err)
		}
		ends := done.wait(b, 10*time.Minute)
		elapsed += time.Since(start)
		natsCPU += serversCPU(servers) - nats0
		selfCPU += testenv.SelfCPU() - self0
		for i, id := range ids {
			end := ends[id]
			if i == len(ids)-1 {
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
	b.ReportMetric(perJob(selfCPU), "workers+agent-cpu-ms/job")
	b.ReportMetric(float64(testenv.Quantile(lat, 0.5).Microseconds())/1000, "wait-median-ms")
	b.ReportMetric(float64(testenv.Quantile(lat, 0.99).Microseconds())/1000, "wait-p99-ms")
	b.ReportMetric(float64(slices.Max(cancelTook).Microseconds())/1000, "cancel-at-depth-ms")
	b.ReportMetric(float64(ranFirst), "cancel-too-late")
}

// startSimWorkers runs n workers of sandbox on url, each with simSlots containers of
// the engine in memory, until the end of the benchmark.
func startSimWorkers(b *testing.B, url string, keys clusterKeys, sandbox string, n int) {
	log := slog.New(slog.DiscardHandler)
	for i := range n {
		id := fmt.Sprintf("sim-%s-%d-%d", sandbox, i, time.Now().UnixNano())
		nc := testenv.ConnectSeed(b, url, keys.worker, nil)
		pool, err := sandboxpool.New(sandboxpool.Config{Docker: &fakeengine.Engine{}, WorkerID: id, Logger: log,
			Sandboxes: []sandboxpool.Sandbox{{Name: sandbox, Image: "fake", PoolSize: simSlots}}})
		if err != nil {
			b.Fatal(err)
		}
		w, err := worker.New(worker.Config{NATS: nc, Pool: pool, WorkerID: id, Replicas: 3, Logger: log,
			MaxBacklog: 1_000_000, TenantBacklog: -1,
			Sandboxes: []worker.Sandbox{{Name: sandbox, Slots: simSlots, MaxAckPending: n * simSlots}}})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if err := pool.Start(ctx); err != nil {
			b.Fatal(err)
		}
		// Each try bounded, as `worker serve` does: a cluster electing its leaders
		// leaves some requests unanswered.
		for {
			tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
			err := w.Start(tctx)
			tcancel()
			if err == nil {
				break
			}
			if !worker.Transient(err) || ctx.Err() != nil {
				b.Fatalf("start worker %s: %v", id, err)
			}
			time.Sleep(time.Second)
		}
		cancel()
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = w.Shutdown(ctx, 10*time.Second)
			_ = pool.Close(ctx)
		})
	}
}

// publishAll publishes a trivial job for each id, asynchronously, and returns when
// each was published (in order).
func publishAll(b *testing.B, js jetstream.JetStream, sandbox string, ids []string) []time.Time {
	at := make([]time.Time, len(ids))
	for i, id := range ids {
		data, err := wire.EncodeJob(wire.ContentTypeMsgpack, &wire.Job{ExecutionID: id, Sandbox: sandbox, Script: "pass"})
		if err != nil {
			b.Fatal(err)
		}
		msg := nats.NewMsg(wire.ExecSubject(sandbox))
		msg.Data = data
		msg.Header.Set(wire.HeaderMsgID, id)
		msg.Header.Set(wire.HeaderContentType, wire.ContentTypeMsgpack)
		at[i] = time.Now()
		// As fast as the acks come: nats.go holds 4,000 unacknowledged at most.
		for _, err := js.PublishMsgAsync(msg); err != nil; _, err = js.PublishMsgAsync(msg) {
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				b.Fatalf("publish job %d: %v", i, err)
			}
			at[i] = time.Now()
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("the backlog's publish acks did not come")
	}
	return at
}

// serversCPU is the CPU time of the cluster's server processes.
func serversCPU(servers []*natsServer) time.Duration {
	var total time.Duration
	for _, s := range servers {
		total += testenv.PIDCPU(s.cmd.Process.Pid)
	}
	return total
}

// doneWatch receives the script_done events of the tenant's executions, on a core
// subscription (the tenant's account receives the fleet's events as they are
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

func newDoneWatch(b *testing.B, nc *nats.Conn) *doneWatch {
	d := &doneWatch{}
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
