package worker

import (
	"context"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// producer takes the jobs: for each sandbox, one pull loop per container slot, on
// the sandbox's durable consumer. A loop asks for exactly one job, and only while
// its slot is free; it hands the job to handle and asks for the next once handle
// returns.
type producer struct {
	sandboxes []Sandbox
	consumers map[string]jetstream.Consumer // by sandbox
	gates     *gates
	handle    func(sandbox string, msg jetstream.Msg)
	log       *slog.Logger
	loops     sync.WaitGroup // pull loops and the jobs they run
}

func newProducer(sandboxes []Sandbox, consumers map[string]jetstream.Consumer, g *gates, handle func(string, jetstream.Msg), log *slog.Logger) *producer {
	return &producer{sandboxes: sandboxes, consumers: consumers, gates: g, handle: handle, log: log}
}

// start starts every slot's loop; the loops stop taking jobs when run ends.
func (p *producer) start(_, run context.Context) error {
	for _, sb := range p.sandboxes {
		for range sb.Slots {
			p.loops.Add(1)
			go p.pull(run, sb.Name, p.consumers[sb.Name])
		}
	}
	return nil
}

// stop waits until every loop has ended, the job it ran with it.
func (p *producer) stop(context.Context) { p.loops.Wait() }

// pull is one container slot of a sandbox: it asks for one job, runs it to the end,
// then asks for the next, until ctx ends; a pending sandbox's first once it serves.
func (p *producer) pull(ctx context.Context, sandbox string, cons jetstream.Consumer) {
	defer p.loops.Done()
	if !p.gates.wait(ctx, sandbox) {
		return
	}
	pullEach(ctx, cons, p.log.With("sandbox", sandbox), "a job", func(msg jetstream.Msg) { p.handle(sandbox, msg) })
}
