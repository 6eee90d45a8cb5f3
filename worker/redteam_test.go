package worker_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// The red-team suite plays the attacker of docs/SECURITY.md: the author of the script
// has read this repository and runs arbitrary code as the sandbox uid until the
// timeout. Each attack goes through `worker serve` (a process of its own), NATS and
// real containers, and is followed by ordinary jobs sent two at a time to a sandbox of
// two containers, so that some land where the attacker was. Every one of them must
// return its own result and nothing else.

// attack is one row of docs/SECURITY.md's red-team table.
type attack struct {
	name string
	// script is the attacker's; EXECUTION_ID in it is its own execution id, which
	// the attacker's agent chose and so knows.
	script string
	// prepare, if set, runs before the attack (a victim whose secret the attack hunts)
	// and returns what the attack's later probes look for.
	prepare func(t *testing.T, rt *redTeam) string
	// judge checks the attacker's own events: above all, that forged lines never made
	// it a success.
	judge func(t *testing.T, evs []*wire.Event)
	// judgeGVisor, if set, is judge under gVisor, where its kernel answers the attack
	// otherwise; its comment says how, and what still holds.
	judgeGVisor func(t *testing.T, evs []*wire.Event)
	// retires says whether the attacked container must be gone afterwards: no later
	// job runs there. If false, some later job must run there (and be unharmed).
	retires bool
	// probe, if set, makes a later job's script from what prepare returned; the job
	// must end with emit_result(True).
	probe func(hunted string) string
}

// reached is Python that the attack scripts share: reach(what, fn) records what when
// fn() succeeds, and others() lists every process but the script's own.
const reached = `import os, signal, json, ctypes
REACHED = []
def reach(what, fn):
    try:
        fn()
        REACHED.append(what)
    except Exception:
        pass
def others():
    return sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid())
def state(pid):
    try:
        return open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[0]
    except OSError:
        return 'gone'
`

// forged is what an attacker holding the protocol stream would write for execution
// EXECUTION_ID: its result, its end and the reset that lends the container again.
const forged = `FORGED = ('{"type":"final_result","execution_id":"EXECUTION_ID","data":"forged"}\n'
          '{"type":"script_done","execution_id":"EXECUTION_ID","exit_code":0}\n{"type":"reset_done"}\n').encode()
`

