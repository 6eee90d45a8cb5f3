"""Sessions (jazzmine_harness.session, child._serve_session) over a real harness
process: calls that keep their globals, files and processes, the outbox, and the ways
a session is lost, played by scripts that try to outlast the call or the session.
Run with `make test-python`."""

import os
import statistics
import sys
import time
import unittest

from harness_process import HarnessProcess, blobs


class SessionTest(unittest.TestCase):
    def setUp(self):
        self.h = HarnessProcess()
        self.addCleanup(self.h.close)
        self.n = 0

    def call(self, script, session=True, **kw):
        """Runs script as the next call (a session's unless session is False) and
        returns its events up to script_done, after checking that reset_done follows
        with the execute's nonce."""
        self.n += 1
        eid = "s%d" % self.n
        self.h.send(type="execute", execution_id=eid, script=script, session=session, nonce="n-" + eid, **kw)
        events = self.h.until("script_done")
        self.assertEqual(events[-1]["nonce"], "n-" + eid)
        self.assertEqual({e.get("execution_id") for e in events}, {eid})
        self.assertEqual(self.h.read(), {"type": "reset_done", "nonce": "n-" + eid})
        return events

    def result(self, events):
        results = [e["data"] for e in events if e["type"] == "final_result"]
        self.assertEqual(len(results), 1, events)
        return results[0]

    def errors(self, events):
        return [(e["kind"], e["error"]) for e in events if e["type"] == "error"]

    def assertLost(self, events, why):
        self.assertEqual(self.errors(events), [("session_lost", "session lost: " + why)])
        self.assertEqual([e["type"] for e in events], ["error", "script_done"])

    def test_the_globals_of_a_call_are_the_next_calls(self):
        self.assertEqual(self.errors(self.call("x = 41", mode="interactive")), [])
        self.assertEqual(self.result(self.call("emit_result(x + 1)")), 42)

    def test_a_module_imported_in_the_first_call_is_there_in_the_third(self):
        self.call("import json as j, fractions", mode="interactive")
        self.call("y = 2", mode="interactive")
        self.assertEqual(self.result(self.call("emit_result([j.dumps([y]), str(fractions.Fraction(1, y))])")), ["[2]", "1/2"])

    def test_files_written_in_a_call_are_read_in_the_next_and_cwd_stays(self):
        self.call("import os\nos.makedirs('sub')\nopen('sub/notes.txt', 'w').write('kept')\nos.chdir('sub')", mode="interactive")
        self.assertEqual(self.result(self.call("emit_result(open('notes.txt').read())")), "kept")
        self.assertEqual(os.listdir(os.path.join(self.h.workspace, "sub")), ["notes.txt"])

    def test_a_thread_and_a_process_started_in_a_call_live_on_in_the_next(self):
        script = """import subprocess, sys, threading, time
ticks = []
t = threading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.01) for _ in range(100000)], daemon=True)
t.start()
proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
emit_result(proc.pid)
"""
        pid = self.result(self.call(script))
        before = self.result(self.call("emit_result(len(ticks))"))
        time.sleep(0.1)
        self.assertEqual(self.result(self.call("emit_result([t.is_alive(), proc.poll(), len(ticks) > %d])" % before)), [True, None, True])
        os.kill(pid, 0)  # alive between calls too

    def test_emit_result_is_once_per_call_and_plan_mode_is_per_call(self):
        self.assertEqual(self.result(self.call("emit_result(1)")), 1)
        self.assertEqual(self.result(self.call("emit_result(2)")), 2)
        events = self.call("z = 3")
        self.assertEqual(self.errors(events)[0][0], "script", "plan mode: a call without a result fails")
        self.assertEqual(self.result(self.call("emit_result(z)")), 3)

    def test_out_is_an_outbox_emptied_after_its_artifacts_are_sent(self):
        script = "import os\nos.makedirs('out', exist_ok=True)\nopen('out/%s', 'w').write('%s')\nopen('report.md', 'w').write('r')"
        first = self.call(script % ("a.txt", "first"), mode="interactive", artifacts=["report.md"])
        self.assertEqual([(h["path"], data) for h, data in blobs(first)], [("out/a.txt", b"first"), ("report.md", b"r")])
        self.assertEqual(os.listdir(os.path.join(self.h.workspace, "out")), [], "sent: gone from out/")
        self.assertTrue(os.path.exists(os.path.join(self.h.workspace, "report.md")), "a requested path outside out/ stays")
        second = self.call(script % ("b.txt", "second"), mode="interactive")
        self.assertEqual([(h["path"], data) for h, data in blobs(second)], [("out/b.txt", b"second")])
        self.assertEqual(self.result(self.call("import os\nemit_result(sorted(os.listdir('.')))")), ["out", "report.md"])

    def test_open_figures_are_displayed_per_call(self):
        # No matplotlib here: a display() per call and none carried over.
        self.assertEqual([e["data"] for e in self.call("display('one')", mode="interactive") if e["type"] == "display"], [{"text/plain": "'one'"}])
        self.assertEqual([e for e in self.call("pass", mode="interactive") if e["type"] == "display"], [])

    def test_a_timeout_the_script_survives_keeps_the_session(self):
        self.call("x = 'still here'", mode="interactive")
        events = self.call("import time\ntime.sleep(5)", timeout=0.3)
        self.assertEqual(self.errors(events), [("timeout", "Script timed out after 0.3s")])
        self.assertEqual(self.result(self.call("emit_result(x)")), "still here")

    def test_a_call_the_parent_must_kill_loses_the_session_and_later_calls_do_not_run(self):
        self.call("x = 1", mode="interactive")
        events = self.call("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass", timeout=0.3)
        self.assertEqual([k for k, _ in self.errors(events)], ["timeout"])
        self.assertEqual(events[-1]["signal"], "SIGKILL")
        for _ in range(2):
            self.assertLost(self.call("open('ran', 'w').write('x')\nemit_result(x)"), "its process was killed at the timeout")
        self.assertEqual(os.listdir(self.h.workspace), [], "the lost call's reset wiped; the later ones ran nothing")

    def test_a_call_blocked_in_c_loses_the_session(self):
        self.call("x = 1", mode="interactive")
        events = self.call("import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\ntime.sleep(30)", timeout=0.3)
        self.assertEqual([k for k, _ in self.errors(events)], ["timeout"])
        self.assertLost(self.call("emit_result(x)"), "its process was killed at the timeout")

    def test_os_exit_crashes_the_call_and_loses_the_session(self):
        self.call("x = 1", mode="interactive")
        events = self.call("import os\nos._exit(3)")
        self.assertEqual(events[-1]["exit_code"], 3)
        self.assertEqual(self.errors(events), [("script", "Script process exited with code 3 before it gave a result")])
        self.assertLost(self.call("emit_result(x)"), "its process died (exit code 3)")

    def test_a_session_whose_process_dies_between_calls_is_lost(self):
        script = "import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), os.kill(os.getpid(), 9))).start()\nemit_result(os.getpid())"
        self.assertGone(self.result(self.call(script)))
        self.assertLost(self.call("emit_result(1)"), "its process died (signal 9)")

    def test_a_cancel_loses_the_session(self):
        self.call("x = 1", mode="interactive")
        self.n += 1
        self.h.send(type="execute", execution_id="s%d" % self.n, script="import time\ntime.sleep(30)", session=True, nonce="n-c")
        self.h.send(type="cancel", execution_id="s%d" % self.n)
        events = self.h.until("script_done")
        self.assertEqual(self.errors(events), [("cancelled", "Execution cancelled")])
        self.assertEqual(self.h.read(), {"type": "reset_done", "nonce": "n-c"})
        self.assertLost(self.call("emit_result(x)"), "its call was cancelled")

    def test_sys_exit_is_an_error_and_the_session_goes_on(self):
        self.call("x = 5", mode="interactive")
        self.assertEqual(self.errors(self.call("import sys\nsys.exit(2)")), [("script", "SystemExit: 2")])
        self.assertEqual(self.result(self.call("emit_result(x)")), 5)

    def test_a_reset_kills_the_sessions_processes_wipes_and_a_later_execute_is_stateless(self):
        script = "import subprocess, sys\nx = 1\nopen('kept', 'w').write('x')\nproc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\nemit_result(proc.pid)"
        pid = self.result(self.call(script))
        self.h.send(type="reset", nonce="n-reset")
        self.assertEqual(self.h.read(), {"type": "reset_done", "nonce": "n-reset"})
        self.assertEqual(os.listdir(self.h.workspace), [])
        self.assertGone(pid)
        self.assertEqual(self.result(self.call("import os\nemit_result(['x' in globals(), os.listdir('.')])", session=False)), [False, []])
        self.assertEqual(self.result(self.call("emit_result('x' in globals())")), False, "a session after the reset is a new one")

    def test_a_non_session_execute_ends_the_session_and_runs_stateless(self):
        pid = self.result(self.call("import subprocess, sys\nx = 1\nopen('kept', 'w').write('x')\nemit_result(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']).pid)"))
        self.assertEqual(self.result(self.call("import os\nemit_result(['x' in globals(), os.listdir('.')])", session=False)), [False, []])
        self.assertGone(pid)
        self.assertLost(self.call("emit_result(x)"), "it was ended by a non-session execute")

    def test_an_input_file_replaces_the_sessions_file_and_a_link_is_refused(self):
        self.h.send_file("s1", "data.txt", b"one")
        self.assertEqual(self.result(self.call("emit_result(open('data.txt').read())")), "one")
        self.h.send_file("s2", "data.txt", b"two")
        self.assertEqual(self.result(self.call("import os\nos.symlink('/etc/passwd', 'link')\nemit_result(open('data.txt').read())")), "two")
        self.h.send_file("s3", "link", b"x")
        self.assertEqual(self.errors(self.call("emit_result(1)")), [("input_file", "input file link: already exists and is a symbolic link")])
        self.assertEqual(self.result(self.call("emit_result(open('data.txt').read())")), "two", "the session goes on")

    def test_the_sessions_script_never_sees_a_nonce(self):
        # The nonces of this call and of the one before, searched in every object the
        # collector knows and every frame above the script. The needles are rebuilt
        # each time, never kept where they would find themselves.
        self.call("seen = []", mode="interactive")
        script = """import gc, sys
for R in ("1s-n", "2s-n"):
    seen.append(any(R[::-1] in repr(o) for o in gc.get_objects() if isinstance(o, (dict, list, tuple))))
    f = sys._getframe().f_back
    while f:
        seen.append(R[::-1] in repr(f.f_locals))
        f = f.f_back
emit_result(any(seen))
"""
        self.assertEqual(self.result(self.call(script)), False)

    def test_events_a_thread_sends_between_calls_come_with_the_next_call(self):
        self.call("import threading, time\nev = threading.Event()\nthreading.Thread(target=lambda: (ev.wait(), emit_log('late'))).start()", mode="interactive")
        self.call("ev.set(); time.sleep(0.2)", mode="interactive")
        events = self.call("emit_result(1)")
        self.assertEqual(self.result(events), 1)

    def test_a_forged_end_shifts_only_the_sessions_own_calls(self):
        # The child's event pipe is the session's own: its script may write an end
        # line there. The parent then takes the call as done, and what the script does
        # after comes with the next call; every call is still answered under its own
        # id and nonce, and nothing reaches the protocol stream but through the parent.
        script = "import os, time\nfd = emit_result.__closure__[0].cell_contents.fd\nos.write(fd, b'\\n{\"type\":\"_done\"}\\n')\ntime.sleep(0.2)\nemit_result('late')"
        self.assertEqual([e["type"] for e in self.call(script, mode="interactive")], ["script_done"])
        self.assertEqual(self.result(self.call("emit_result('second')")), "late")
        self.assertEqual(self.result(self.call("emit_result('third')")), "second")

    def assertGone(self, pid):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)
        self.fail("process %d outlived its session" % pid)


class SessionSpeedTest(unittest.TestCase):
    """Not a test of speed (none asserts a time): reports the median round trip of a
    session call and of a stateless call, execute to reset_done, on stderr."""

    CALLS = 200

    def test_report_the_median_session_and_stateless_call(self):
        h = HarnessProcess()
        self.addCleanup(h.close)
        medians = {}
        for session in (True, False):
            times = []
            for i in range(self.CALLS):
                started = time.perf_counter()
                h.send(type="execute", execution_id="p%d" % i, script="emit_result(1)", session=session, nonce="n")
                events = h.until("reset_done")
                times.append(time.perf_counter() - started)
                self.assertEqual([e["type"] for e in events], ["final_result", "script_done", "reset_done"])
            medians[session] = statistics.median(times) * 1000
        sys.stderr.write("\nmedian of %d calls, execute to reset_done: session %.3f ms, stateless %.3f ms\n" % (self.CALLS, medians[True], medians[False]))


if __name__ == "__main__":
    unittest.main()
