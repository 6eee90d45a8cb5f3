"""Input files (jazzmine_harness.inputs) over a real harness process: the file and chunk
lines before an execute, and the input_file error that stops it. Run with `make
test-python`."""

import base64
import hashlib
import os
import tempfile
import unittest

from harness_process import HarnessProcess, HarnessTest

# What a script reports of the workspace's files: path -> [sha256, mode].
LIST = """import hashlib, os
seen = {}
for d, _, names in os.walk("."):
    for n in names:
        p = os.path.join(d, n)[2:]
        seen[p] = [hashlib.sha256(open(p, "rb").read()).hexdigest(), oct(os.stat(p).st_mode & 0o7777)]
emit_result(seen)
"""


def sha(data):
    return hashlib.sha256(data).hexdigest()


class InputFilesTest(HarnessTest):
    def result(self, events):
        return [e["data"] for e in events if e["type"] == "final_result"]

    def errors(self, events):
        return [(e["kind"], e["error"]) for e in events if e["type"] == "error"]

    def test_files_are_written_with_their_bytes_and_modes_before_the_script_runs(self):
        big = os.urandom(500_000)  # three chunks
        self.h.send_file("f1", "data/sales.csv", b"a,b\n1,2\n")
        self.h.send_file("f1", "data/deep/er/big.bin", big, mode=0o600)
        self.h.send_file("f1", "run.sh", b"#!/bin/sh\n", mode=0o755)
        self.h.send_file("f1", "empty", b"", mode=0o444)
        events = self.execute("f1", LIST)
        self.assertEqual(self.errors(events), [])
        self.assertEqual(self.result(events), [{
            "data/sales.csv": [sha(b"a,b\n1,2\n"), "0o644"],
            "data/deep/er/big.bin": [sha(big), "0o600"],
            "run.sh": [sha(b"#!/bin/sh\n"), "0o755"],
            "empty": [sha(b""), "0o444"],
        }])

    def test_a_null_mode_is_the_default_mode(self):
        self.h.send(type="file", execution_id="n1", path="x", size=0, mode=None)
        events = self.execute("n1", "import os\nemit_result(oct(os.stat('x').st_mode & 0o777))")
        self.assertEqual(self.result(events), ["0o644"])

    def test_the_directories_made_on_the_way_are_0o755(self):
        self.h.send_file("d1", "a/b/c.txt", b"x")
        events = self.execute("d1", "import os\nemit_result([oct(os.stat(p).st_mode & 0o777) for p in ('a', 'a/b')])")
        self.assertEqual(self.result(events), [["0o755", "0o755"]])

    def assertRefused(self, eid, reason):
        """The execute of eid does not run its script: an input_file error saying reason."""
        events = self.execute(eid, "print('the script ran')\nemit_result(1)")
        self.assertEqual(self.errors(events), [("input_file", reason)])
        self.assertEqual([e["type"] for e in events], ["error", "script_done"], events)
        self.assertEqual(os.listdir(self.h.workspace), [], "the reset after it wipes what was written")

    def test_a_chunk_that_is_not_base64_stops_the_script(self):
        self.h.send(type="file", execution_id="b1", path="data/x.csv", size=4)
        self.h.send(type="chunk", execution_id="b1", data="!!!!")
        self.assertRefused("b1", "input file data/x.csv: a chunk that is not base64")

    def test_more_bytes_than_announced_stop_the_script(self):
        self.h.send(type="file", execution_id="m1", path="x", size=2)
        self.h.send(type="chunk", execution_id="m1", data=base64.b64encode(b"abc").decode())
        self.assertRefused("m1", "input file x: more bytes than announced")

    def test_fewer_bytes_than_announced_stop_the_script_at_the_next_file_or_execute(self):
        self.h.send(type="file", execution_id="s1", path="short", size=10)
        self.h.send(type="chunk", execution_id="s1", data=base64.b64encode(b"abc").decode())
        self.assertRefused("s1", "input file short: 7 bytes fewer than announced")
        self.h.send(type="file", execution_id="s2", path="first", size=10)
        self.h.send_file("s2", "second", b"fine")
        self.assertRefused("s2", "input file first: 10 bytes fewer than announced")

    def test_a_chunk_over_196608_bytes_stops_the_script(self):
        self.h.send(type="file", execution_id="k1", path="big", size=196609)
        self.h.send(type="chunk", execution_id="k1", data=base64.b64encode(bytes(196609)).decode())
        self.assertRefused("k1", "input file big: a chunk of 196609 bytes, over 196608")

    def test_a_chunk_with_no_file_open_stops_the_script(self):
        self.h.send_file("c1", "done.txt", b"ab")
        self.h.send(type="chunk", execution_id="c1", data=base64.b64encode(b"c").decode())
        self.assertRefused("c1", "input file done.txt: a chunk with no file open")

    def test_paths_the_host_should_have_refused_are_refused_again(self):
        for i, (path, reason) in enumerate([
            ("../escape", "an empty, '.' or '..' component"),
            ("/etc/passwd", "an absolute path"),
            ("a//b", "an empty, '.' or '..' component"),
            ("a/./b", "an empty, '.' or '..' component"),
            ("nul\x00", "a NUL in the path"),
            ("x" * 256, "a component over 255 bytes"),
            ("/".join(["abcdefghi"] * 103), "a path over 1024 bytes"),
        ]):
            self.h.send_file("p%d" % i, path, b"x")
            self.assertRefused("p%d" % i, "input file %s: %s" % (path, reason))

    def test_the_same_path_twice_is_an_error(self):
        self.h.send_file("t1", "twice", b"1")
        self.h.send_file("t1", "twice", b"2")
        self.assertRefused("t1", "input file twice: already exists")

    def test_files_for_another_execution_are_an_error(self):
        self.h.send_file("other", "x", b"1")
        self.assertRefused("mine", "input file x: sent for execution other, not mine")

    def test_an_error_is_for_one_execute_only(self):
        self.h.send(type="chunk", execution_id="o1", data="AA==")
        self.assertRefused("o1", "input file (none): a chunk with no file open")
        self.h.send_file("o2", "ok.txt", b"fine")
        self.assertEqual(self.result(self.execute("o2", "emit_result(open('ok.txt').read())")), ["fine"])

    def test_a_reset_discards_the_inputs(self):
        self.h.send(type="file", execution_id="r1", path="half", size=10)
        self.h.send(type="reset", nonce="n-reset")
        self.assertEqual(self.h.read(), {"type": "reset_done", "nonce": "n-reset"})
        self.assertEqual(os.listdir(self.h.workspace), [])
        self.assertEqual(self.result(self.execute("r2", "import os\nemit_result(os.listdir('.'))")), [[]])

    def test_a_link_in_the_workspace_is_not_followed(self):
        # Nothing of a script's outlives the reset; were one to plant a link anyway,
        # the write does not pass through it.
        with tempfile.TemporaryDirectory() as outside:
            os.symlink(outside, os.path.join(self.h.workspace, "data"))
            os.symlink(os.path.join(outside, "f"), os.path.join(self.h.workspace, "f"))
            self.h.send_file("l1", "data/x.csv", b"x")
            self.assertRefused("l1", "input file data/x.csv: a component of its path is not a directory")
            self.assertEqual(os.listdir(outside), [])
            os.symlink(os.path.join(outside, "f"), os.path.join(self.h.workspace, "f"))
            self.h.send_file("l2", "f", b"x")
            self.assertRefused("l2", "input file f: already exists")
            self.assertEqual(os.listdir(outside), [])


class NoWorkspaceTest(unittest.TestCase):
    def test_inputs_without_a_workspace_are_an_error(self):
        h = HarnessProcess(env={"JAZZMINE_WORKSPACE": ""})
        self.addCleanup(h.close)
        h.send_file("w1", "x", b"1")
        h.send(type="execute", execution_id="w1", script="print('ran')", nonce="n")
        events = h.until("script_done")
        self.assertEqual([(e["type"], e.get("kind"), e.get("error")) for e in events[:-1]],
                         [("error", "input_file", "input file x: the harness has no workspace")])


if __name__ == "__main__":
    unittest.main()
