package sandboxpool

import (
	"reflect"

	"github.com/jazzmine/worker/harness"
)

// Ready returns what the harness of the sandbox's newest container announced it
// loaded (its ready event: harness version, Python, the tools with their signatures
// and docstrings, the tool files that failed), and false until a container of the
// sandbox has become ready, or for a sandbox the pool does not have. A harness says
// it before it runs any script, so nothing a script does can change it.
func (p *Pool) Ready(sandbox string) (harness.Ready, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sb := p.sandboxes[sandbox]
	if sb == nil || sb.ready == nil {
		return harness.Ready{}, false
	}
	return *sb.ready, true
}

// ReadyChanged returns a channel that is closed at the next change of what [Pool.Ready]
// returns for any sandbox: its first container became ready, or a new one loaded
// something else than the one before (its process id aside). Call it again for the
// change after that.
func (p *Pool) ReadyChanged() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readyChanged
}

// setReadyLocked records the ready event of a container of sb that has just become
// ready, and wakes the callers of ReadyChanged when it says something new.
func (p *Pool) setReadyLocked(sb *sandbox, r harness.Ready) {
	changed := sb.ready == nil
	if !changed {
		before, now := *sb.ready, r
		before.PID, now.PID = 0, 0
		changed = !reflect.DeepEqual(before, now)
	}
	sb.ready = &r
	if changed {
		close(p.readyChanged)
		p.readyChanged = make(chan struct{})
	}
}
