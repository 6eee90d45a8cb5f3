package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jazzmine/worker/wire"
)

func TestHarnessAnnouncesLoadedToolsAndToolErrors(t *testing.T) {
	h := startHarness(t, map[string]string{
		"math_tools.py": "import os\nfrom os.path import join\ndef add(a: int, b: int = 2) -> int:\n    \"\"\"Adds b to a.\"\"\"\n    return a + b\ndef _private():\n    pass\n",
		"broken.py":     "raise ValueError('tool is broken')\n",
	})
	if h.Ready.Version != Version {
		t.Errorf("ready version = %q, want %q", h.Ready.Version, Version)
	}
	if !slices.Equal(h.Ready.Tools, []string{"add"}) {
		t.Errorf("tools = %v, want only [add] (no imports, no private names)", h.Ready.Tools)
	}
	if want := []ToolSpec{{Name: "add", Signature: "(a: int, b: int = 2) -> int", Doc: "Adds b to a."}}; !slices.Equal(h.Ready.ToolSpecs, want) {
		t.Errorf("tool specs = %+v, want %+v", h.Ready.ToolSpecs, want)
	}
	if len(h.Ready.ToolErrors) != 1 || h.Ready.ToolErrors[0].File != "broken.py" ||
		!strings.Contains(h.Ready.ToolErrors[0].Traceback, "tool is broken") {
		t.Errorf("tool errors = %+v, want broken.py with its traceback", h.Ready.ToolErrors)
	}
}

func TestScriptResultsIntermediatesLogsAndOutputArriveInOrder(t *testing.T) {
	h := startHarness(t, map[string]string{
		"tools.py": "import asyncio\ndef add(a, b):\n    return a + b\nasync def double(x):\n    await asyncio.sleep(0.01)\n    return 2 * x\n",
	})
	res, rec := h.exec(t, "e1", `
print("step one")
emit_intermediate("progress", {"done": 1})
emit_log("halfway", level="warning")
import os, subprocess, sys
os.write(1, b"raw fd1\n")
os.write(2, b"raw fd2\n")
print("to stderr", file=sys.stderr)
subprocess.run(["echo", "from a subprocess"])
emit_result({"sum": add(1, 2), "async": double(21)})
`)
	if !res.Success {
		t.Fatalf("result failed: %s %s", res.Error, res.Traceback)
	}
	if string(res.FinalData) != `{"sum":3,"async":42}` {
		t.Errorf("final data = %s", res.FinalData)
	}
	if len(res.Intermediates) != 1 || res.Intermediates[0].Label != "progress" || string(res.Intermediates[0].Data) != `{"done":1}` {
		t.Errorf("intermediates = %+v", res.Intermediates)
	}
	if len(res.Logs) != 1 || res.Logs[0] != (Log{Level: "warning", Message: "halfway"}) {
		t.Errorf("logs = %+v", res.Logs)
	}
	if got, want := rec.text(wire.EventStdout), "step one\nraw fd1\nfrom a subprocess\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := rec.text(wire.EventStderr), "raw fd2\nto stderr\n"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
	// Streams are separate pipes, so only this is promised across them: whatever the
	// script wrote before an emit arrives before that event.
	types := rec.types()
	first := rec.events[0]
	if first.Type != wire.EventStdout || !strings.HasPrefix(first.Text, "step one\n") {
		t.Errorf("first event = %+v, want the stdout printed before emit_intermediate", first)
	}
	if i := slices.Index(types, wire.EventIntermediate); i < 1 || !slices.Equal(types[len(types)-2:], []string{wire.EventFinalResult, wire.EventScriptDone}) {
		t.Errorf("event order = %v, want stdout first, final_result and script_done last", types)
	}
	if res.OutputBytes == 0 || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Errorf("output bytes = %d, exit code = %v", res.OutputBytes, res.ExitCode)
	}
}

