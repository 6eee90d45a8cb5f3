"""display(obj) and the matplotlib backend (jazzmine_harness.display, .mpl) over a real
harness process. The matplotlib tests skip where matplotlib is not installed (run them
where python3-matplotlib is, as in the datascience sandbox's image). Run with `make test-python`."""

import base64
import importlib.util
import json
import struct
import unittest

from harness_process import HarnessProcess, HarnessTest, blobs

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

# Python for the script's own event pipe (the test of Go's executor has the same).
EVENT_FD = "[fd for fd in range(3, 256) if os.path.exists('/proc/self/fd/%d' % fd) and os.readlink('/proc/self/fd/%d' % fd).startswith('pipe:')][0]"

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def png_size(data):
    """The width and height in a PNG's header (IHDR)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return struct.unpack(">II", data[16:24])


class DisplayTest(HarnessTest):
    REQUEST = {"mode": "interactive"}

    def displays(self, events):
        return [e for e in events if e["type"] == "display"]

    def test_text_plain_is_ipythons_a_str_quoted_a_long_list_broken(self):
        # IPython's display formatter: a str is shown as its repr, a list too long for
        # 79 columns one item a line.
        events = self.execute("s1", "display('hello\\nworld', 42, list(range(30)))")
        self.assertEqual([(d["data"], "path" in d) for d in self.displays(events)], [({"text/plain": "'hello\\nworld'"}, False), ({"text/plain": "42"}, False), ({"text/plain": "[" + ",\n ".join(map(str, range(30))) + "]"}, False)])

    def test_repr_methods_give_text_forms_and_one_image_png_first(self):
        script = """import base64, json
class Rich:
    def __repr__(self): return "Rich()"
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_markdown_(self): return "**rich**"
    def _repr_latex_(self): return None
    def _repr_json_(self): return {"a": [1, 2]}
    def _repr_svg_(self): return "<svg/>"
    def _repr_png_(self): return base64.b64decode(%r)
