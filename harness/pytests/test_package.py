"""Tests of the package as a whole: what it imports, and when, and what its modules
offer a script that imports them. Run with `make test-python`."""

import ast
import os
import subprocess
import sys
import tempfile
import unittest

from harness_process import HARNESS_DIR, PACKAGE_DIR, HarnessProcess

MODULES = sorted("jazzmine_harness" + ("" if n == "__init__.py" else "." + n[:-3]) for n in os.listdir(PACKAGE_DIR) if n.endswith(".py") and n != "__main__.py")

# The modules that only the harness runs, imported by boot.main once the zygote is forked.
HARNESS_ONLY = sorted("jazzmine_harness." + m for m in ("server", "run", "session", "artifacts", "inputs", "paths", "scratch"))

# What a child starts with: the package but what only the harness runs.
CHILD_MODULES = sorted(set(MODULES) - set(HARNESS_ONLY))


class ImportsTest(unittest.TestCase):
    def test_importing_the_package_imports_what_the_children_run(self):
        out = subprocess.run(
            [sys.executable, "-B", "-P", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import jazzmine_harness; print(*sorted(m for m in sys.modules if m.split('.')[0] == 'jazzmine_harness'))", HARNESS_DIR],
            capture_output=True, text=True, check=True,
        )
        self.assertEqual(out.stdout.split(), CHILD_MODULES)

    def test_the_package_and_its_server_are_every_module(self):
        # boot.main imports server once the zygote is forked: with it, nothing is left
        # that the harness would import later.
        out = subprocess.run(
            [sys.executable, "-B", "-P", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import jazzmine_harness.server; print(*sorted(m for m in sys.modules if m.split('.')[0] == 'jazzmine_harness'))", HARNESS_DIR],
            capture_output=True, text=True, check=True,
        )
        self.assertEqual(out.stdout.split(), MODULES)

    def test_no_module_imports_inside_a_function_but_asyncio_for_async_tools_and_matplotlib_for_its_backend(self):
        # What the harness imports later, it would look up when scripts have run. Two
        # exceptions, both imported in a child for its script: asyncio, for async tools,
        # and matplotlib's Agg, which mpl takes when matplotlib loads it as its backend
        # (matplotlib is the script's; the harness must start without it). And inspect,
        # which tool_specs imports in the harness for its ready event: before any script,
        # after the zygote is forked, so that no child has it; and server, which boot imports
        # then for the same reason (with the modules only it uses). And inspect again in
        # pretty, IPython's printer, only to show a function (see its header). And asyncio
        # in child, for a script with a top-level await.
        allowed = {("boot.py", None), ("tools.py", "asyncio"), ("child.py", "asyncio"), ("tools.py", "inspect"), ("pretty.py", "inspect"), ("mpl.py", "matplotlib.backend_bases"), ("mpl.py", "matplotlib.backends.backend_agg")}
        for name in sorted(os.listdir(PACKAGE_DIR)):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(PACKAGE_DIR, name)) as f:
                tree = ast.parse(f.read(), name)
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        modules = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        modules = [node.module]
                    else:
                        continue
                    for module in modules:
                        self.assertIn((name, module), allowed, "%s:%d" % (name, node.lineno))

    def test_the_package_imports_no_matplotlib(self):
        # mpl is imported with the rest at start; matplotlib must not be (most images
        # have none, and where it is installed it costs every fork). A matplotlib that
        # refuses to be imported stands in for it, installed or not.
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "matplotlib"))
            with open(os.path.join(d, "matplotlib", "__init__.py"), "w") as f:
                f.write("raise ImportError('the harness imported matplotlib')\n")
            out = subprocess.run(
                [sys.executable, "-B", "-P", "-c", "import sys; sys.path[:0] = sys.argv[1:]; import jazzmine_harness; print('ok')", HARNESS_DIR, d],
                capture_output=True, text=True,
            )
        self.assertEqual((out.returncode, out.stdout, out.stderr), (0, "ok\n", ""))


# A script that imports every module of the harness and lists what their globals hold
# beyond classes, functions, modules and plain data: the objects of the harness's own
# types a script could reach by name.
REACH = """
import sys, types
mods = sorted(m for m in sys.modules if m.split(".")[0] == "jazzmine_harness")
live = sorted("%s.%s: %s" % (m, k, type(v).__name__) for m in mods for k, v in vars(sys.modules[m]).items()
              if not isinstance(v, (type, types.FunctionType, types.ModuleType)) and type(v).__module__.split(".")[0] == "jazzmine_harness")
import gc
anywhere = sorted({"%s.%s" % (type(o).__module__, type(o).__qualname__) for o in gc.get_objects()
                   if type(o).__module__.split(".")[0] == "jazzmine_harness" and not isinstance(o, type)})
zygotes = [[o.pid, o.sock] for o in gc.get_objects() if type(o).__qualname__ == "Zygote"]
emit_result({"modules": mods, "live": live, "anywhere": anywhere, "zygotes": zygotes})
"""


class ReachTest(unittest.TestCase):
    def test_a_script_finds_no_harness_stream_request_or_zygote_in_the_modules_or_memory(self):
        # The child shares the zygote's memory, and the single-file harness offered a
        # script its module; split in modules, the package offers no more: no module
        # holds the harness, its stream, a run, the zygote or a child, only /proc held
        # open (as the single file did). The modules only the harness runs (its loop,
        # the wipe) are not in a child at all.
        h = HarnessProcess()
        self.addCleanup(h.close)
        h.send(type="execute", execution_id="r1", script=REACH, nonce="n-reach")
        events = h.until("script_done")
        results = [e["data"] for e in events if e["type"] == "final_result"]
        # Nor does the memory the child shares with the zygote, searched by the garbage
        # collector rather than by name: the child's own stream and requests, and the
        # harness's side of the zygote as it was while the zygote was forked, holding
        # neither its socket nor its pid (the harness sets both after the fork).
        self.assertEqual(results, [{
            "modules": CHILD_MODULES,
            "live": ["jazzmine_harness.system._PROC: Dir"],
            "anywhere": ["jazzmine_harness.child.ChildIO", "jazzmine_harness.child.Requests", "jazzmine_harness.zygote.Zygote"],
            "zygotes": [[None, None]],
        }], events)

    def test_a_script_runs_in_a_process_no_other_can_read(self):
        # Non-dumpable (PR_GET_DUMPABLE 0): no process of the same uid, a script's
        # leftovers included, may ptrace it or read its /proc/<pid>/mem, environ or fd.
        # A child inherits it from the zygote, so this fails too when the harness forks
        # the zygote before it makes itself non-dumpable.
        h = HarnessProcess()
        self.addCleanup(h.close)
        script = "import ctypes\nemit_result(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"
        h.send(type="execute", execution_id="d1", script=script, nonce="n-dump")
        events = h.until("script_done")
        self.assertEqual([e["data"] for e in events if e["type"] == "final_result"], [0], events)


if __name__ == "__main__":
    unittest.main()
