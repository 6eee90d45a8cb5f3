"""Unit tests of jazzmine_harness.tools. Run with `make test-python`."""

import inspect
import os
import tempfile
import textwrap
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


# A tool file with every shape of signature; each function's spec is held to what
# inspect.signature and inspect.getdoc say of it.
SHAPES = textwrap.dedent(
    '''
    import functools
    import typing
    from typing import Optional


    class Point:
        pass


    def plain(a, b):
        pass


    def annotated(text: str, n: int = 3, *, sep: str = ", ") -> list[str]:
        """Splits text.

            Indented detail,
              more indented.

        """


    def every_kind(a, b: int, /, c=1, *args: float, d, e: Optional[int] = None, **kw: dict) -> typing.Any:
        pass


    def unions(x: int | None = None, p: Point = None, q: "typing.List[Point]" = ()) -> dict[str, list[int]]:
        """One line."""


    def only_keywords(*, flag=True, name: str = "x"):
        pass


    def _decorate(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            return fn(*args, **kwargs)

        return inner


    @_decorate
    def decorated(path: str, mode: str = "r") -> bytes:
        """Reads path."""
    '''
)


class ToolSpecsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def load(self, name, src):
        with open(os.path.join(self.dir.name, name), "w") as f:
            f.write(src)
        loaded, errors = tools.load_tools(self.dir.name)
        self.assertEqual(errors, [])
        return loaded, {s["name"]: s for s in tools.tool_specs(loaded)}

    def test_signatures_and_docs_read_as_inspect_writes_them(self):
        loaded, specs = self.load("shapes.py", SHAPES)
        self.assertEqual(sorted(specs), ["annotated", "decorated", "every_kind", "only_keywords", "plain", "unions"])
        for name, fn in loaded.items():
            with self.subTest(name):
                want = str(inspect.signature(fn))
                if name == "unions":  # a string annotation reads as written, unquoted
                    want = want.replace("'typing.List[Point]'", "typing.List[Point]")
                self.assertEqual(specs[name]["signature"], want)
                self.assertEqual(specs[name]["doc"], inspect.getdoc(fn) or "")
                self.assertFalse(specs[name]["async"])
        self.assertEqual(specs["annotated"]["signature"], "(text: str, n: int = 3, *, sep: str = ', ') -> list[str]")
        self.assertEqual(specs["annotated"]["doc"], "Splits text.\n\nIndented detail,\n  more indented.")
        self.assertEqual(specs["decorated"]["signature"], "(path: str, mode: str = 'r') -> bytes")

    def test_an_async_tool_reports_the_function_its_file_defines(self):
        _, specs = self.load("c.py", 'async def fetch(user_id: int, retries=2) -> dict:\n    """Fetches a user."""\n')
        self.assertEqual(specs["fetch"], {"name": "fetch", "signature": "(user_id: int, retries=2) -> dict", "doc": "Fetches a user.", "async": True})

    def test_a_default_whose_repr_raises_gives_an_unknown_signature(self):
        src = "class Bad:\n    def __repr__(self):\n        raise RuntimeError('no')\ndef tool(x=Bad()):\n    pass\n"
        _, specs = self.load("d.py", src)
        self.assertEqual(specs["tool"]["signature"], "(...)")

    def test_the_ready_event_carries_the_specs_and_scripts_find_no_inspect(self):
        h = HarnessProcess(tools={"t.py": 'def add(a: int, b: int = 1) -> int:\n    """Adds."""\n    return a + b\n'})
        self.addCleanup(h.close)
        self.assertEqual(h.ready["tool_specs"], [{"name": "add", "signature": "(a: int, b: int = 1) -> int", "doc": "Adds.", "async": False}])
        # What every fork copies stays as it was: the harness never imports inspect.
        h.send(type="execute", execution_id="i1", script="import sys\nemit_result('inspect' in sys.modules)")
        self.assertEqual([e["data"] for e in h.until("script_done") if e["type"] == "final_result"], [False])


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
