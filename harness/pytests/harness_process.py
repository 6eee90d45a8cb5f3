"""What the tests share: the harness's package on the path, and a real harness
process driven over its stdin and stdout."""

import json
import os
import subprocess
import sys
import tempfile

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