display(Rich())
""" % base64.b64encode(PNG).decode()
        events = self.execute("r1", script)
        (d,) = self.displays(events)
        self.assertEqual(d["data"], {"text/plain": "Rich()", "text/html": "<b>rich</b>", "text/markdown": "**rich**", "application/json": '{"a":[1,2]}'})
        self.assertEqual((d["path"], d["content_type"], d["size"]), ("display/1.png", "image/png", len(PNG)))
        self.assertEqual(blobs(events)[0][1], PNG)

    def test_svg_jpeg_as_base64_and_a_mimebundle(self):
        script = """class Svg:
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg" width="2" height="1"/>'
class Jpeg:
    def _repr_png_(self): return b""
    def _repr_jpeg_(self): return "/9j/AAAA"
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": "<i>b</i>", "application/vnd.x+json": {"k": 1}, "image/png": b"\\x89PNG", "text/plain": "ignored"}
display(Svg(), Jpeg(), Bundle())
"""
        events = self.execute("v1", script)
        got = [(h["path"], h["content_type"], data) for h, data in blobs(events)]
        self.assertEqual(got, [
            ("display/1.svg", "image/svg+xml", b'<svg xmlns="http://www.w3.org/2000/svg" width="2" height="1"/>'),
            ("display/2.jpg", "image/jpeg", base64.b64decode("/9j/AAAA")),
            ("display/3.png", "image/png", b"\x89PNG"),
        ])
        bundle = self.displays(events)[2]["data"]
        self.assertEqual({k: v for k, v in bundle.items() if k != "text/plain"}, {"text/html": "<i>b</i>", "application/vnd.x+json": '{"k":1}'})
        self.assertTrue(bundle["text/plain"].startswith("<__main__.Bundle at 0x"), bundle)  # IPython's pretty printer

    def test_a_failing_repr_is_said_on_stderr_and_the_rest_is_displayed(self):
        events = self.execute("f1", "class Bad:\n    def __repr__(self): return 'Bad()'\n    def _repr_html_(self): raise ValueError('no html')\ndisplay(Bad())")
        self.assertEqual([d["data"] for d in self.displays(events)], [{"text/plain": "Bad()"}])
        self.assertIn("_repr_html_() raised ValueError: no html", "".join(e["text"] for e in events if e["type"] == "stderr"))

    def test_display_text_counts_toward_the_output_budget(self):
        events = self.execute("o1", "display('x' * 50000)\nprint('after')", max_output_bytes=20000)
        self.assertEqual(self.displays(events), [])
        self.assertEqual([e["kind"] for e in events if e["type"] == "error"], ["output_limit"])

    def test_image_chunks_do_not_count_toward_the_output_budget(self):
        script = "class I:\n    def _repr_png_(self): return b'\\x89PNG' + bytes(300000)\ndisplay(I())\nprint('after')"
        events = self.execute("o2", script, max_output_bytes=20000)
        self.assertEqual([e for e in events if e["type"] == "error"], [])
        self.assertEqual([len(data) for _, data in blobs(events)], [300004])
        self.assertIn("after\n", [e.get("text") for e in events])

    def test_an_image_over_the_artifact_limits_is_left_out_with_a_warning(self):
        script = "class I:\n    def __init__(self, n): self.n = n\n    def _repr_png_(self): return bytes(self.n)\ndisplay(I(600), I(600), I(10))\nprint('after')"
        events = self.execute("l1", script, max_artifact_bytes=1000)
        self.assertEqual([("path" in d, d.get("size")) for d in self.displays(events)], [(True, 600), (False, None), (True, 10)])
        self.assertEqual([h["path"] for h, _ in blobs(events)], ["display/1.png", "display/2.png"])
        self.assertEqual([e["message"] for e in events if e["type"] == "log"], ["display image left out: 1200 bytes, at most 1000 are allowed"])
        self.assertIn("after\n", [e.get("text") for e in events])

    def test_a_forged_display_line_gets_the_parents_path_and_only_text(self):
        # The script writes its own display line: text forms that are not strings, an
        # image type the harness does not send, a path of its choosing.
        line = {"type": "display", "data": {"text/plain": "ok", "text/html": {"not": "text"}, "image/png": "AAAA", "x": "no slash"},
                "path": "../../etc/passwd", "image": {"content_type": "image/png", "size": 4}}
        bad = {"type": "display", "data": {"text/plain": "bad"}, "image": {"content_type": ["image/png"], "size": 3}}
        script = "import os\nfd = %s\nos.write(fd, %r + b'abcd')\nos.write(fd, %r + b'xyz')\nprint('after')" % (EVENT_FD, (json.dumps(line) + "\n").encode(), (json.dumps(bad) + "\n").encode())
        events = self.execute("g1", script)
        self.assertEqual([(d["data"], d.get("path")) for d in self.displays(events)], [({"text/plain": "ok"}, "display/1.png"), ({"text/plain": "bad"}, None)])
        self.assertEqual(blobs(events)[0][1], b"abcd")
        self.assertEqual([e["message"] for e in events if e["type"] == "log"], ["display image left out: not an image type the harness sends"])
        self.assertIn("after\n", [e.get("text") for e in events], "the skipped bytes leave the event stream in step")

    def test_a_script_cannot_forge_chunk_or_artifact_lines(self):
        chunk = {"type": "chunk", "data": "AAAA"}
        artifact = {"type": "artifact", "path": "out/x", "size": 3, "content_type": "text/plain"}
        lines = b"".join((json.dumps(e) + "\n").encode() for e in (artifact, chunk))
        script = "import os, sys\nos.write(%s, %r)\nsys.stdout.write(%r)" % (EVENT_FD, lines, lines.decode())
        events = self.execute("g2", script)
        self.assertEqual([e for e in events if e["type"] in ("artifact", "chunk")], [])
        self.assertEqual(len([e for e in events if e["type"] == "log" and "unknown type" in e["message"]]), 2)

    def test_matplotlib_uses_the_harness_backend_unless_told_otherwise(self):
        events = self.execute("b1", "import os\nemit_result(os.environ.get('MPLBACKEND'))")
        self.assertEqual([e["data"] for e in events if e["type"] == "final_result"], ["module://jazzmine_harness.mpl"])
        h = HarnessProcess(env={"MPLBACKEND": "svg"})
        self.addCleanup(h.close)
        h.send(type="execute", execution_id="b2", script="import os\nemit_result(os.environ.get('MPLBACKEND'))")
        self.assertEqual([e["data"] for e in h.until("script_done") if e["type"] == "final_result"], ["svg"])
        # A plain Agg (an image's or a sandbox env's) is replaced: ours is Agg that displays.
        h = HarnessProcess(env={"MPLBACKEND": "Agg"})
        self.addCleanup(h.close)
        h.send(type="execute", execution_id="b3", script="import os\nemit_result(os.environ.get('MPLBACKEND'))")
        self.assertEqual([e["data"] for e in h.until("script_done") if e["type"] == "final_result"], ["module://jazzmine_harness.mpl"])


@unittest.skipUnless(HAVE_MATPLOTLIB, "matplotlib is not installed")
class MatplotlibTest(unittest.TestCase):
    def setUp(self):
        self.h = HarnessProcess()
        self.addCleanup(self.h.close)

    def execute(self, eid, script):
        self.h.send(type="execute", execution_id=eid, script=script, nonce="n-" + eid, timeout=60)
        return self.h.until("script_done")

    def test_show_displays_the_figure_as_a_png_of_figsize_times_dpi_and_closes_it(self):
        script = """import matplotlib.pyplot as plt