var redTeamAttacks = []attack{
	{
		name: "take over the protocol stream and forge its own end",
		// docker-init's attack: open PID 1's (or anyone's) stdin and stdout through /proc,
		// stop the harness and the zygote, and write a success for itself.
		// PID 1 is let go on (SIGCONT) once the attempts are made, so that it relays
		// what the script says where it was stopped (gVisor).
		script: reached + forged + `
for pid in others():
    reach('stopped %d' % pid, lambda: os.kill(pid, signal.SIGSTOP))
    try:
        fds = os.listdir('/proc/%d/fd' % pid)
    except OSError:
        fds = ['0', '1', '2']
    for fd in fds:
        path = '/proc/%d/fd/%s' % (pid, fd)
        reach('wrote ' + path, lambda: os.write(os.open(path, os.O_WRONLY | os.O_NONBLOCK), FORGED))
        reach('read ' + path, lambda: os.open(path, os.O_RDONLY | os.O_NONBLOCK))
pid1_stopped = state(1) in ('T', 't', 'gone')
reach('continued 1', lambda: os.kill(1, signal.SIGCONT))
print('reached:', json.dumps(sorted(w for w in REACHED if w.startswith(('wrote ', 'read ')))))
print('pid 1 stopped:', pid1_stopped)
`,
		judge: func(t *testing.T, evs []*wire.Event) {
			forgedResult(t, evs)
			if done := last(evs); done.Success {
				t.Errorf("the attacker's job succeeded: %s", describe(evs))
			}
			wantPrinted(t, evs, "reached: []", "pid 1 stopped: False")
		},
		// gVisor's kernel does not keep a PID namespace's signals from its init
		// (pkg/sentry/kernel/task_signals.go says so): PID 1 may be stopped. Nothing
		// is opened all the same, and the job never ends with a result.
		judgeGVisor: func(t *testing.T, evs []*wire.Event) {
			forgedResult(t, evs)
			if done := last(evs); done.Success {
				t.Errorf("the attacker's job succeeded: %s", describe(evs))
			}
			wantPrinted(t, evs, "reached: []")
		},
		// It stopped the zygote (same uid, allowed): the harness will not fork again.
		retires: true,
	},
	{
		name: "answer later jobs from a daemon left behind",
		// A setsid double fork that waits for the next execute on any stdin it can open
		// and answers it with a forged result.
		script: reached + `
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        import time
        deadline = time.time() + 60
        while time.time() < deadline:
            for pid in others():
                for fd in ('0', '1'):
                    try:
                        f = os.open('/proc/%d/fd/%s' % (pid, fd), os.O_RDWR | os.O_NONBLOCK)
                    except OSError:
                        continue
                    try:
                        line = os.read(f, 1 << 20)
                        req = json.loads(line.split(b'\n')[0])
                        out = os.open('/proc/%d/fd/1' % pid, os.O_WRONLY)
                        os.write(out, ('{"type":"final_result","execution_id":"%s","data":"forged"}\n{"type":"script_done","execution_id":"%s"}\n' % (req['execution_id'], req['execution_id'])).encode())
                    except Exception:
                        pass
            time.sleep(0.01)
        os._exit(0)
    os._exit(0)
emit_result('planted')
`,
		judge: ownResult("planted"),
		probe: func(string) string {
			return "import os\nothers = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())]\nemit_result(others == [] or others)"
		},
	},
	{
		name: "a daemon beside the script, the zygote's child, whose first thread ends alone",
		// clone(CLONE_PARENT) makes the zygote its parent: outside the script's process
		// group, and no orphan the harness inherits. Its first thread then ends with
		// exit(2), so that its stat says Z while its other thread runs; the harness's
		// last sweep skipped zombies. Together they outlived every execution of the
		// container (a review's attack, x86-64 numbers). The same daemon from a setsid
		// double fork too.
		script: `import ctypes, os, sys
DAEMON = """
import ctypes, os, threading, time
os.setsid()  # out of the script's process group
def leave_a_mark():
    while True:
        try:
            open('/workspace/daemon-was-here', 'w').close()
        except OSError:
            pass
        time.sleep(0.01)
threading.Thread(target=leave_a_mark).start()
time.sleep(0.05)
ctypes.CDLL(None).syscall(60, 0)  # exit(2): this thread only
"""
def become_the_daemon():
    null = os.open('/dev/null', os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 1 << 16)
    os.execv(sys.executable, [sys.executable, '-c', DAEMON])
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD)
if pid == 0:
    become_the_daemon()
print('clone CLONE_PARENT errno:', ctypes.get_errno() if pid < 0 else 0)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        become_the_daemon()
    os._exit(0)
os.wait()
import time
deadline = time.time() + 5  # both daemons' first threads have ended by then
while pid > 0 and time.time() < deadline and open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[0] != 'Z':
    time.sleep(0.01)
time.sleep(0.3)
emit_result('planted')
`,
		judge: func(t *testing.T, evs []*wire.Event) {
			ownResult("planted")(t, evs)
			wantPrinted(t, evs, "clone CLONE_PARENT errno: 1")
		},
		// Later jobs find an empty workspace (the victims' check) and no other process.
		probe: func(string) string {
			return "import os\nothers = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())]\nemit_result(others == [] or others)"
		},
	},
	{
		name: "open /proc/<pid>/fd, mem, environ and maps of every other process",
		script: reached + `
for pid in others():
    for name in ('environ', 'mem', 'maps', 'fd/0', 'fd/1', 'fd/2', 'fdinfo/0', 'auxv', 'syscall', 'stack'):
        reach('%d/%s' % (pid, name), lambda: open('/proc/%d/%s' % (pid, name), 'rb').read(1))
    for fd in ('0', '1', '2'):
        reach('%d/fd/%s link' % (pid, fd), lambda: os.readlink('/proc/%d/fd/%s' % (pid, fd)))
    reach('%d/fd' % pid, lambda: os.listdir('/proc/%d/fd' % pid))
    reach('%d/fdinfo' % pid, lambda: os.listdir('/proc/%d/fdinfo' % pid))
    reach('%d/root' % pid, lambda: os.listdir('/proc/%d/root/' % pid))
    reach('%d/cwd' % pid, lambda: os.listdir('/proc/%d/cwd/' % pid))
emit_result(REACHED)
`,
		judge: func(t *testing.T, evs []*wire.Event) {
			if done := last(evs); !done.Success || fmt.Sprint(done.FinalData) != "[]" {
				t.Errorf("the script reached other processes' /proc entries: %s", describe(evs))
			}
		},
		// gVisor leaves the fd and fdinfo directories of a process that is not
		// dumpable to its uid (Linux gives them to root): a script lists the numbers
		// of the harness's and the zygote's descriptors and reads their flags and
		// offsets, and still cannot open one or read where it leads.
		judgeGVisor: func(t *testing.T, evs []*wire.Event) {
			done := last(evs)
			reached, _ := done.FinalData.([]any)
			var beyond []any
			for _, r := range reached {
				if s, _ := r.(string); !strings.HasSuffix(s, "/fd") && !strings.HasSuffix(s, "/fdinfo") && !strings.HasSuffix(s, "/fdinfo/0") {
					beyond = append(beyond, r)
				}
			}
			if !done.Success || done.FinalData == nil || len(beyond) > 0 {
				t.Errorf("the script reached other processes' /proc entries beyond their descriptors' numbers: %v: %s", beyond, describe(evs))
			}
		},
	},
	{
		name: "SIGSTOP, then SIGKILL, every other process",
		script: reached + `
states = {}
for pid in others():
    reach('stop %d' % pid, lambda: os.kill(pid, signal.SIGSTOP))
import time
time.sleep(0.1)
for pid in others():
    states[pid] = state(pid)
for pid in others():
    reach('kill %d' % pid, lambda: os.kill(pid, signal.SIGKILL))
time.sleep(0.1)
stopped = lambda st: st in ('T', 't', 'gone')
emit_result({'pid 1 stopped': stopped(states.get(1)), 'pid 1 gone after SIGKILL': state(1) == 'gone'})
`,
		judge: func(t *testing.T, evs []*wire.Event) {
			done := last(evs)
			got, _ := json.Marshal(done.FinalData)
			if !done.Success || string(got) != `{"pid 1 gone after SIGKILL":false,"pid 1 stopped":false}` {
				t.Errorf("the harness (PID 1) was stopped or killed from inside: %s %s", got, describe(evs))
			}
		},
		// gVisor's kernel lets the script kill PID 1 (see the first attack): the
		// container ends, and with it the attacker's own job, nothing else.
		judgeGVisor: func(t *testing.T, evs []*wire.Event) {
			wantKind(t, evs, wire.KindCrashed)
		},
		// It killed the zygote: the harness exits instead of forking another.
		retires: true,
	},
	{
		name: "kill the zygote, then look for an earlier execution's secret in memory",
		prepare: func(t *testing.T, rt *redTeam) string {
			secret := randomToken()
			// The victim, on the container the attack is about to take (the pool lends
			// the most recently used container first).
			evs := rt.run(t, "victim", fmt.Sprintf("secret = %q\nprint(secret)\nemit_result(len(secret))", secret))
			if !last(evs).Success {
				t.Fatalf("the victim failed: %s", describe(evs))
			}
			return secret
		},
		script: `import os
os.kill(os.getppid(), 9)
emit_result('zygote killed')
`,
		judge: func(t *testing.T, evs []*wire.Event) {
			if done := last(evs); !done.Success {
				t.Errorf("the attacker's own job: %s", describe(evs))
			}
		},
		retires: true,
		// Every later execution reads all of its own memory for the secret. It holds
		// the secret's two halves apart, never the secret whole, so any match is a
		// copy from elsewhere.
		probe: func(secret string) string {
			return fmt.Sprintf(`h1, h2 = %q.encode(), %q.encode()
found = 0
for line in open('/proc/self/maps'):
    addr, perms = line.split()[:2]
    if 'r' not in perms or '[vvar' in line or '[vsyscall' in line:
        continue
    lo, hi = (int(x, 16) for x in addr.split('-'))
    try:
        with open('/proc/self/mem', 'rb') as m:
            m.seek(lo)
            data = m.read(hi - lo)
    except (OSError, ValueError, OverflowError):
        continue
    i = data.find(h1)
    while i >= 0:
        found += data[i + len(h1):i + len(h1) + len(h2)] == h2
        i = data.find(h1, i + 1)
emit_result(found == 0 or found)
`, secret[:16], secret[16:])
		},
	},
	{
		name: "ptrace or process_vm_readv every other process",
		script: reached + `
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
for pid in others():
    for req, name in ((16, 'PTRACE_ATTACH'), (0x4206, 'PTRACE_SEIZE')):
        if libc.ptrace(req, pid, 0, 0) == 0:
            REACHED.append('%s %d' % (name, pid))
    remote = iovec(0x400000, 64)
    if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) >= 0:
        REACHED.append('process_vm_readv %d' % pid)
emit_result(REACHED)
`,
		judge: func(t *testing.T, evs []*wire.Event) {
			if done := last(evs); !done.Success || fmt.Sprint(done.FinalData) != "[]" {
				t.Errorf("the script traced or read another process: %s", describe(evs))
			}
		},
	},
	{
		name: "leave files the wipe cannot remove, and code that later Pythons run",
		// A tree deeper than PATH_MAX made searchable only (0o111) at every level, a
		// user-site .pth under $HOME (the workspace) that would run in every later
		// interpreter, the same in /tmp, and the workspace itself made inaccessible.
		script: `import os
def drop(root):
    fd = os.open(root, os.O_RDONLY)
    os.mkdir('drop', dir_fd=fd)
    fd = os.open('drop', os.O_RDONLY, dir_fd=fd)
    chain = []
    for i in range(18):
        name = ('L%02d' % i) * 80
        os.mkdir(name, dir_fd=fd)
        chain.append((fd, name))
        fd = os.open(name, os.O_RDONLY, dir_fd=fd)
    os.write(os.open('loot', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), b'left by the attacker')
    for parent, name in chain:
        os.chmod(name, 0o111, dir_fd=parent)
drop('/workspace')
drop('/tmp')
site = '/workspace/.local/lib/python3.11/site-packages'
os.makedirs(site)
open(site + '/zz.pth', 'w').write("import os; open('/tmp/stolen', 'a').write(os.environ.get('API_TOKEN', '-'))\n")
os.chmod('/workspace/.local/lib/python3.11', 0o111)
os.chmod('/workspace/.local/lib', 0o111)
os.chmod('/workspace', 0)
emit_result('planted')
`,
		judge: ownResult("planted"),
		// Later jobs (which list /workspace and /tmp) find them empty and usable; a
		// Python they start runs nothing of the attacker's.
		probe: func(string) string {
			return "import os, subprocess, sys\nopen('mine', 'w').write('x')\nsubprocess.run([sys.executable, '-c', 'pass'], env={'HOME': '/workspace', 'API_TOKEN': 'secret'}, check=True)\nemit_result(sorted(os.listdir('/workspace')) == ['mine'] and os.listdir('/tmp') == [] or [os.listdir('/workspace'), os.listdir('/tmp')])"
		},
	},
	{
		name: "set extended attributes and a default ACL on the scratch directories",
		// user.* data for a later job to read, and a default ACL that gives every file
		// created there mode 0.
		script: `import os, struct
acl = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', tag, 0, 0xFFFFFFFF) for tag in (0x01, 0x04, 0x20))
for d in ('/workspace', '/tmp'):
    os.setxattr(d, 'user.loot', b'left by the attacker')
    os.setxattr(d, 'system.posix_acl_default', acl)
emit_result('set')
`,
		judge: ownResult("set"),
		probe: func(string) string {
			return "import os, tempfile\nopen('/workspace/mine', 'w').write('x')\nwith tempfile.NamedTemporaryFile() as f:\n    f.write(b'y')\nemit_result(open('/workspace/mine').read() == 'x' and os.listxattr('/workspace') == [] and os.listxattr('/tmp') == [] or [os.listxattr('/workspace'), os.listxattr('/tmp')])"
		},
	},
	{
		name: "lower the zygote's limits and priority for every later job",
		// prlimit, setpriority, sched_setscheduler and sched_setaffinity need only the
		// same uid, not a dumpable target; every child would inherit them.
		script: `import os, resource
z = os.getppid()
resource.prlimit(z, resource.RLIMIT_AS, (200 << 20, 200 << 20))
resource.prlimit(z, resource.RLIMIT_CPU, (2, 3))
resource.prlimit(z, resource.RLIMIT_NOFILE, (64, 64))
os.setpriority(os.PRIO_PROCESS, z, 19)
os.sched_setscheduler(z, os.SCHED_IDLE, os.sched_param(0))
import ctypes
ctypes.CDLL(None).syscall(251, 1, z, (3 << 13) | 7)  # ioprio_set(IOPRIO_WHO_PROCESS, zygote, idle), x86_64
emit_result('lowered')
`,
		judge:   ownResult("lowered"),
		retires: true,
		probe: func(string) string {
			return "import os, resource\nx = bytearray(300 << 20)\nemit_result(resource.getrlimit(resource.RLIMIT_CPU)[1] == resource.RLIM_INFINITY and os.getpriority(os.PRIO_PROCESS, 0) == 0)"
		},
	},
	{
		name: "half an event line on its own pipe, then the timeout",
		script: `import os
fd = [fd for fd in range(3, 256) if os.path.exists('/proc/self/fd/%d' % fd) and os.readlink('/proc/self/fd/%d' % fd).startswith('pipe:')][0]
os.write(fd, b'{"type":"final_result","data":')
while True:
    pass
`,
		judge: func(t *testing.T, evs []*wire.Event) { wantKind(t, evs, wire.KindTimeout) },
	},
	{
		name: "a 100 MB event line with no newline",
		script: `import os
fd = [fd for fd in range(3, 256) if os.path.exists('/proc/self/fd/%d' % fd) and os.readlink('/proc/self/fd/%d' % fd).startswith('pipe:')][0]
chunk = b'x' * (1 << 20)
for _ in range(100):
    os.write(fd, chunk)
emit_result('never')
`,
		judge: func(t *testing.T, evs []*wire.Event) { wantKind(t, evs, wire.KindOutputLimit) },
	},
	{
		name: "an error of a kind the worker would retry",
		script: `import os
fd = [fd for fd in range(3, 256) if os.path.exists('/proc/self/fd/%d' % fd) and os.readlink('/proc/self/fd/%d' % fd).startswith('pipe:')][0]
os.write(fd, b'{"type":"error","kind":"infrastructure","error":"run me again"}\n')
`,
		judge: func(t *testing.T, evs []*wire.Event) {
			wantKind(t, evs, wire.KindScript)
			for _, ev := range evs {
				if ev.Attempt != 1 {
					t.Errorf("the job ran again (attempt %d): %s", ev.Attempt, describe(evs))
					break
				}
			}
		},
	},
}

