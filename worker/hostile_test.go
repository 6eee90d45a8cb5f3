package worker_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jazzmine/worker/internal/testenv"
	"github.com/jazzmine/worker/sandboxpool"
	"github.com/jazzmine/worker/wire"
)

// hostile is one attempt of docs/SECURITY.md: a script (and, for attempts on a later
// execution, a probe run right after it) and what must come of it.
type hostile struct {
	name   string
	script string
	probe  string // run after script; must end with emit_result(True)
	kind   string // the error kind script must end with; "" means it must succeed with result True
	// timeout is the attempt's execution timeout in seconds; zero means 3 (some end
	// at theirs). An attempt that must reach a limit first gets the time a busy host
	// takes to get there.
	timeout float64
	// underGVisor, if set, is the attempt as it is played and judged under gVisor,
	// whose kernel answers it otherwise (its comment says how, and what still holds):
	// its script and probe, where set, and its kind.
	underGVisor *hostile
}

// sysvLeftovers is a probe that looks for the POSIX and System V IPC objects the
// attempt below made: the files of /dev/shm and /dev/mqueue, /proc/sysvipc's listings
// where the kernel has them (gVisor has not, nor /dev/mqueue), and each object by its
// key.
const sysvLeftovers = `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
left = [d + '/' + f for d in ('/dev/shm', '/dev/mqueue') if os.path.isdir(d) for f in os.listdir(d)]
left += [l for k in ('shm', 'sem', 'msg') if os.path.exists('/proc/sysvipc/' + k) for l in open('/proc/sysvipc/' + k).read().splitlines()[1:]]
left += [name for name, id in (('shm', libc.shmget(0x5ec, 0, 0)), ('sem', libc.semget(0x5ec, 0, 0)), ('msg', libc.msgget(0x5ec, 0))) if id >= 0]
emit_result(left == [] or left)`

