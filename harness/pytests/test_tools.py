"""Unit tests of jazzmine_harness.tools. Run with `make test-python`."""

import os
import tempfile
import unittest

import harness_process  # noqa: F401 (puts the package on the path)
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


if __name__ == "__main__":
    unittest.main()
