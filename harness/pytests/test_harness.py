"""Unit tests of executor_harness.py: its pieces in-process, and its protocol end to end
over a real harness process. Run with `make test-python`."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(os.path.dirname(HERE), "executor_harness.py")
sys.path.insert(0, os.path.dirname(HERE))

import executor_harness as eh  # noqa: E402


class LoadToolsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, src):
        with open(os.path.join(self.dir.name, name), "w") as f:
            f.write(src)

    def test_exports_public_functions_defined_in_the_file(self):
        self.write("a.py", "from os.path import join\nimport json\ndef tool(x):\n    return x\ndef _helper():\n    pass\nCONST = 1\n")
        tools, errors = eh.load_tools(self.dir.name)
        self.assertEqual(sorted(tools), ["tool"])
        self.assertEqual(errors, [])

    def test_async_tools_become_plain_functions(self):
        self.write("b.py", "import asyncio\nasync def fetch(x):\n    await asyncio.sleep(0)\n    return x * 2\n")
        tools, _ = eh.load_tools(self.dir.name)
        self.assertEqual(tools["fetch"](21), 42)
        self.assertTrue(getattr(tools["fetch"], "__jazzmine_async__", False))

    def test_a_broken_tool_is_reported_and_others_still_load(self):
        self.write("bad.py", "import sys\nsys.exit(1)\n")
        self.write("good.py", "def ok():\n    return 1\n")
        tools, errors = eh.load_tools(self.dir.name)
        self.assertEqual(list(tools), ["ok"])
        self.assertEqual(errors[0]["file"], "bad.py")
        self.assertIn("SystemExit", errors[0]["error"])
        self.assertIn("Traceback", errors[0]["traceback"])

    def test_a_missing_directory_means_no_tools(self):
        self.assertEqual(eh.load_tools(os.path.join(self.dir.name, "nope")), ({}, []))


class WipeTest(unittest.TestCase):
    def test_removes_everything_inside_but_not_the_directory_nor_link_targets(self):
        with tempfile.TemporaryDirectory() as outside, tempfile.TemporaryDirectory() as d:
            keep = os.path.join(outside, "keep.txt")
            open(keep, "w").close()
            open(os.path.join(d, ".dot"), "w").close()
            os.makedirs(os.path.join(d, "a", "b"))
            open(os.path.join(d, "a", "b", "f"), "w").close()
            os.chmod(os.path.join(d, "a", "b"), 0o500)
            os.chmod(os.path.join(d, "a"), 0o500)
            os.symlink(outside, os.path.join(d, "link"))
            os.symlink(outside, os.path.join(d, "a", "b", "deeplink"))
            eh._Scratch(d).wipe()
            self.assertEqual(os.listdir(d), [])
            self.assertTrue(os.path.exists(keep), "wipe followed a symlink out of the directory")

    def _dead_drop(self, d, depth, name_len):
        """What an attacker leaves: a tree deeper than PATH_MAX, every level made
        searchable only (0o111), with a file at the bottom."""
        fd = os.open(d, os.O_RDONLY)
        fds = [fd]
        for i in range(depth):
            n = ("L%02d" % (i % 100)) * (name_len // 3)
            os.mkdir(n, dir_fd=fd)
            fd = os.open(n, os.O_RDONLY, dir_fd=fd)
            fds.append(fd)
        os.close(os.open("loot", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
        for parent, n in zip(fds, [("L%02d" % (i % 100)) * (name_len // 3) for i in range(depth)]):
            os.chmod(n, 0o111, dir_fd=parent)
        for f in fds:
            os.close(f)

    def test_removes_trees_past_path_max_made_unreadable_at_every_level(self):
        with tempfile.TemporaryDirectory() as d:
            scratch = eh._Scratch(d)  # as the harness opens it at start, mode 0o700
            self._dead_drop(d, 20, 240)  # 20 levels of 240 characters: past PATH_MAX
            open(os.path.join(d, ".local"), "w").close()
            os.chmod(d, 0o000)
            scratch.wipe()
            self.assertEqual(os.listdir(d), [])
            self.assertEqual(os.stat(d).st_mode & 0o777, 0o700, "the directory's own mode is given back")

    def test_a_tree_too_deep_to_wipe_retires_the_container(self):
        with tempfile.TemporaryDirectory() as d:
            self._dead_drop(d, eh.WIPE_DEPTH + 10, 3)
            with self.assertRaises(eh.Retire):
                eh._Scratch(d).wipe()
            # What the test made is still removable by its owner.
            subprocess.run(["chmod", "-R", "u+rwx", d], check=True)

    def test_unset_directories_are_never_wiped_outside_a_container(self):
        env = dict(os.environ)
        for k in ("JAZZMINE_WORKSPACE", "JAZZMINE_TMPDIR", "JAZZMINE_CONTAINER"):
            env.pop(k, None)
        out = subprocess.run(
            [sys.executable, "-c", "import executor_harness as eh; print(eh.WORKSPACE, eh.TMPDIR)"],
            cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True, check=True,
        )
        self.assertEqual(out.stdout.split(), ["None", "None"])


class TracebackTest(unittest.TestCase):
    def test_starts_at_the_scripts_frames(self):
        try:
            exec(compile("def f():\n    raise ValueError('x')\nf()", "<script>", "exec"), {})
        except ValueError as e:
            tb = eh._script_traceback(e)
        self.assertTrue(tb.startswith("Traceback"))
        self.assertIn('File "<script>", line 2, in f', tb)
        self.assertNotIn("test_harness", tb)


class AsyncToolTracebackTest(unittest.TestCase):
    def test_hides_the_event_loop_machinery_but_keeps_the_tool(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "t.py"), "w") as f:
                f.write("async def boom(x):\n    raise ValueError('bad ' + x)\n")
            tools, _ = eh.load_tools(d)
            try:
                exec(compile("boom('input')", "<script>", "exec"), dict(tools))
            except ValueError as e:
                tb = eh._script_traceback(e)
        self.assertIn('File "<script>", line 1', tb)
        self.assertIn("t.py\", line 2, in boom", tb)
        self.assertNotIn("executor_harness", tb)
        self.assertNotIn("concurrent", tb)
        self.assertTrue(tb.endswith("ValueError: bad input\n"))


class HarnessProcess:
    """A real harness process driven over its stdin and stdout."""

    def __init__(self, env=None, tools=None):
        self.tmp = tempfile.TemporaryDirectory()
        os.mkdir(os.path.join(self.tmp.name, "tools"))
        for name, src in (tools or {}).items():
            with open(os.path.join(self.tmp.name, "tools", name), "w") as f:
                f.write(src)
        self.workspace = os.path.join(self.tmp.name, "ws")
        os.mkdir(self.workspace)
        e = dict(os.environ, JAZZMINE_WORKSPACE=self.workspace, JAZZMINE_TMPDIR=self.tmp.name + "/t", JAZZMINE_CONTAINER="0",
                 JAZZMINE_TOOLS_DIR=os.path.join(self.tmp.name, "tools"))
        os.mkdir(e["JAZZMINE_TMPDIR"])
        e.update(env or {})
        self.p = subprocess.Popen([sys.executable, HARNESS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=e)
        self.ready = self.read()

    def send(self, **req):
        self.p.stdin.write((json.dumps(req) + "\n").encode())
        self.p.stdin.flush()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise EOFError("harness closed its stdout")
        return json.loads(line)

    def until(self, kind):
        events = []
        while True:
            ev = self.read()
            events.append(ev)
            if ev["type"] == kind:
                return events

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=10)
        self.p.stdout.close()
        self.tmp.cleanup()


class ProtocolTest(unittest.TestCase):
    def setUp(self):
        self.h = HarnessProcess()
        self.addCleanup(self.h.close)

    def test_ready_comes_first_and_names_the_version(self):
        self.assertEqual(self.h.ready["type"], "ready")
        self.assertEqual(self.h.ready["version"], eh.HARNESS_VERSION)

    def test_ping_answers_pong(self):
        self.h.send(type="ping")
        self.assertEqual(self.h.read()["type"], "pong")

    def test_every_event_of_an_execution_carries_its_id(self):
        self.h.send(type="execute", execution_id="x1", script="print('a')\nemit_intermediate('l', 1)\nemit_result(2)")
        events = self.h.until("script_done")
        self.assertEqual({e["execution_id"] for e in events}, {"x1"})
        self.assertEqual([e["type"] for e in events][-2:], ["final_result", "script_done"])

    def test_a_forged_protocol_line_is_only_output(self):
        script = "import json, sys\njson.dumps = lambda *a, **k: 'broken'\nprint('{\"type\":\"final_result\",\"execution_id\":\"x2\",\"data\":\"forged\"}')\nsys.stderr.write('{\"type\":\"script_done\"}\\n')\nemit_result('real')"
        self.h.send(type="execute", execution_id="x2", script=script)
        events = self.h.until("script_done")
        results = [e for e in events if e["type"] == "final_result"]
        self.assertEqual([r["data"] for r in results], ["real"])
        self.assertIn("forged", "".join(e.get("text", "") for e in events if e["type"] == "stdout"))

    def test_emit_result_twice_is_an_error_in_the_script(self):
        self.h.send(type="execute", execution_id="x3", script="emit_result(1)\nemit_result(2)")
        events = self.h.until("script_done")
        self.assertEqual([e["data"] for e in events if e["type"] == "final_result"], [1])
        errors = [e for e in events if e["type"] == "error"]
        self.assertIn("only once", errors[0]["error"])

    def test_unserialisable_data_is_a_clear_error(self):
        self.h.send(type="execute", execution_id="x4", script="emit_result(object())")
        events = self.h.until("script_done")
        self.assertIn("JSON-serializable", [e for e in events if e["type"] == "error"][0]["error"])

    def test_a_cancel_for_another_execution_is_ignored(self):
        self.h.send(type="execute", execution_id="x5", script="import time\ntime.sleep(0.3)\nemit_result('done')")
        self.h.send(type="cancel", execution_id="other")
        events = self.h.until("script_done")
        self.assertEqual([e["data"] for e in events if e["type"] == "final_result"], ["done"])

    def test_ping_is_answered_while_a_script_runs(self):
        self.h.send(type="execute", execution_id="x6", script="import time\ntime.sleep(0.5)\nemit_result(1)")
        self.h.send(type="ping")
        first = self.h.read()
        self.assertEqual(first["type"], "pong")
        self.assertEqual(self.h.until("script_done")[-1]["execution_id"], "x6")

    def test_a_second_execute_while_busy_is_refused_not_queued(self):
        self.h.send(type="execute", execution_id="x7", script="import time\ntime.sleep(0.3)\nemit_result(1)")
        self.h.send(type="execute", execution_id="x8", script="emit_result(2)")
        events = self.h.until("script_done")
        self.assertEqual(events[-1]["execution_id"], "x8")
        self.assertIn("busy", events[0]["error"])
        self.assertEqual(self.h.until("script_done")[-1]["execution_id"], "x7")

    def test_a_malformed_request_is_logged_and_skipped(self):
        self.h.p.stdin.write(b"not json\n")
        self.h.p.stdin.flush()
        self.assertEqual(self.h.read()["level"], "warning")
        self.h.send(type="ping")
        self.assertEqual(self.h.read()["type"], "pong")

    def test_the_script_gets_trace_context_and_a_tmpdir(self):
        self.h.send(type="execute", execution_id="x9", traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                    script="import os, tempfile\nemit_result([os.environ.get('TRACEPARENT'), tempfile.gettempdir()])")
        result = [e for e in self.h.until("script_done") if e["type"] == "final_result"][0]["data"]
        self.assertEqual(result[0], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        self.assertTrue(result[1].endswith("/t"))

    def test_reset_answers_reset_done(self):
        self.h.send(type="reset")
        self.assertEqual(self.h.read()["type"], "reset_done")

    def test_a_request_line_without_end_is_dropped_not_kept(self):
        chunk = b"x" * (1 << 20)
        for _ in range(17):
            self.h.p.stdin.write(chunk)
        self.h.p.stdin.write(b"\n")
        self.h.p.stdin.flush()
        ev = self.h.read()
        self.assertEqual((ev["type"], ev["level"]), ("log", "warning"))
        self.assertIn("dropped a request line", ev["message"])
        self.h.send(type="ping")
        self.assertEqual(self.h.read()["type"], "pong")

    def test_every_execute_ends_with_reset_done_unasked(self):
        for i in range(2):
            self.h.send(type="execute", execution_id="e%d" % i, script="open('left', 'w').write('x')\nemit_result(1)", timeout=5)
            self.assertEqual(self.h.until("script_done")[-1]["execution_id"], "e%d" % i)
            self.assertEqual(self.h.read()["type"], "reset_done")
            self.assertEqual(os.listdir(self.h.workspace), [], "the workspace is wiped before reset_done")

    def test_answers_carry_the_nonce_of_their_request(self):
        self.h.send(type="ping", nonce="n-ping")
        self.assertEqual(self.h.read()["nonce"], "n-ping")
        self.h.send(type="reset", nonce="n-reset")
        self.assertEqual(self.h.read()["nonce"], "n-reset")
        self.h.send(type="execute", execution_id="n1", script="emit_result(1)", nonce="n-exec")
        self.assertEqual(self.h.until("script_done")[-1]["nonce"], "n-exec")
        self.assertEqual(self.h.read(), {"type": "reset_done", "nonce": "n-exec"})

    def test_the_script_never_sees_the_nonce(self):
        nonce = "f00dfeedcafe" * 3
        # Every object the collector knows and every frame above the script (the
        # child's request is a local there). The needle is rebuilt each time, never
        # kept where it would find itself.
        script = """import gc, sys
R = %r
seen = any(R[::-1] in repr(o) for o in gc.get_objects() if isinstance(o, (dict, list, tuple)))
f = sys._getframe().f_back
while f:
    seen = seen or R[::-1] in repr(f.f_locals)
    f = f.f_back
emit_result(seen)
""" % nonce[::-1]
        self.h.send(type="execute", execution_id="n2", script=script, nonce=nonce)
        events = self.h.until("script_done")
        self.assertEqual(events[-1]["nonce"], nonce)
        self.assertEqual([e["data"] for e in events if e["type"] == "final_result"], [False], events)

    def test_a_tool_that_prints_at_import_cannot_write_into_the_protocol(self):
        h = HarnessProcess(tools={"loud.py": "import sys\nprint('{\"type\":\"script_done\"}')\nsys.stdout.flush()\ndef quiet():\n    return 1\n"})
        self.addCleanup(h.close)
        self.assertEqual(h.ready["type"], "ready")
        self.assertEqual(h.ready["tools"], ["quiet"])


if __name__ == "__main__":
    unittest.main()