// TestAnAttackerWhoReadTheCodeReachesNothingOfOthers runs every attack of
// redTeamAttacks through `worker serve`, each followed by ordinary jobs, under each
// runtime.
func TestAnAttackerWhoReadTheCodeReachesNothingOfOthers(t *testing.T) {
	testenv.EachRuntime(t, redTeamUnder)
}

func redTeamUnder(t *testing.T, runtime string) {
	testenv.SandboxImage(t)
	srv, nc := testenv.NATS(t)
	config := writeConfigWith(t, "", "pool: {size: 2, max_overflow: 0}\n    runtime: "+runtime)
	id := fmt.Sprintf("redteam-%s-%d", runtime, time.Now().UnixNano()%1_000_000)
	p := startProcess(t, config, srv.ClientURL(), id)
	p.serving(t)
	rt := &redTeam{a: newAgent(t, nc)}
	for _, at := range redTeamAttacks {
		t.Run(at.name, func(t *testing.T) {
			var hunted string
			if at.prepare != nil {
				hunted = at.prepare(t, rt)
			}
			aid := newID("attacker")
			evs := rt.runID(t, aid, strings.ReplaceAll(at.script, "EXECUTION_ID", aid))
			attacked := started(evs)
			if judge := at.judgeGVisor; judge != nil && runtime == sandboxpool.GVisor {
				judge(t, evs)
			} else {
				at.judge(t, evs)
			}
			// Three rounds of two victims at once; past them, an attack the container
			// must survive gets more rounds (up to ten) until a victim lands there: the
			// pool hands out its most recently used idle container first, and the
			// attacked one, resetting when the first victims came, may sit under the
			// others for a while.
			ranThere := 0
			for round := 0; round < 3 || (!at.retires && ranThere == 0 && round < 10); round++ {
				var wg sync.WaitGroup
				for i := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if rt.victim(t, fmt.Sprintf("%d-%d", round, i), at.probe, hunted) == attacked {
							rt.mu.Lock()
							ranThere++
							rt.mu.Unlock()
						}
					}()
				}
				wg.Wait()
			}
			switch {
			case at.retires && ranThere > 0:
				t.Errorf("%d later jobs ran in the attacked container %s: it should have been retired", ranThere, attacked)
			case !at.retires && ranThere == 0:
				t.Errorf("no later job ran in the attacked container %s: the test proves nothing about it", attacked)
			}
		})
	}
}