func TestModesDecideSuccessWithoutAResult(t *testing.T) {
	h := startHarness(t, nil)
	plan, _ := h.exec(t, "plan", "x = 1")
	if plan.Success || plan.ErrorKind != wire.KindScript || plan.Error != ErrNoResult || !strings.Contains(plan.Hint, "emit_result(value)") {
		t.Errorf("plan mode without a result: success=%v kind=%q error=%q hint=%q, want a script error whose hint names emit_result", plan.Success, plan.ErrorKind, plan.Error, plan.Hint)
	}
	// A last expression's value is a result, as a notebook cell's Out is.
	last, _ := h.exec(t, "plan-last", "x = 6\nx * 7")
	if !last.Success || string(last.FinalData) != "42" {
		t.Errorf("plan mode ending in an expression: success=%v data=%s error=%q, want success with 42", last.Success, last.FinalData, last.Error)
	}
	inter, _ := h.exec(t, "interactive", "x = 1", interactive)
	if !inter.Success || inter.FinalData != nil {
		t.Errorf("interactive mode without a result: success=%v data=%s error=%q, want success with no data", inter.Success, inter.FinalData, inter.Error)
	}
	nullResult, _ := h.exec(t, "null", "emit_result(None)")
	if !nullResult.Success || string(nullResult.FinalData) != "null" {
		t.Errorf("emit_result(None): success=%v data=%s", nullResult.Success, nullResult.FinalData)
	}
}

func TestExceptionsCarryTheScriptsTraceback(t *testing.T) {
	h := startHarness(t, nil)
	res, rec := h.exec(t, "boom", "def inner():\n    raise KeyError('missing')\ninner()\n")
	if res.Success || res.ErrorKind != wire.KindScript || res.Error != "KeyError: 'missing'" {
		t.Fatalf("error = %q (%s)", res.Error, res.ErrorKind)
	}
	if !strings.Contains(res.Traceback, `File "<script>", line 2, in inner`) || strings.Contains(res.Traceback, Package) {
		t.Errorf("traceback should show the script's frames and no harness frames:\n%s", res.Traceback)
	}
	if got := rec.types(); !slices.Equal(got, []string{wire.EventError, wire.EventScriptDone}) {
		t.Errorf("events = %v", got)
	}
	syntax, _ := h.exec(t, "syntax", "def (")
	if syntax.ErrorKind != wire.KindScript || !strings.HasPrefix(syntax.Error, "SyntaxError") {
		t.Errorf("syntax error = %q (%s)", syntax.Error, syntax.ErrorKind)
	}
}

func TestMissingSecretsAreNamedAndTheScriptDoesNotRun(t *testing.T) {
	h := startHarness(t, nil, "PRESENT_KEY=yes")
	res, rec := h.exec(t, "secrets", "emit_intermediate('ran', 1)\nemit_result(1)", func(r *Request) {
		r.RequiredSecrets = []string{"PRESENT_KEY", "STRIPE_KEY", "DB_PASSWORD"}
	})
	if res.Success || res.ErrorKind != wire.KindMissingSecrets || res.Error != "Missing required secrets: DB_PASSWORD, STRIPE_KEY" {
		t.Errorf("error = %q (%s)", res.Error, res.ErrorKind)
	}
	if slices.Contains(rec.types(), wire.EventIntermediate) {
		t.Error("the script ran although secrets were missing")
	}
	ok, _ := h.exec(t, "present", "import os\nemit_result(os.environ['PRESENT_KEY'])", func(r *Request) { r.RequiredSecrets = []string{"PRESENT_KEY"} })
	if !ok.Success || string(ok.FinalData) != `"yes"` {
		t.Errorf("with the secret present: %+v", ok)
	}
}

