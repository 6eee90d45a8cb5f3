"""Unit tests of jazzmine_harness.tools. Run with `make test-python`."""

import os
import tempfile
import unittest

from harness_process import HarnessProcess
from jazzmine_harness import tools


class LoadToolsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, src):
        with open(os.path.join(self.dir.name, name), "w") as f:
            f.write(src)

    def test_exports_public_functions_defined_in_the_file(self):
        self.write("a.py", "from os.path import join\nimport json\ndef tool(x):\n    return x\ndef _helper():\n    pass\nCONST = 1\n")
        loaded, errors = tools.load_tools(self.dir.name)
        self.assertEqual(sorted(loaded), ["tool"])
        self.assertEqual(errors, [])

    def test_async_tools_become_plain_functions(self):
        self.write("b.py", "import asyncio\nasync def fetch(x):\n    await asyncio.sleep(0)\n    return x * 2\n")
        loaded, _ = tools.load_tools(self.dir.name)
        self.assertEqual(loaded["fetch"](21), 42)
        self.assertTrue(getattr(loaded["fetch"], "__jazzmine_async__", False))

    def test_a_broken_tool_is_reported_and_others_still_load(self):
        self.write("bad.py", "import sys\nsys.exit(1)\n")
        self.write("good.py", "def ok():\n    return 1\n")
        loaded, errors = tools.load_tools(self.dir.name)
        self.assertEqual(list(loaded), ["ok"])
        self.assertEqual(errors[0]["file"], "bad.py")
        self.assertIn("SystemExit", errors[0]["error"])
        self.assertIn("Traceback", errors[0]["traceback"])

    def test_a_missing_directory_means_no_tools(self):
        self.assertEqual(tools.load_tools(os.path.join(self.dir.name, "nope")), ({}, []))


class PreloadTest(unittest.TestCase):
    def test_preloaded_modules_are_imported_by_the_harness_and_failures_reported(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "preloaded_mod.py"), "w") as f:
                f.write("import os\nPID = os.getpid()\n")
            with open(os.path.join(d, "broken_mod.py"), "w") as f:
                f.write("raise ValueError('broken')\n")
            h = HarnessProcess(env={"PYTHONPATH": d, "JAZZMINE_PRELOAD": " preloaded_mod, broken_mod,,"})
            self.addCleanup(h.close)
            self.assertEqual([(e["file"], e["error"]) for e in h.ready["tool_errors"]], [("preload:broken_mod", "ValueError: broken")])
            # In sys.modules before the script imports it, imported in the harness itself.
            h.send(type="execute", execution_id="p1", script="import sys\nm = sys.modules.get('preloaded_mod')\nemit_result(m and m.PID)")
            results = [e["data"] for e in h.until("script_done") if e["type"] == "final_result"]
            self.assertEqual(results, [h.ready["pid"]])


if __name__ == "__main__":
    unittest.main()