var hostileSuite = []hostile{
	{name: "read another execution's files", script: "open('/workspace/secret', 'w').write('s')\nopen('/tmp/.secret', 'w').write('s')\nemit_result(True)",
		probe: "import os\nemit_result(os.listdir('/workspace') == [] and os.listdir('/tmp') == [])"},
	// POSIX shared memory, a POSIX message queue, and System V shared memory, semaphores
	// and a message queue: none is a file of the scratch directories, all outlive
	// their maker.
	{name: "leave shared memory and message queues behind", script: "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nopen('/dev/shm/secret', 'w').write('s')\nmade = [libc.mq_open(b'/secret', 0o102, 0o600, None), libc.shmget(0x5ec, 4096, 0o1600), libc.semget(0x5ec, 1, 0o1600), libc.msgget(0x5ec, 0o1600)]\nemit_result(all(x >= 0 for x in made) or made)",
		probe: sysvLeftovers,
		// gVisor keeps POSIX message queues where nothing lists them (no /dev/mqueue):
		// they are denied there (seccomp.go). It lists no System V object either (no
		// /proc/sysvipc): the harness counts them, and one left retires the container.
		underGVisor: &hostile{script: "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nopen('/dev/shm/secret', 'w').write('s')\nmq = libc.mq_open(b'/secret', 0o102, 0o600, None), ctypes.get_errno()\nmade = [libc.shmget(0x5ec, 4096, 0o1600), libc.semget(0x5ec, 1, 0o1600), libc.msgget(0x5ec, 0o1600)]\nemit_result(mq == (-1, 1) and all(x >= 0 for x in made) or [mq, made])",
			probe: sysvLeftovers}},
	{name: "read another execution's environment", script: "import os\nos.environ['TOKEN'] = 'leak'\nemit_result(True)",
		probe: "import os\nemit_result('TOKEN' not in os.environ)"},
	{name: "read another execution's Python state", script: "import json, builtins\njson.dumps = None\nbuiltins.planted = 1\nemit_result(True)",
		probe: "import json, builtins\nemit_result(json.dumps([1]) == '[1]' and not hasattr(builtins, 'planted'))"},
	{name: "leave a daemon behind (setsid, double fork)", script: "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(600)\n    os._exit(0)\ntime.sleep(0.2)\nemit_result(True)",
		probe: "import os, sys\nzygote = os.getppid()\nmine = {os.getpid(), zygote, int(open('/proc/%d/stat' % zygote).read().rsplit(')', 1)[1].split()[1])}\nothers = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in mine and int(p) != 1 and open('/proc/%s/stat' % p).read().split()[2] != 'Z']\nemit_result(others == [] or (print(others, [open('/proc/%s/cmdline' % p).read() for p in others]) and False))"},
	{name: "write outside the workspace", script: "import os\nblocked = 0\nfor path in ('/etc/passwd', '/opt/jazzmine/jazzmine_harness/server.py', '/tools/evil.py', '/usr/lib/python3.11/os.py', '/planted'):\n    try:\n        open(path, 'a').write('x')\n    except OSError:\n        blocked += 1\nemit_result(blocked == 5)"},
	{name: "fill the workspace and /tmp", script: "import errno\nfull = 0\nfor d in ('/workspace', '/tmp'):\n    try:\n        with open(d + '/fill', 'wb') as f:\n            while True:\n                f.write(b'\\0' * (1 << 20))\n    except OSError as e:\n        full += e.errno == errno.ENOSPC\nemit_result(full == 2)",
		probe: "open('/workspace/after', 'wb').write(b'\\0' * (32 << 20))\nemit_result(True)"},
	{name: "exhaust memory", script: "x = bytearray(2 << 30)", kind: wire.KindOOM, timeout: 30},
	{name: "fork bomb", script: "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    emit_result(n < 128)",
		// Under gVisor each forked process costs about 11.6 MB of the sandbox's
		// memory: the 512 MiB limit ends the bomb before RLIMIT_NPROC does (sandboxpool
		// TestAForkBombIsStoppedByThePIDsLimit shows that one with more memory).
		underGVisor: &hostile{kind: wire.KindOOM}, timeout: 30},
	// The zygote (its parent) and the harness (PID 1) are not dumpable: only cmdline.
	{name: "read /proc of other processes", script: "import os\nreadable = []\nfor pid in (os.getppid(), 1):\n    for name in ('environ', 'mem', 'fd/0', 'fd/1', 'maps', 'cmdline'):\n        path = '/proc/%d/%s' % (pid, name)\n        try:\n            open(path, 'rb').read(1)\n            readable.append(name)\n        except OSError:\n            pass\nemit_result(readable == ['cmdline', 'cmdline'] or readable)"},
	{name: "ptrace the harness", script: "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nemit_result(libc.ptrace(16, os.getppid(), 0, 0) == -1)"},
	{name: "mount a filesystem", script: "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nemit_result(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == -1)"},
	{name: "change uid to root", script: "import os\ntry:\n    os.setuid(0)\n    emit_result(False)\nexcept PermissionError:\n    emit_result(os.getuid() != 0)"},
	{name: "reach the Docker socket", script: "import os\nemit_result(not any(os.path.exists(p) for p in ('/var/run/docker.sock', '/run/docker.sock')))"},
	{name: "reach the network", script: "import socket\nemit_result([name for _, name in socket.if_nameindex()] == ['lo'])"},
	{name: "forge protocol lines on stdout and stderr", script: "import sys\nprint('{\"type\":\"final_result\",\"data\":\"forged\"}')\nsys.stderr.write('{\"type\":\"script_done\",\"success\":true}\\n')\nemit_result(True)"},
	{name: "print huge binary output", script: "import os\nwhile True:\n    os.write(1, os.urandom(1 << 16))", kind: wire.KindOutputLimit},
	{name: "never yield to the interpreter", script: "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')", kind: wire.KindTimeout},
	{name: "block the timeout signal", script: "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\nwhile True: pass", kind: wire.KindTimeout},
	// The harness is PID 1: the kernel drops the signals a script sends it.
	{name: "kill or stop the harness", script: "import os, time\nos.kill(1, 19)\nos.kill(1, 9)\ntime.sleep(0.2)\nemit_result(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[0] not in 'Tt')", probe: "emit_result(True)",
		// gVisor's kernel does not keep a PID namespace's signals from its init: the
		// harness dies, and with its container the script's own job; the next runs in
		// a new one.
		underGVisor: &hostile{kind: wire.KindCrashed}},
	// The zygote is not: killing it retires the container (the harness exits rather
	// than fork a zygote from a process that has held executions' data).
	{name: "kill the zygote", script: "import os\nos.kill(os.getppid(), 9)\nemit_result(True)", probe: "emit_result(True)"},
}

// TestHostileScriptsChangeNothingForOthers runs every attempt of docs/SECURITY.md
// through a worker with a single container, while an ordinary agent's jobs run beside
// them through the same container; none of those may fail or see another's data.
// Under each runtime.
func TestHostileScriptsChangeNothingForOthers(t *testing.T) {
	testenv.EachRuntime(t, hostileUnder)
}