// TestExecutionsLeaveNothingBehind runs, over one harness process, scripts that change
// process state, each followed by a script that looks for the change.
func TestExecutionsLeaveNothingBehind(t *testing.T) {
	h := startHarness(t, nil)
	cases := []struct {
		name, dirty, check string
	}{
		{"a monkeypatched module function",
			"import json\njson.dumps = lambda *a, **k: 'forged'\nemit_result(json.dumps(1))",
			"import json\nemit_result(json.dumps([1]) == '[1]')"},
		{"a global variable",
			"secret_token = 'abc'\nemit_result(1)",
			"emit_result('secret_token' not in globals())"},
		{"a changed builtin",
			"import builtins\nbuiltins.len = lambda x: 0\nemit_result(1)",
			"emit_result(len([1, 2]) == 2)"},
		{"a module left in sys.modules",
			"import sys, types\nsys.modules['planted'] = types.ModuleType('planted')\nemit_result(1)",
			"import sys\nemit_result('planted' not in sys.modules)"},
		{"a running thread",
			"import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=False).start()\nemit_result(1)",
			"import threading\nemit_result(threading.active_count() == 1)"},
		{"a signal handler",
			"import signal\nsignal.signal(signal.SIGUSR1, lambda *a: None)\nemit_result(1)",
			"import signal\nemit_result(signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL)"},
		{"a changed working directory",
			"import os\nos.chdir('/')\nemit_result(1)",
			"import os\nemit_result(os.getcwd() == " + pyQuote(h.workspace) + ")"},
		{"an environment variable",
			"import os\nos.environ['LEAK'] = '1'\nemit_result(1)",
			"import os\nemit_result('LEAK' not in os.environ)"},
		{"files in the workspace and tmp, dotfiles included",
			"import os, tempfile\nopen('data.txt', 'w').write('x')\nopen('.hidden', 'w').write('x')\nos.makedirs('deep/er')\nos.chmod('deep', 0o500)\ntempfile.NamedTemporaryFile(delete=False)\nemit_result(1)",
			"import os, tempfile\nemit_result(os.listdir('.') == [] and os.listdir(tempfile.gettempdir()) == [])"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dirty, _ := h.exec(t, fmt.Sprintf("dirty-%d", i), tc.dirty)
			if !dirty.Success {
				t.Fatalf("the dirtying script failed: %s\n%s", dirty.Error, dirty.Traceback)
			}
			check, _ := h.exec(t, fmt.Sprintf("check-%d", i), tc.check)
			if !check.Success || string(check.FinalData) != "true" {
				t.Errorf("the next execution saw %s: result %s %s %s", tc.name, check.FinalData, check.Error, check.Traceback)
			}
		})
	}
}

func pyQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestNoEarlierProcessSurvives(t *testing.T) {
	h := startHarness(t, nil)
	// A plain background process, and a daemon escaping by setsid and double fork.
	res, _ := h.exec(t, "spawn", `
import os, subprocess, time
bg = subprocess.Popen(["sleep", "300"])
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        time.sleep(300)
    os._exit(0)
os.close(w)
daemon = int(os.read(r, 32))
emit_result([bg.pid, daemon])
`)
	var pids []int
	if err := json.Unmarshal(res.FinalData, &pids); err != nil || len(pids) != 2 {
		t.Fatalf("spawn result %s %s: %v", res.FinalData, res.Error, err)
	}
	check := fmt.Sprintf(`
import os
alive = []
for pid in %s:
    try:
        os.kill(pid, 0)
        alive.append(pid)
    except ProcessLookupError:
        pass
emit_result(alive)
`, res.FinalData)
	next, _ := h.exec(t, "look", check)
	if string(next.FinalData) != "[]" {
		t.Errorf("processes of the earlier execution still alive: %s", next.FinalData)
	}
	h.mustReset(t)
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d survived reset", pid)
		}
	}
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