type redTeam struct {
	a  *agent
	mu sync.Mutex
}

// Timeouts of the attacks, short: some end at theirs; and of the victims and probes,
// which must end well, and are given the time a busy host takes (a probe that
// allocates 300 MB took more than 3 s with both runtimes' suites running).
const (
	attackTimeout = 3
	victimTimeout = 30
)

func (rt *redTeam) run(t *testing.T, prefix, script string) []*wire.Event {
	return rt.runFor(t, newID(prefix), script, victimTimeout)
}

func (rt *redTeam) runID(t *testing.T, id, script string) []*wire.Event {
	return rt.runFor(t, id, script, attackTimeout)
}

func (rt *redTeam) runFor(t *testing.T, id, script string, timeoutSec float64) []*wire.Event {
	t.Helper()
	rt.a.submit(wire.ContentTypeJSON, wire.Job{ExecutionID: id, Sandbox: "default", Script: script, TimeoutSec: timeoutSec})
	return rt.a.events(id, 2*time.Minute)
}

// victim runs an ordinary job that returns a token of its own and what it finds in the
// workspace, then probe if there is one; it fails the test if the job saw anything
// but itself. It returns the container the job ran in.
func (rt *redTeam) victim(t *testing.T, name string, probe func(string) string, hunted string) string {
	token := randomToken()
	evs := rt.run(t, "victim", fmt.Sprintf("import os\nemit_result([%q, os.listdir('/workspace'), os.listdir('/tmp')])", token))
	want := fmt.Sprintf(`[%q,[],[]]`, token)
	if got, _ := json.Marshal(last(evs).FinalData); !last(evs).Success || string(got) != want {
		t.Errorf("victim %s: result %s, want %s: %s", name, got, want, describe(evs))
	}
	for _, ev := range evs {
		switch ev.Type {
		case wire.EventStarted, wire.EventFinalResult, wire.EventScriptDone:
		default:
			t.Errorf("victim %s: an event it did not cause: %s", name, describe(evs))
		}
	}
	if probe != nil {
		pevs := rt.run(t, "probe", probe(hunted))
		if done := last(pevs); !done.Success || done.FinalData != true {
			t.Errorf("probe after victim %s: %s", name, describe(pevs))
		}
	}
	return started(evs)
}

