package sandboxpool

import (
	"context"
	"fmt"
	"time"

	"github.com/moby/moby/client"
)

// ReapOrphans removes containers that carry the jazzmine.managed label but belong to
// a worker that is gone: one that Config.WorkerAlive has reported dead in every check
// for at least Config.ReapGrace. Containers of this pool's own worker id, of live
// workers, and younger than Config.ReapMinAge are never touched. It returns how many
// it removed.
func (p *Pool) ReapOrphans(ctx context.Context) (int, error) {
	if p.cfg.WorkerAlive == nil {
		return 0, nil
	}
	p.reapMu.Lock() // one reaping at a time: deadSince is a run of checks
	defer p.reapMu.Unlock()
	if p.deadSince == nil {
		p.deadSince = map[string]time.Time{}
	}
	now := time.Now()
	dead := map[string]bool{} // found dead in this check
	complete := false
	defer func() {
		// A worker found alive, or none of whose containers is left, starts over; so
		// does every one after a check that could not finish: no doubt reaps.
		for w := range p.deadSince {
			if !complete || !dead[w] {
				delete(p.deadSince, w)
			}
		}
	}()
	list, err := p.cfg.Docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", LabelManaged+"=true")})
	if err != nil {
		return 0, fmt.Errorf("list managed containers: %w", err)
	}
	verdict := map[string]bool{}
	removed := 0
	for _, c := range list.Items {
		worker := c.Labels[LabelWorker]
		if worker == "" || worker == p.cfg.WorkerID || time.Since(time.Unix(c.Created, 0)) < p.cfg.ReapMinAge {
			continue
		}
		alive, known := verdict[worker]
		if !known {
			alive, err = p.cfg.WorkerAlive(ctx, worker)
			if err != nil {
				return removed, fmt.Errorf("ask whether worker %q is alive: %w", worker, err)
			}
			verdict[worker] = alive
			if !alive {
				dead[worker] = true
				if _, ok := p.deadSince[worker]; !ok {
					p.deadSince[worker] = now
				}
			}
		}
		if alive || now.Sub(p.deadSince[worker]) < p.cfg.ReapGrace {
			continue
		}
		if _, err := p.cfg.Docker.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !isNotFound(err) {
			return removed, fmt.Errorf("remove orphaned container %.12s of worker %q: %w", c.ID, worker, err)
		}
		removed++
		p.log.Info("removed an orphaned container", "container", c.ID[:min(12, len(c.ID))], "worker", worker, "sandbox", c.Labels[LabelSandbox])
	}
	complete = true
	return removed, nil
}

// removeByLabel force-removes every container with the label (key=value).
func (p *Pool) removeByLabel(ctx context.Context, label string) (int, error) {
	list, err := p.cfg.Docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", label)})
	if err != nil {
		return 0, fmt.Errorf("list containers labelled %s: %w", label, err)
	}
	n := 0
	for _, c := range list.Items {
		if _, err := p.cfg.Docker.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !isNotFound(err) {
			return n, fmt.Errorf("remove container %.12s: %w", c.ID, err)
		}
		n++
	}
	return n, nil
}

// reapLimit bounds one periodic reaping.
const reapLimit = 30 * time.Second

// reapLoop runs ReapOrphans every ReapInterval until the pool closes.
func (p *Pool) reapLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stopLoop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(p.bg, reapLimit) // Close cancels p.bg
		n, err := p.ReapOrphans(ctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Warn("reap containers of dead workers", "err", err)
		case n > 0:
			p.log.Info("removed containers of dead workers", "count", n)
		}
	}
}