func TestHostileScriptsEndInAnErrorAndTheHarnessLives(t *testing.T) {
	h := startHarness(t, nil)
	cases := []struct {
		name      string
		script    string
		opts      []func(*Request)
		kind      string
		errSubstr string
	}{
		{"an infinite loop", "while True: pass", []func(*Request){timeout(time.Second)}, wire.KindTimeout, "Script timed out after 1s"},
		{"a catastrophic regex", "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')", []func(*Request){timeout(time.Second)}, wire.KindTimeout, "Script timed out after 1s"},
		{"a loop with SIGALRM blocked", "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\nwhile True: pass", []func(*Request){timeout(time.Second)}, wire.KindTimeout, "Script timed out after 1s"},
		{"a loop that swallows the timeout", "while True:\n    try:\n        while True: pass\n    except BaseException:\n        pass", []func(*Request){timeout(time.Second)}, wire.KindTimeout, "Script timed out after 1s"},
		{"sys.exit(3)", "import sys\nsys.exit(3)", nil, wire.KindScript, "SystemExit: 3"},
		{"os._exit(0) in plan mode", "import os\nos._exit(0)", nil, wire.KindScript, "before it gave a result"},
		{"killing itself", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", nil, wire.KindCrashed, "SIGKILL"},
		{"printing 10 MB", "import sys\nfor _ in range(10 * 1024):\n    sys.stdout.write('x' * 1023 + '\\n')", []func(*Request){maxOutput(1 << 20)}, wire.KindOutputLimit, "Output limit exceeded"},
		{"writing 10 MB of binary to fd 1", "import os\nfor _ in range(160):\n    os.write(1, os.urandom(65536))", []func(*Request){maxOutput(1 << 20)}, wire.KindOutputLimit, "Output limit exceeded"},
		// The attacker writes to its own event pipe directly (see eventFD).
		{"half an event line, then the timeout", "import os\nos.write(" + eventFD + ", b'{\"type\":\"final_result\",\"data\":')\nwhile True: pass", []func(*Request){timeout(time.Second)}, wire.KindTimeout, "Script timed out after 1s"},
		{"half an event line in interactive mode, then the timeout", "import os\nos.write(" + eventFD + ", b'{\"type\":\"log\",')\nwhile True: pass", []func(*Request){timeout(time.Second), interactive}, wire.KindTimeout, "Script timed out after 1s"},
		{"a timeout caught, then a result", "try:\n    while True: pass\nexcept BaseException:\n    pass\nemit_result('in time?')", []func(*Request){timeout(time.Second)}, wire.KindTimeout, "Script timed out after 1s"},
		{"a timeout caught, then a result long after", "import time\ntry:\n    while True: pass\nexcept BaseException:\n    pass\nfrom jazzmine_harness import child as eh\neh._alarm['fired'] = False\ntime.sleep(0.5)\nemit_result('late')", []func(*Request){timeout(time.Second)}, wire.KindTimeout, "Script timed out after 1s"},
		{"100 MB on the event pipe with no newline", "import os\nfd = " + eventFD + "\nchunk = b'x' * (1 << 20)\nfor _ in range(100):\n    os.write(fd, chunk)\nemit_result(1)", []func(*Request){maxOutput(1 << 20), timeout(20 * time.Second)}, wire.KindOutputLimit, "Output limit exceeded"},
		{"a forged error kind", "import os\nos.write(" + eventFD + ", b'{\"type\":\"error\",\"kind\":\"infrastructure\",\"error\":\"retry me\"}\\n')", nil, wire.KindScript, "retry me"},
		{"a timeout claimed early", "import os\nos.write(" + eventFD + ", b'{\"type\":\"error\",\"kind\":\"timeout\",\"error\":\"x\"}\\n')", nil, wire.KindScript, "x"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, rec := h.exec(t, fmt.Sprintf("hostile-%d", i), tc.script, tc.opts...)
			if res.Success || res.ErrorKind != tc.kind || !strings.Contains(res.Error, tc.errSubstr) {
				t.Errorf("result: success=%v kind=%q error=%q, want kind %q containing %q", res.Success, res.ErrorKind, res.Error, tc.kind, tc.errSubstr)
			}
			types := rec.types()
			if len(types) < 2 || types[len(types)-1] != wire.EventScriptDone || !slices.Contains(types, wire.EventError) {
				t.Errorf("events end %v, want an error and a final script_done", types[max(0, len(types)-3):])
			}
			if !res.Reusable {
				t.Error("the harness handled the script itself, so its container should be reusable")
			}
			if res.OutputBytes > 1<<20 {
				t.Errorf("output bytes = %d, over the 1 MiB limit", res.OutputBytes)
			}
			h.mustPing(t)
		})
	}
}

// TestAnAlarmDuringAnEventWriteWaitsForTheLine: the script's events go through the
// child's own writer (reached from emit_log's closure, as a script can), each far
// larger than the pipe, and the harness's own alarm fires every 2 ms (the script
// arms it), so that it comes while a line is half written. Each line is finished
// before the alarm's ScriptTimeout is raised: nothing malformed reaches the parent.
func TestAnAlarmDuringAnEventWriteWaitsForTheLine(t *testing.T) {
	h := startHarness(t, nil)
	script := `import json, signal
io_ = [c.cell_contents for c in emit_log.__closure__ if hasattr(c.cell_contents, 'send')][0]
line = (json.dumps({"type": "_warm", "pad": "x" * (8 << 20)}) + "\n").encode()  # dropped by the parent
signal.setitimer(signal.ITIMER_REAL, 0.001)
io_.write(line)  # blocks on the pipe for far longer than a millisecond
`
	res, rec := h.exec(t, "alarm-mid-write", script, timeout(5*time.Second), maxOutput(64<<20))
	if res.Error == "" {
		t.Errorf("result: %+v, want the alarm to end the script", res)
	}
	for _, l := range res.Logs {
		if strings.Contains(l.Message, "malformed") {
			t.Errorf("half an event line reached the parent: %q (events %v)", l.Message, rec.types())
		}
	}
}