// ownResult judges an attack whose own job must succeed with result want: what the
// attacker may do to itself.
func ownResult(want string) func(*testing.T, []*wire.Event) {
	return func(t *testing.T, evs []*wire.Event) {
		t.Helper()
		if done := last(evs); !done.Success || done.FinalData != want {
			t.Errorf("the attacker's own job: %s", describe(evs))
		}
	}
}

func started(evs []*wire.Event) string {
	if ev := find(evs, wire.EventStarted); ev != nil {
		return ev.ContainerID
	}
	return ""
}

func forgedResult(t *testing.T, evs []*wire.Event) {
	t.Helper()
	for _, ev := range evs {
		if ev.Type == wire.EventFinalResult || ev.Type == wire.EventScriptDone && ev.FinalData != nil {
			t.Errorf("a result reached the attacker's job: %s", describe(evs))
		}
	}
}

func wantPrinted(t *testing.T, evs []*wire.Event, lines ...string) {
	t.Helper()
	var out strings.Builder
	for _, ev := range evs {
		if ev.Type == wire.EventStdout {
			out.WriteString(ev.Text)
		}
	}
	for _, l := range lines {
		if !strings.Contains(out.String(), l+"\n") {
			t.Errorf("the attacker printed %q, want a line %q", out.String(), l)
		}
	}
}

func wantKind(t *testing.T, evs []*wire.Event, kind string) {
	t.Helper()
	if e := find(evs, wire.EventError); last(evs).Success || e == nil || e.Kind != kind {
		t.Errorf("want a %s error: %s", kind, describe(evs))
	}
	if n := count(evs, wire.EventScriptDone); n != 1 {
		t.Errorf("%d script_done events", n)
	}
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
