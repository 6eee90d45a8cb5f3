"""Unit tests of jazzmine_harness.child, in-process. Run with `make test-python`."""

import os
import tempfile
import unittest

import harness_process  # noqa: F401 (puts the package on the path)
from jazzmine_harness import child, tools


class TracebackTest(unittest.TestCase):
    def test_starts_at_the_scripts_frames(self):
        try:
            exec(compile("def f():\n    raise ValueError('x')\nf()", "<script>", "exec"), {})
        except ValueError as e:
            tb = child.script_traceback(e)
        self.assertTrue(tb.startswith("Traceback"))
        self.assertIn('File "<script>", line 2, in f', tb)
        self.assertNotIn("test_child", tb)


class AsyncToolTracebackTest(unittest.TestCase):
    def test_hides_the_event_loop_machinery_but_keeps_the_tool(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "t.py"), "w") as f:
                f.write("async def boom(x):\n    raise ValueError('bad ' + x)\n")
            loaded, _ = tools.load_tools(d)
            try:
                exec(compile("boom('input')", "<script>", "exec"), dict(loaded))
            except ValueError as e:
                tb = child.script_traceback(e)
        self.assertIn('File "<script>", line 1', tb)
        self.assertIn("t.py\", line 2, in boom", tb)
        self.assertNotIn("jazzmine_harness", tb)
        self.assertNotIn("concurrent", tb)
        self.assertTrue(tb.endswith("ValueError: bad input\n"))


if __name__ == "__main__":
    unittest.main()
