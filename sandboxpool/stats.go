package sandboxpool

import "time"

// Stats is a snapshot of the pool's gauges and counters.
type Stats struct {
	// Sandboxes holds each sandbox's numbers by name.
	Sandboxes map[string]SandboxStats
}

// SandboxStats are one sandbox's gauges (now) and counters (since New).
type SandboxStats struct {
	// Idle containers wait in the queue; InUse are checked out; Starting are being
	// spawned; Busy are being reset or health-checked. Total counts them all, with a
	// container on its last use whose replacement is already starting (so Total may
	// pass Capacity by the containers being recycled).
	Idle, InUse, Starting, Busy, Total int
	// Capacity is PoolSize+MaxOverflow; PoolSize is the warm target.
	Capacity, PoolSize int
	// Waiting callers are blocked in Checkout.
	Waiting int

	// Checkouts counts leases handed out; CheckoutWaits those that had to wait, for
	// CheckoutWaitTotal in all.
	Checkouts, CheckoutWaits uint64
	CheckoutWaitTotal        time.Duration
	// Spawned counts containers that became ready; SpawnFailures those that did not.
	Spawned, SpawnFailures uint64
	// Retired counts removed containers by reason (max_uses, crashed, oom, ...).
	Retired map[string]uint64
}

// Stats returns a snapshot of the pool's numbers.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := Stats{Sandboxes: make(map[string]SandboxStats, len(p.sandboxes))}
	for name, sb := range p.sandboxes {
		s := sb.stats
		s.Retired = make(map[string]uint64, len(sb.stats.Retired))
		for k, v := range sb.stats.Retired {
			s.Retired[k] = v
		}
		s.Idle = len(sb.idle)
		s.InUse = sb.inUse
		s.Starting = sb.starting
		s.Total = sb.total + sb.retiring
		s.Busy = s.Total - s.Idle - s.InUse - s.Starting
		s.Capacity = sb.cfg.capacity()
		s.PoolSize = sb.cfg.PoolSize
		s.Waiting = sb.waiters.Len()
		out.Sandboxes[name] = s
	}
	return out
}
