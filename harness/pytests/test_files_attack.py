"""Attacks on the files feature at the harness (input files, artifacts, display), by a
script that has read the harness. Each test pins a property that held under attack.
Run with `make test-python`."""

import unittest

from harness_process import HarnessTest, blobs


class FilesAttackTest(HarnessTest):
    def artifacts(self, events):
        return {h["path"]: data for h, data in blobs(events) if h["type"] == "artifact"}

    def test_a_leftover_daemon_swapping_links_and_directories_carries_nothing_out(self):
        # A daemon (setsid, double fork) swaps out/f between a regular file and a link to
        # /etc/passwd, and out/d between a directory and a link to /etc, as fast as it
        # can: were it alive while the harness walked and read, a check-then-open would
        # lose the race now and then. It is killed before the walk.
        script = """import os, time
os.makedirs("out/d")
open("out/d/x", "w").write("mine")
open("out/f", "w").write("mine")
os.symlink("/etc/passwd", "lnk")
os.symlink("/etc", "dlnk")
os.makedirs("spare")
open("spare/x", "w").write("mine")
open("reg", "w").write("mine")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            for a, b in (("lnk", "out/f"), ("reg", "out/f"), ("dlnk", "out/d"), ("spare", "out/d")):
                try:
                    os.rename(b, a + ".old")
                    os.rename(a, b)
                    os.rename(a + ".old", a)
                except OSError:
                    pass
    os._exit(0)
time.sleep(0.3)
emit_result(1)
"""
        with open("/etc/passwd", "rb") as f:
            passwd = f.read()
        for i in range(5):
            got = self.artifacts(self.execute("sw%d" % i, script, timeout=10))
            for path, data in got.items():
                self.assertEqual(data, b"mine", "%s carried %r out" % (path, data[:40]))
                self.assertNotEqual(data, passwd)

    def test_names_with_newlines_and_invalid_utf8(self):
        script = "import os\nos.makedirs('out')\nopen(b'out/bad\\xff', 'w').write('x')\nopen('out/new\\nline\\r\\u2028', 'w').write('y')\nemit_result(1)"
        events = self.execute("n1", script)
        self.assertEqual(self.artifacts(events), {"out/new\nline\r\u2028": b"y"})
        self.assertEqual([e["message"] for e in events if e["type"] == "log"], ["artifact out/bad\\udcff skipped: not valid UTF-8"])

    def test_display_reprs_that_lie_raise_or_return_odd_types(self):
        # _repr_mimebundle_ returning non-dicts, keys that are not strings, image
        # forms under text types, a repr returning bytes: nothing but strings reaches
        # the host, under MIME-like names, and the script goes on.
        script = """class Odd:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {1: "x", "text/html": b"bytes", "image/png": 12, "text/markdown": "ok", "application/json": {"a": 1}, "evil": "no slash"}
class Raises:
    def _repr_html_(self):
        raise RuntimeError("nope")
    def _repr_png_(self):
        return "not base64 !!"
display(Odd(), Raises())
class BadRepr:
    def __repr__(self):
        return b"bytes"
try:
    display(BadRepr())
except TypeError:
    print("refused")
emit_result(1)
"""
        events = self.execute("r1", script)
        displays = [e for e in events if e["type"] == "display"]
        self.assertEqual(len(displays), 2)
        for d in displays:
            self.assertNotIn("path", d)
            for k, v in d["data"].items():
                self.assertIsInstance(v, str)
                self.assertIn("/", k)
        self.assertEqual(displays[0]["data"].get("text/markdown"), "ok")
        self.assertEqual(displays[0]["data"].get("application/json"), '{"a":1}')
        self.assertIn("refused\n", [e.get("text") for e in events])
        self.assertEqual([e["kind"] for e in events if e["type"] == "error"], [])


if __name__ == "__main__":
    unittest.main()