plt.figure(figsize=(4, 3), dpi=50)
plt.plot([1, 2, 3])
plt.show()
emit_result([plt.get_backend(), plt.get_fignums()])
"""
        events = self.execute("m1", script)
        self.assertEqual([e for e in events if e["type"] == "error"], [])
        self.assertEqual([e["data"] for e in events if e["type"] == "final_result"], [["module://jazzmine_harness.mpl", []]])
        ((header, data),) = blobs(events)
        self.assertEqual((header["path"], header["content_type"]), ("display/1.png", "image/png"))
        self.assertEqual(header["data"], {"text/plain": "<Figure size 200x150 with 1 Axes>"})
        self.assertEqual(png_size(data), (200, 150))

    def test_figures_left_open_are_displayed_at_the_end_in_number_order(self):
        script = """import matplotlib.pyplot as plt
plt.figure(2, figsize=(2, 1), dpi=100)
plt.figure(1, figsize=(1, 1), dpi=30)
plt.plot([1])
emit_result("done")
raise RuntimeError("after the result")
"""
        events = self.execute("m2", script)
        self.assertEqual([e["kind"] for e in events if e["type"] == "error"], ["script"])
        self.assertEqual([(h["path"], png_size(data)) for h, data in blobs(events)], [("display/1.png", (30, 30)), ("display/2.png", (200, 100))])
        types = [e["type"] for e in events]
        self.assertLess(types.index("final_result"), types.index("display"))

    def test_display_of_a_figure_made_without_pyplot(self):
        script = "from matplotlib.figure import Figure\nfig = Figure(figsize=(2, 2), dpi=25)\nfig.add_subplot().plot([1, 2])\ndisplay(fig)\nemit_result(1)"
        events = self.execute("m3", script)
        self.assertEqual([png_size(data) for _, data in blobs(events)], [(50, 50)])


@unittest.skipUnless(importlib.util.find_spec("pandas") is not None, "pandas is not installed")
class PandasTest(unittest.TestCase):
    def test_a_dataframe_gives_its_repr_and_its_html(self):
        h = HarnessProcess()
        self.addCleanup(h.close)
        h.send(type="execute", execution_id="p1", script="import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndisplay(df)\nemit_result([repr(df), df._repr_html_()])", timeout=60)
        events = h.until("script_done")
        (want,) = [e["data"] for e in events if e["type"] == "final_result"]
        self.assertEqual([d["data"] for d in events if d["type"] == "display"], [{"text/plain": want[0], "text/html": want[1]}])
        self.assertIn("<table", want[1])


if __name__ == "__main__":
    unittest.main()
