"""Artifacts (jazzmine_harness.artifacts) over a real harness process: what a script
leaves in out/ and at the requested paths, played by a script that wants to read what
is not its own or to hang the harness. Run with `make test-python`."""

import time
import unittest

from harness_process import HarnessTest, blobs


class ArtifactsTest(HarnessTest):
    def artifacts(self, events):
        return {h["path"]: (data, h["content_type"]) for h, data in blobs(events) if h["type"] == "artifact"}

    def warnings(self, events):
        return [e["message"] for e in events if e["type"] == "log" and e["level"] == "warning"]

    def test_out_and_the_requested_paths_come_out_with_their_bytes_in_order_once_each(self):
        script = """import os
os.makedirs("out/sub")
open("out/chart.png", "wb").write(b"\\x89PNG" + bytes(range(256)) * 2000)
open("out/sub/notes.txt", "w").write("notes")
open("out/empty", "w").close()
open("report.md", "w").write("# report")
os.makedirs("results/deeper")
open("results/deeper/r.json", "w").write("{}")
open("not-asked.txt", "w").write("x")
emit_result(1)
"""
        events = self.execute("a1", script, artifacts=["report.md", "results", "out/sub/notes.txt", "missing/file"])
        self.assertEqual([e for e in events if e["type"] == "error"], [])
        headers = [e["path"] for e in events if e["type"] == "artifact"]
        self.assertEqual(headers, ["out/chart.png", "out/empty", "out/sub/notes.txt", "report.md", "results/deeper/r.json"])
        got = self.artifacts(events)
        self.assertEqual(got["out/chart.png"], (b"\x89PNG" + bytes(range(256)) * 2000, "image/png"))
        self.assertEqual(got["out/sub/notes.txt"], (b"notes", "text/plain"))
        self.assertEqual(got["out/empty"], (b"", "application/octet-stream"))
        self.assertEqual(got["report.md"][0], b"# report")
        self.assertEqual(got["results/deeper/r.json"], (b"{}", "application/json"))
        # A missing requested path is skipped silently; a file written outside out/ and
        # not asked for is said not to come back.
        self.assertEqual(len(self.warnings(events)), 1, self.warnings(events))
        self.assertTrue(self.warnings(events)[0].startswith("not returned: not-asked.txt, written outside "), self.warnings(events))
        chunks = [e for e in events if e["type"] == "chunk"]
        self.assertEqual(len(chunks), 6, "out/chart.png (512004 bytes) in 3 chunks, one for each small file, none for the empty one")
        self.assertEqual(events[-2]["type"], "chunk", "artifacts come after the result, before script_done")

    def test_links_out_of_the_workspace_yield_no_file(self):
        script = """import os
os.makedirs("out")
os.symlink("/etc/passwd", "out/passwd")
os.symlink("/etc", "out/etc")
os.symlink("/etc", "asked")
os.symlink("/etc/hostname", "hostname")
emit_result(1)
"""
        events = self.execute("l1", script, artifacts=["asked/passwd", "asked", "hostname"])
        with open("/etc/passwd", "rb") as f:
            passwd = f.read()
        self.assertNotIn(passwd, [data for data, _ in self.artifacts(events).values()])
        self.assertEqual(sorted(self.artifacts(events)), [])
        self.assertEqual(self.warnings(events), [
            "artifact out/etc skipped: a symbolic link",
            "artifact out/passwd skipped: a symbolic link",
            "artifact asked/passwd skipped: asked is a symbolic link",
            "artifact asked skipped: a symbolic link",
            "artifact hostname skipped: a symbolic link",
        ])

    def test_out_itself_a_link_yields_nothing(self):
        events = self.execute("l2", "import os\nos.symlink('/etc', 'out')\nemit_result(1)")
        self.assertEqual(self.artifacts(events), {})
        self.assertEqual(self.warnings(events), ["artifact out skipped: a symbolic link"])

    def test_a_fifo_does_not_block_the_harness_and_yields_no_file(self):
        started = time.monotonic()
        events = self.execute("f1", "import os, socket\nos.makedirs('out')\nos.mkfifo('out/pipe')\nopen('out/after.txt', 'w').write('ok')\nsocket.socket(socket.AF_UNIX).bind('out/sock')\nemit_result(1)")
        self.assertLess(time.monotonic() - started, 5)
        self.assertEqual(self.artifacts(events), {"out/after.txt": (b"ok", "text/plain")})
        self.assertEqual(self.warnings(events), ["artifact out/pipe skipped: a FIFO", "artifact out/sock skipped: a socket"])

    def test_directories_nest_at_most_32_deep(self):
        script = "import os\nd = 'out/' + '/'.join('d%d' % i for i in range(31))\nos.makedirs(d + '/d31')\nopen(d + '/at32.txt', 'w').write('in')\nopen(d + '/d31/at33.txt', 'w').write('out')\nemit_result(1)"
        events = self.execute("d1", script)
        self.assertEqual([p.rsplit("/", 1)[1] for p in self.artifacts(events)], ["at32.txt"])
        self.assertEqual(len(self.warnings(events)), 1)
        self.assertIn("nested over 32 deep", self.warnings(events)[0])

    def test_too_many_files_give_artifact_limit_and_no_artifact(self):
        events = self.execute("c1", "import os\nos.makedirs('out')\nfor i in range(3):\n    open('out/%d' % i, 'w').write('x')\nemit_result(1)", max_artifacts=2)
        self.assertEqual([(e["kind"], e["error"]) for e in events if e["type"] == "error"], [("artifact_limit", "artifacts: at least 3 files, at most 2 are allowed")])
        self.assertEqual([e["type"] for e in events if e["type"] in ("artifact", "chunk")], [])

    def test_the_walk_stops_one_file_past_the_limit(self):
        # 2,000 files and a limit of 2: the walk stops at the third (it does not count
        # them all, which a script could make take seconds), and says so.
        events = self.execute("c2", "import os\nos.makedirs('out')\nfor i in range(2000):\n    open('out/%04d' % i, 'w').close()\nemit_result(1)", max_artifacts=2)
        self.assertEqual([(e["kind"], e["error"]) for e in events if e["type"] == "error"], [("artifact_limit", "artifacts: at least 3 files, at most 2 are allowed")])

    def test_files_larger_than_the_workspace_holds_are_not_stored(self):
        # A sparse file takes no space: truncate() to more than the workspace's size.
        events = self.execute("sp", "import os\nos.makedirs('out')\nst = os.statvfs('.')\nwith open('out/zeros', 'wb') as f:\n    f.truncate(st.f_blocks * st.f_frsize + 1)\nemit_result(1)", max_artifact_bytes=1 << 40)
        errors = [(e["kind"], e["error"]) for e in events if e["type"] == "error"]
        self.assertEqual([k for k, _ in errors], ["artifact_limit"])
        self.assertIn("more than the workspace holds", errors[0][1])
        self.assertEqual([e["type"] for e in events if e["type"] in ("artifact", "chunk")], [])

    def test_too_many_bytes_give_artifact_limit_and_no_artifact(self):
        events = self.execute("s1", "import os\nos.makedirs('out')\nopen('out/a', 'wb').write(b'x' * 600)\nopen('big', 'wb').write(b'x' * 600)\nemit_result(1)", max_artifact_bytes=1000, artifacts=["big"])
        self.assertEqual([(e["kind"], e["error"]) for e in events if e["type"] == "error"], [("artifact_limit", "artifacts: 1200 bytes, at most 1000 are allowed")])
        self.assertEqual([e["type"] for e in events if e["type"] in ("artifact", "chunk")], [])

    def test_display_images_count_in_the_limits(self):
        script = "class I:\n    def _repr_png_(self):\n        return b'png'\ndisplay(I())\nimport os\nos.makedirs('out')\nopen('out/a', 'w').write('x')\nemit_result(1)"
        events = self.execute("i1", script, max_artifacts=1)
        self.assertEqual([h["path"] for h, _ in blobs(events)], ["display/1.png"])
        self.assertEqual([(e["kind"], e["error"]) for e in events if e["type"] == "error"], [("artifact_limit", "artifacts: at least 2 files, at most 1 are allowed")])

    def test_a_cancelled_execution_sends_no_artifacts(self):
        self.h.send(type="execute", execution_id="x1", nonce="n-x1", script="import os, time\nos.makedirs('out')\nopen('out/a', 'w').write('x')\nprint('go', flush=True)\ntime.sleep(10)")
        self.assertEqual(self.h.read()["text"], "go\n")
        self.h.send(type="cancel", execution_id="x1")
        events = self.h.until("script_done")
        self.assertEqual([e["kind"] for e in events if e["type"] == "error"], ["cancelled"])
        self.assertEqual([e for e in events if e["type"] == "artifact"], [])

    def test_a_failed_script_still_sends_its_artifacts(self):
        events = self.execute("e1", "import os\nos.makedirs('out')\nopen('out/log.txt', 'w').write('partial')\nraise ValueError('boom')")
        self.assertEqual([e["kind"] for e in events if e["type"] == "error"], ["script"])
        self.assertEqual(self.artifacts(events), {"out/log.txt": (b"partial", "text/plain")})

    def test_a_leftover_process_cannot_change_a_file_while_it_is_read(self):
        # A daemon the script leaves (setsid, double fork) keeps filling and truncating
        # a file. Every process of the execution is killed before the files are read, so
        # the bytes sent are the size announced (blobs checks it): read while the daemon
        # lived, the file would shrink under the reads.
        script = """import os, time
os.makedirs("out")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        f = open("out/churn.bin", "wb", buffering=0)
        while True:
            for _ in range(64):
                f.write(b"x" * 65536)
            f.truncate(0)
            f.seek(0)
    os._exit(0)
while not os.path.exists("out/churn.bin"):
    time.sleep(0.01)
time.sleep(0.2)
emit_result(1)
"""
        for i in range(3):
            events = self.execute("g%d" % i, script, max_artifact_bytes=1 << 30, timeout=10)
            self.assertEqual(list(self.artifacts(events)), ["out/churn.bin"])


if __name__ == "__main__":
    unittest.main()
