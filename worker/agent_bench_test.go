package worker_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jazzmine/worker/client"
	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
)

// BenchmarkOneAgent is one agent's trivial job, 5 ms between calls, with the default
// settings (pool of 2, default recycling), three ways in each round, so that all
// three see the same moments of a noisy machine (the two jobs' order alternates):
//
//	floor       one line through a container's attach stream and back (cat at the
//	            other end): the physical floor under every execution (a)
//	floor-nats  the least a durable job needs from NATS, nats.go alone, no container
//	            (testenv.NATSFloor) (b)
//	floor-pipe  one line to a forked Python child over a pipe and back (c)
//	client      the job through the Go client (client.Run)
//	plain-nats  the job as an agent without our client does it: nats.go alone, a
//	            JSON job published to JetStream, a subscription to its events until
//	            script_done
//
// The plain agent's events also time the hops of each job, from the times the worker
// writes in them (one clock: the same machine): publish to started (JetStream, the
// pull, the worker's decode and checkout), started to script_done (the container:
// the attach stream, the harness, the fork's child), script_done to the agent.
func BenchmarkOneAgent(b *testing.B) {
	srv, nc := testenv.NATS(b)
	startWorkerWith(b, nc, 2, 0, 0, nil)
	floor := testenv.NewFloor(b, testenv.SandboxImage(b).Tag)
	natsFloor, pipeFloor := testenv.NewNATSFloor(b, srv.ClientURL()), testenv.NewPipeFloor(b)
	c := newClient(b, nc)
	agentConn, err := nats.Connect(srv.ClientURL(), nats.Name("plain agent"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(agentConn.Close)
	agent := newPlainAgent(b, agentConn)
	ctx := context.Background()
	run(b, ctx, c, 3) // warm up
	for range 3 {
		agent.run(b)
	}
	var floors, natsFloors, pipeFloors, clients, plains []time.Duration
	var hops [3][]time.Duration
	b.ResetTimer()
	viaClient := func() {
		time.Sleep(callGap)
		b.StartTimer()
		t0 := time.Now()
		run(b, ctx, c, 1)
		clients = append(clients, time.Since(t0))
		b.StopTimer()
	}
	viaNATS := func() {
		time.Sleep(callGap)
		lat, hop := agent.run(b)
		plains = append(plains, lat)
		for i := range hops {
			hops[i] = append(hops[i], hop[i])
		}
	}
	for i := range b.N {
		b.StopTimer()
		time.Sleep(callGap)
		floors = append(floors, floor.RoundTrip(b))
		natsFloors = append(natsFloors, natsFloor.RoundTrip(b))
		pipeFloors = append(pipeFloors, pipeFloor.RoundTrip(b))
		// In turn first after the floor: a container idle longer answers slower.
		if i%2 == 0 {
			viaClient()
			viaNATS()
		} else {
			viaNATS()
			viaClient()
		}
	}
	testenv.ReportLatencyValues(b, "", clients, map[string]float64{"max_uses": sandboxpool.DefaultMaxUses})
	testenv.Record(b, "floor", floors, nil)
	hopMedians := map[string]float64{}
	for i, name := range []string{"hop_to_started_ms", "hop_in_container_ms", "hop_back_ms"} {
		hopMedians[name] = float64(median(hops[i]).Microseconds()) / 1000
	}
	testenv.Record(b, "plain-nats", plains, hopMedians)
	testenv.Record(b, "floor-nats", natsFloors, nil)
	testenv.Record(b, "floor-pipe", pipeFloors, nil)
	// The floors' sum, (a)+(b)+(c), and each job's median and p99 as its multiple.
	sum := median(floors) + median(natsFloors) + median(pipeFloors)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(median(floors)), "floor-median-ms")
	b.ReportMetric(ms(median(natsFloors)), "floor-nats-median-ms")
	b.ReportMetric(ms(median(pipeFloors)), "floor-pipe-median-ms")
	b.ReportMetric(ms(median(plains)), "plain-median-ms")
	b.ReportMetric(float64(median(plains))/float64(sum), "plain-median/floors")
	b.ReportMetric(float64(p99(plains))/float64(sum), "plain-p99/floors")
	b.ReportMetric(float64(median(clients))/float64(sum), "client-median/floors")
	b.ReportMetric(float64(p99(clients))/float64(sum), "client-p99/floors")
}

func p99(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return testenv.Quantile(s, 0.99)
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return testenv.Quantile(s, 0.5)
}

// plainAgent submits jobs with nats.go alone, as the README's contract says: JSON,
// Nats-Msg-Id the execution id, events on jazzmine.events.<id>.<type>. It knows
// nothing of the jazzmine client.
type plainAgent struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func newPlainAgent(tb testing.TB, nc *nats.Conn) *plainAgent {
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return &plainAgent{nc: nc, js: js}
}

// run submits the trivial job and waits for its script_done; it returns the time
// from publish to script_done, and the three hops (see BenchmarkOneAgent).
func (a *plainAgent) run(tb testing.TB) (time.Duration, [3]time.Duration) {
	id := client.NewExecutionID()
	events := make(chan *nats.Msg, 16)
	sub, err := a.nc.ChanSubscribe("jazzmine.events."+id+".>", events)
	if err != nil {
		tb.Fatal(err)
	}
	defer sub.Unsubscribe()
	body, _ := json.Marshal(map[string]any{"execution_id": id, "sandbox": "default", "script": trivial})
	job := &nats.Msg{Subject: "jazzmine.exec.default", Data: body,
		Header: nats.Header{"Nats-Msg-Id": {id}, "Content-Type": {"application/json"}}}
	t0 := time.Now()
	if _, err := a.js.PublishMsg(context.Background(), job); err != nil {
		tb.Fatal(err)
	}
	var started time.Time
	timeout := time.After(30 * time.Second)
	for {
		var m *nats.Msg
		select {
		case m = <-events:
		case <-timeout:
			tb.Fatalf("plain agent: no script_done for %s in 30 s", id)
		}
		var ev struct {
			Time    time.Time `json:"time"`
			Success bool      `json:"success"`
			Error   string    `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			tb.Fatalf("plain agent: event %s: %v", m.Subject, err)
		}
		switch {
		case strings.HasSuffix(m.Subject, ".started"):
			started = ev.Time
		case strings.HasSuffix(m.Subject, ".script_done"):
			end := time.Now()
			if !ev.Success {
				tb.Fatalf("plain agent: job %s failed: %s", id, ev.Error)
			}
			return end.Sub(t0), [3]time.Duration{started.Sub(t0), ev.Time.Sub(started), end.Sub(ev.Time)}
		}
	}
}