// eventFD is Python for the script's own event pipe, the one descriptor above 2 that
// is a pipe: an attacker writes protocol lines there by hand.
const eventFD = "[fd for fd in range(3, 256) if os.path.exists('/proc/self/fd/%d' % fd) and os.readlink('/proc/self/fd/%d' % fd).startswith('pipe:')][0]"

// harnessPID is Python for the harness's pid, seen from a script: the parent of its
// parent, the zygote.
const harnessPID = "int(open('/proc/%d/stat' % os.getppid()).read().rsplit(')', 1)[1].split()[1])"

func TestKillingTheHarnessEndsTheExecutionAtOnce(t *testing.T) {
	h := startHarness(t, nil)
	res, rec := h.exec(t, "parricide", "import os\nos.kill("+harnessPID+", 9)\nimport time\ntime.sleep(60)", timeout(60*time.Second))
	// Waiting for the 60 s timeout would have ended in a timeout error instead.
	if res.Success || res.Error != ErrStdoutClosed || res.ErrorKind != wire.KindCrashed || res.Reusable {
		t.Errorf("result: %q (%s) reusable=%v, want %q, not reusable", res.Error, res.ErrorKind, res.Reusable, ErrStdoutClosed)
	}
	if got := rec.types(); !slices.Equal(got, []string{wire.EventError, wire.EventScriptDone}) {
		t.Errorf("events = %v", got)
	}
}