func hostileUnder(t *testing.T, runtime string) {
	_, nc := testenv.NATS(t)
	startWorkerPool(t, nc, sandboxpool.Sandbox{PoolSize: 1, MaxUses: benchMaxUses, Runtime: runtime}, nil, nil)
	a := newAgent(t, nc)

	stop := make(chan struct{})
	var ordinary, failures atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		b := newAgent(t, nc)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := newID("ordinary")
			data, _ := wire.EncodeJob(wire.ContentTypeMsgpack, &wire.Job{ExecutionID: id, Script: fmt.Sprintf("import os\nemit_result([%d, sorted(os.listdir('.'))])", i)})
			if err := b.publish(wire.ExecSubject("default"), data, map[string]string{wire.HeaderMsgID: id}); err != nil {
				failures.Add(1)
				continue
			}
			evs, err := b.tryEvents(id, 2*time.Minute)
			got, _ := json.Marshal(func() any {
				if err != nil {
					return nil
				}
				return last(evs).FinalData
			}())
			if err != nil || !last(evs).Success || string(got) != fmt.Sprintf("[%d,[]]", i) {
				failures.Add(1)
				t.Errorf("ordinary job %d beside the hostile ones: %v %s", i, err, got)
			}
			ordinary.Add(1)
		}
	}()

	for _, h := range hostileSuite {
		if g := h.underGVisor; g != nil && runtime == sandboxpool.GVisor {
			h = hostile{name: h.name, script: cmp.Or(g.script, h.script), probe: cmp.Or(g.probe, h.probe), kind: g.kind, timeout: h.timeout}
		}
		t.Run(h.name, func(t *testing.T) {
			id := newID("hostile")
			a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: id, Sandbox: "default", Script: h.script, TimeoutSec: cmp.Or(h.timeout, 3)})
			evs := a.events(id, 2*time.Minute)
			done := last(evs)
			if h.kind == "" {
				if !done.Success || done.FinalData != true {
					t.Errorf("attempt succeeded against the sandbox: result %v; %s", done.FinalData, describe(evs))
				}
			} else if e := find(evs, wire.EventError); done.Success || e == nil || e.Kind != h.kind {
				t.Errorf("want a %s error: %s", h.kind, describe(evs))
			}
			for _, ev := range evs {
				if ev.Type == wire.EventFinalResult && ev.Data == "forged" {
					t.Errorf("a forged line became a result")
				}
			}
			if h.probe != "" {
				pid := newID("probe")
				a.submit(wire.ContentTypeMsgpack, wire.Job{ExecutionID: pid, Sandbox: "default", Script: h.probe})
				if pd := last(a.events(pid, 2*time.Minute)); !pd.Success || pd.FinalData != true {
					t.Errorf("the next execution saw what the attempt left: %s", describe(a.allEvents(pid)))
				}
			}
		})
	}
	close(stop)
	wg.Wait()
	if ordinary.Load() < 5 || failures.Load() > 0 {
		t.Errorf("ordinary jobs beside the suite: %d ran, %d failed", ordinary.Load(), failures.Load())
	}
}

// TestAScriptCannotUseUpWhatTheKernelCountsPerUserForAnother: the kernel counts some
// things per uid, not per container (inotify instances, message-queue bytes, pending
// signals, processes). A script takes every inotify instance its uid may have (128
// here) and holds them while another agent's script runs in the other container of
// the sandbox, which must still get one: each container runs as a uid of its own.
// With one uid for every container, the second failed with EMFILE. Under gVisor
// each container has a kernel, and so counters, of its own anyway.
func TestAScriptCannotUseUpWhatTheKernelCountsPerUserForAnother(t *testing.T) {
	testenv.EachRuntime(t, perUserCountersUnder)
}

func perUserCountersUnder(t *testing.T, runtime string) {
	_, nc := testenv.NATS(t)
	startWorkerPool(t, nc, sandboxpool.Sandbox{PoolSize: 2, MaxUses: benchMaxUses, Runtime: runtime}, nil, nil)
	c := newClient(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	hog, err := c.Submit(ctx, wire.Job{Sandbox: "default", TimeoutSec: 60, Script: `import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while (fd := libc.inotify_init1(0)) >= 0:
    held.append(fd)
print(len(held), ctypes.get_errno(), flush=True)
time.sleep(30)
emit_result(os.getuid())`})
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	for ev := range hog.Events() {
		if ev.Type == wire.EventStdout {
			t.Logf("the hog holds %s inotify instances and got errno", strings.TrimSpace(ev.Text))
			break
		}
	}
	res, err := c.Run(ctx, wire.Job{Sandbox: "default", Script: `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
emit_result({"fd": fd, "errno": ctypes.get_errno(), "uid": os.getuid()})`})
	if err != nil || !res.Success {
		t.Fatalf("the other agent's job: %+v, %v", res, err)
	}
	got, _ := res.FinalData.(map[string]any)
	if fd, _ := got["fd"].(int64); fd < 0 {
		t.Errorf("BROKEN: beside a script holding its uid's inotify instances, another container's script got none: %v", got)
	}
	uid, _ := got["uid"].(int64)
	if uid < sandboxpool.SandboxUIDBase || uid >= sandboxpool.SandboxUIDBase+sandboxpool.SandboxUIDs {
		t.Errorf("the script ran as uid %d, want one of the sandboxes' range from %d", uid, sandboxpool.SandboxUIDBase)
	}
	if err := hog.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
}
