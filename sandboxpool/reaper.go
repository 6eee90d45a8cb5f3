package sandboxpool

import (
	"context"
	"fmt"
	"time"

	"github.com/moby/moby/client"
)

// ReapOrphans removes containers that carry the jazzmine.managed label but belong to
// a worker that is gone: one that Config.WorkerAlive reports dead. Containers of this
// pool's own worker id, of live workers, and younger than Config.ReapMinAge are never
// touched. It returns how many it
// removed.
func (p *Pool) ReapOrphans(ctx context.Context) (int, error) {
	if p.cfg.WorkerAlive == nil {
		return 0, nil
	}
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
		}
		if alive {
			continue
		}
		if _, err := p.cfg.Docker.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !isNotFound(err) {
			return removed, fmt.Errorf("remove orphaned container %.12s of worker %q: %w", c.ID, worker, err)
		}
		removed++
		p.log.Info("removed an orphaned container", "container", c.ID[:min(12, len(c.ID))], "worker", worker, "sandbox", c.Labels[LabelSandbox])
	}
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
