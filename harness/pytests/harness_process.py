"""What the tests share: the harness's package on the path, and a real harness
process driven over its stdin and stdout."""

import base64
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
# The directory that holds the package jazzmine_harness, as /opt/jazzmine in an image.
HARNESS_DIR = os.path.dirname(HERE)
PACKAGE_DIR = os.path.join(HARNESS_DIR, "jazzmine_harness")
if HARNESS_DIR not in sys.path:
    sys.path.insert(0, HARNESS_DIR)

# How an image starts the harness (imagebuild's Entrypoint, harness.Command in Go).
COMMAND = [sys.executable, "-u", "-B", "-P", "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); import jazzmine_harness; jazzmine_harness.main()", HARNESS_DIR]


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
        self.p = subprocess.Popen(COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=e)
        self.ready = self.read()

    def send(self, **req):
        self.p.stdin.write((json.dumps(req) + "\n").encode())
        self.p.stdin.flush()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise EOFError("harness closed its stdout")
        return json.loads(line)

    def send_file(self, eid, path, data, mode=None, piece=196608):
        """Sends an input file of the next execute: its file line, then its chunks."""
        line = {"type": "file", "execution_id": eid, "path": path, "size": len(data)}
        if mode is not None:
            line["mode"] = mode
        self.send(**line)
        for i in range(0, len(data), piece):
            self.send(type="chunk", execution_id=eid, data=base64.b64encode(data[i : i + piece]).decode())

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


def blobs(events):
    """The display and artifact lines of events that name a size, each with the bytes of
    the chunk lines that follow it. Raises AssertionError where the protocol says
    otherwise: a chunk not right after its line or another chunk, a chunk over 196608
    bytes, or bytes that do not add up to the size."""
    out, current = [], None
    for ev in events:
        if ev["type"] == "chunk":
            if current is None:
                raise AssertionError("a chunk line with no display or artifact line before it")
            piece = base64.b64decode(ev["data"], validate=True)
            if not 0 < len(piece) <= 196608:
                raise AssertionError("a chunk of %d bytes" % len(piece))
            current[1].extend(piece)
            continue
        if current is not None and len(current[1]) != current[0]["size"]:
            raise AssertionError("%s: %d bytes for size %d" % (current[0]["path"], len(current[1]), current[0]["size"]))
        current = None
        if ev["type"] in ("display", "artifact") and "size" in ev:
            current = (ev, bytearray())
            out.append(current)
    if current is not None and len(current[1]) != current[0]["size"]:
        raise AssertionError("%s: %d bytes for size %d" % (current[0]["path"], len(current[1]), current[0]["size"]))
    return [(header, bytes(data)) for header, data in out]


class HarnessTest(unittest.TestCase):
    """A test against one real harness process. execute() runs a request to its
    script_done, which must carry the execute's nonce, and checks the reset_done that
    follows. REQUEST holds fields every execute of the class gets."""

    REQUEST = {}

    def setUp(self):
        self.h = HarnessProcess()
        self.addCleanup(self.h.close)

    def execute(self, eid, script, **kw):
        self.h.send(type="execute", execution_id=eid, script=script, nonce="n-" + eid, **dict(self.REQUEST, **kw))
        events = self.h.until("script_done")
        self.assertEqual(events[-1]["nonce"], "n-" + eid)
        self.assertEqual(self.h.read(), {"type": "reset_done", "nonce": "n-" + eid})
        return events
