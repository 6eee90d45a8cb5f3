package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// producer takes the jobs: for each sandbox, one pull loop per container slot, on
// the sandbox's durable consumer. A loop asks for exactly one job, and only while
// its slot is free; it hands the job to handle and asks for the next once handle
// returns.
type producer struct {
	sandboxes []Sandbox
	consumers map[string]jetstream.Consumer // by sandbox, set by ensureStreams
	gates     *gates
	handle    func(sandbox string, msg jetstream.Msg)
	log       *slog.Logger
	loops     sync.WaitGroup // pull loops and the jobs they run
}

func newProducer(sandboxes []Sandbox, g *gates, handle func(string, jetstream.Msg), log *slog.Logger) *producer {
	return &producer{sandboxes: sandboxes, consumers: map[string]jetstream.Consumer{}, gates: g, handle: handle, log: log}
}

// start starts every slot's loop; the loops stop taking jobs when ctx ends.
func (p *producer) start(ctx context.Context) {
	for _, sb := range p.sandboxes {
		for range sb.Slots {
			p.loops.Add(1)
			go p.pull(ctx, sb.Name, p.consumers[sb.Name])
		}
	}
}

// done returns a channel closed once every loop has ended, the job it ran with it.
func (p *producer) done() <-chan struct{} {
	finished := make(chan struct{})
	go func() { p.loops.Wait(); close(finished) }()
	return finished
}

// pull is one container slot of a sandbox: it asks for one job, runs it to the end,
// then asks for the next, until ctx ends; a pending sandbox's first once it serves.
func (p *producer) pull(ctx context.Context, sandbox string, cons jetstream.Consumer) {
	defer p.loops.Done()
	if !p.gates.wait(ctx, sandbox) {
		return
	}
	pullEach(ctx, cons, p.log.With("sandbox", sandbox), "a job", func(msg jetstream.Msg) { p.handle(sandbox, msg) })
}

// pullEach fetches one message of cons at a time and hands it to handle, which runs
// it to its end before the next is asked for, until ctx ends. A failed fetch is
// logged (what names the message) and tried again a second later.
func pullEach(ctx context.Context, cons jetstream.Consumer, log *slog.Logger, what string, handle func(jetstream.Msg)) {
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchContext(ctx))
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("fetch "+what, "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		for msg := range batch.Messages() {
			handle(msg)
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			log.Debug("fetch ended", "err", err)
		}
	}
}
