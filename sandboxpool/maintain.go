package sandboxpool

import (
	"context"
	"time"
)

// maintainInterval is how often the pool replenishes, culls idle overflow and checks
// health. Replenishing also happens at once whenever a container goes.
const maintainInterval = time.Second

// maintain replenishes, culls idle overflow, replaces containers past MaxAge and
// health-checks idle containers.
func (p *Pool) maintain() {
	defer p.wg.Done()
	t := time.NewTicker(maintainInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stopLoop:
			return
		case <-t.C:
		}
		now := time.Now()
		p.mu.Lock()
		for _, sb := range p.sandboxes {
			// Idle containers above PoolSize go after IdleTimeout, oldest first.
			for len(sb.idle) > 0 && sb.total > sb.cfg.PoolSize && now.Sub(sb.idle[0].idleSince) > sb.cfg.IdleTimeout {
				p.retireLocked(sb.idle[0], RetireIdle)
			}
			if now.Sub(sb.lastFail) > backoff {
				p.refillLocked(sb)
				p.ageOutLocked(sb, now)
			}
			for _, c := range append([]*ctr(nil), sb.idle...) {
				if now.Sub(c.lastCheck) >= p.cfg.HealthInterval {
					p.checkLocked(c)
				}
			}
		}
		p.mu.Unlock()
	}
}

// backoff is the pause after a failed spawn before the pool replenishes again.
const backoff = 5 * time.Second

// checkLocked takes an idle container out of the queue and pings it in the background.
func (p *Pool) checkLocked(c *ctr) {
	sb := c.sandbox
	for i, x := range sb.idle {
		if x == c {
			sb.idle = append(sb.idle[:i], sb.idle[i+1:]...)
			break
		}
	}
	c.state = stateChecking
	p.tendLocked(c, c.conn.Ping, RetireUnhealthy, "idle container failed its health check")
}

// tendLocked runs op (a ping or a reset) on a container out of circulation, in the
// background and bounded by ResetTimeout; then offers the container again, or retires
// it for reason if op failed.
func (p *Pool) tendLocked(c *ctr, op func(context.Context) error, reason, failure string) {
	sb, coming := c.sandbox, !c.retiring // it will serve again (see sandbox.coming)
	if coming {
		sb.coming++
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(p.bg, p.cfg.ResetTimeout)
		err := op(ctx)
		cancel()
		p.mu.Lock()
		defer p.mu.Unlock()
		if coming {
			sb.coming--
		}
		if c.state == stateGone {
			p.refillLocked(sb) // retired meanwhile: what waited for it may need a spawn
			return
		}
		c.lastCheck = time.Now()
		if err != nil {
			p.log.Warn(failure, "container", c.shortID(), "sandbox", c.sandbox.cfg.Name, "err", err)
			p.retireLocked(c, reason)
			return
		}
		p.offerLocked(c)
	}()
}