func TestCancelStopsARunningScript(t *testing.T) {
	h := startHarness(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	var e Executor
	res, err := e.Run(ctx, h.Conn, Request{ExecutionID: "long", Script: "print('sleeping', flush=True)\nimport time\ntime.sleep(60)", Timeout: 60 * time.Second},
		func(ctx context.Context, ev Event) error {
			if ev.Type == wire.EventStdout {
				cancel() // the script is running: cancel it
			}
			return rec.on(ctx, ev)
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Success || res.ErrorKind != wire.KindCancelled || !res.Reusable {
		t.Errorf("result: %q (%s) reusable=%v, want cancelled and reusable", res.Error, res.ErrorKind, res.Reusable)
	}
	if got := rec.types(); got[len(got)-1] != wire.EventScriptDone {
		t.Errorf("events = %v, want script_done last", got)
	}
	h.settle(t, res)
	h.mustPing(t)
	after, _ := h.exec(t, "after", "emit_result('fine')")
	if !after.Success {
		t.Errorf("an execution after the cancel failed: %s", after.Error)
	}
}

func TestACallbackErrorStopsTheRun(t *testing.T) {
	h := startHarness(t, nil)
	var e Executor
	boom := fmt.Errorf("publish failed")
	res, err := e.Run(context.Background(), h.Conn, Request{ExecutionID: "cb", Script: "emit_intermediate('a', 1)\nimport time\ntime.sleep(60)", Timeout: 60 * time.Second},
		func(ctx context.Context, ev Event) error {
			if ev.Type == wire.EventIntermediate {
				return boom
			}
			return nil
		})
	if err != boom {
		t.Fatalf("err = %v, want the callback's error", err)
	}
	if !res.Reusable {
		t.Error("the harness confirmed the cancel, so it should be reusable")
	}
	h.settle(t, res)
	h.mustPing(t)
}

func TestRejectsInvalidRequests(t *testing.T) {
	var e Executor
	c := NewConn(strings.NewReader(""), discard{}, 0)
	defer c.Close()
	for _, req := range []Request{{Script: "x"}, {ExecutionID: "a", Mode: "batch"}} {
		if _, err := e.Run(context.Background(), c, req, nil); err == nil || !strings.Contains(err.Error(), "invalid request") {
			t.Errorf("Run(%+v) err = %v, want an invalid request error", req, err)
		}
	}
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

// TestAScriptHoldsNoDescriptorButItsOwn: the harness keeps /proc, the scratch
// directories and the cgroup's OOM counter open, and the zygote its socket; a script
// starts with /dev/null on fd 0, its stdout and stderr pipes and its event pipe only.
func TestAScriptHoldsNoDescriptorButItsOwn(t *testing.T) {
	h := startHarness(t, nil)
	script := `import os
fds = []
for name in os.listdir('/proc/self/fd'):
    try:
        target = os.readlink('/proc/self/fd/' + name)
    except OSError:
        continue  # the listing's own descriptor, closed by now
    fds.append('pipe' if target.startswith('pipe:') else target)
emit_result(sorted(fds))`
	for i := range 2 { // the first child, and one forked after an execution and reset
		res, _ := h.exec(t, fmt.Sprintf("fds-%d", i), script)
		if want := `["/dev/null","pipe","pipe","pipe"]`; !res.Success || string(res.FinalData) != want {
			t.Errorf("execution %d: descriptors %s, want %s (%s)", i, res.FinalData, want, res.Error)
		}
	}
}

func TestResetWipesTheWorkspace(t *testing.T) {
	h := startHarness(t, nil)
	// Files a process writes after its execution ended are removed by reset.
	if err := os.WriteFile(filepath.Join(h.workspace, ".late"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.tmp, "late"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.mustReset(t)
	for _, d := range []string{h.workspace, h.tmp} {
		entries, err := os.ReadDir(d)
		if err != nil || len(entries) != 0 {
			t.Errorf("%s after reset: %v %v", d, entries, err)
		}
	}
	res, _ := h.exec(t, "after-reset", "emit_result(2)")
	if !res.Success {
		t.Errorf("execution after reset: %s", res.Error)
	}
}

// TestWhatAScriptCannotUndoRetiresTheHarness: resource limits, nice value, scheduling
// policy and affinity of the zygote (and of the harness) are the uid's to change, non
// dumpable or not, and every later child would inherit them; a tree too deep to wipe.
// The script's own execution ends as it would; then the harness exits.
func TestWhatAScriptCannotUndoRetiresTheHarness(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		{"the zygote's memory limit", "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_AS, (200 << 20, 200 << 20))"},
		{"the zygote's CPU limit", "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_CPU, (2, 3))"},
		{"the zygote's nice value", "import os\nos.setpriority(os.PRIO_PROCESS, os.getppid(), 19)"},
		{"the zygote's scheduling policy", "import os\nos.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))"},
		{"the zygote's CPU affinity", "import os\nos.sched_setaffinity(os.getppid(), {min(os.sched_getaffinity(0))})\nassert len(os.sched_getaffinity(0)) > 1, 'one CPU: nothing to change'"},
		{"the zygote's I/O priority", "import ctypes, os, platform\nassert platform.machine() == 'x86_64', 'ioprio_set is 251 on x86_64 only'\nassert ctypes.CDLL(None).syscall(251, 1, os.getppid(), (3 << 13) | 7) == 0"},
		{"the harness's descriptor limit", "import os, resource\nresource.prlimit(" + harnessPID + ", resource.RLIMIT_NOFILE, (64, 64))"},
		{"a directory tree too deep to wipe", "import os\nfd = os.open('.', os.O_RDONLY)\nfor _ in range(400):\n    os.mkdir('d', dir_fd=fd)\n    fd = os.open('d', os.O_RDONLY, dir_fd=fd)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startHarness(t, nil)
			var e Executor
			res, err := e.Run(context.Background(), h.Conn, Request{ExecutionID: "tamper", Script: tc.script, Mode: ModeInteractive}, nil)
			if err != nil || !res.Success {
				t.Fatalf("the script's own run: %v %q %s", err, res.Error, res.Traceback)
			}
			h.mustRetire(t)
		})
	}
}

// TestAKilledZygoteRetiresTheHarness: the script's parent is the zygote, which a
// script may kill (same uid). The script goes on to its own result; then the harness,
// whose memory has held that execution's data, forks no new zygote: it says no
// reset_done and exits, so the host retires the container.
func TestAKilledZygoteRetiresTheHarness(t *testing.T) {
	h := startHarness(t, nil)
	var e Executor
	res, err := e.Run(context.Background(), h.Conn, Request{ExecutionID: "zygote-killer", Script: "import os\nos.kill(os.getppid(), 9)\nimport time\ntime.sleep(0.1)\nemit_result(os.getppid())"}, nil)
	if err != nil || !res.Success {
		t.Fatalf("result: %v %q (%s), want the script's own success", err, res.Error, res.ErrorKind)
	}
	h.mustRetire(t)
}

// mustRetire checks that the harness ended the execution without a reset_done and
// exited with code 3: the container is not to be used again.
func (h *localHarness) mustRetire(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Conn.AwaitReset(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("after the script: %v, want the stream to end without reset_done", err)
	}
	select {
	case <-h.waited:
	case <-ctx.Done():
		t.Fatal("the harness did not exit")
	}
	if code := h.cmd.ProcessState.ExitCode(); code != 3 {
		t.Errorf("harness exit code %d, want 3", code)
	}
}
