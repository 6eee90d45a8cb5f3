"""Tests of jazzmine_harness.egress, the egress relay: a real harness process whose
children relay 127.0.0.1:<port> to a Unix socket that stands in for the egress proxy.
Run with `make test-python`."""

import os
import socket
import tempfile
import threading
import unittest

from harness_process import HarnessProcess

# The script of an execution: sends n bytes through the relay, half-closes, and
# reports whether it read them back followed by the stand-in proxy's "|END".
ROUND_TRIP = """
import socket, threading
c = socket.create_connection(("127.0.0.1", %(port)d), timeout=20)
payload = bytes(range(256)) * (%(n)d // 256)
def send():
    c.sendall(payload)
    c.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send)
t.start()
got = bytearray()
while True:
    b = c.recv(65536)
    if not b:
        break
    got += b
t.join()
emit_result({"echoed": bytes(got) == payload + b"|END", "bytes": len(got)})
"""

# The script of an execution: sends a proxy request and returns the whole answer.
ASK = """
import socket
c = socket.create_connection(("127.0.0.1", %(port)d), timeout=20)
c.sendall(b"CONNECT example.test:443 HTTP/1.1\\r\\nHost: example.test:443\\r\\n\\r\\n")
out = b""
while True:
    b = c.recv(4096)
    if not b:
        break
    out += b
emit_result(out.decode())
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class EchoProxy:
    """A Unix socket server that echoes what it reads and, at its end, sends "|END"."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(c,), daemon=True).start()

    def _echo(self, c):
        with c:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                c.sendall(b)
            c.sendall(b"|END")

    def close(self):
        self.sock.close()


class EgressRelayTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "proxy.sock")
        self.port = free_port()

    def harness(self, **env):
        h = HarnessProcess(env=env)
        self.addCleanup(h.close)
        return h

    def run_script(self, h, eid, script):
        h.send(type="execute", execution_id=eid, script=script, timeout=30)
        events = h.until("script_done")
        results = [e["data"] for e in events if e["type"] == "final_result"]
        self.assertEqual(len(results), 1, events)
        return results[0], events

    def test_every_execution_reaches_the_socket_through_its_port_both_ways(self):
        proxy = EchoProxy(self.path)
        self.addCleanup(proxy.close)
        h = self.harness(JAZZMINE_EGRESS_SOCKET=self.path, JAZZMINE_EGRESS_PORT=str(self.port))
        # Two executions: the second child binds the port the first one held. A
        # megabyte is more than the relay holds each way, so it must wait for its
        # reader; the half-close reaches the proxy, whose answer follows it.
        for i, n in enumerate((1 << 20, 1 << 20)):
            result, _ = self.run_script(h, "r%d" % i, ROUND_TRIP % {"port": self.port, "n": n})
            self.assertEqual(result, {"echoed": True, "bytes": n + 4}, "execution %d" % i)
        self.assertEqual(proxy.accepted, 2)

    def test_an_unreachable_proxy_is_a_502_that_names_the_socket(self):
        h = self.harness(JAZZMINE_EGRESS_SOCKET=self.path, JAZZMINE_EGRESS_PORT=str(self.port))
        result, _ = self.run_script(h, "u1", ASK % {"port": self.port})
        self.assertTrue(result.startswith("HTTP/1.1 502 Bad Gateway\r\n"), result)
        self.assertIn("the egress proxy at %s is unreachable: No such file or directory" % self.path, result)

    def test_without_an_egress_socket_nothing_listens(self):
        env = {"JAZZMINE_EGRESS_PORT": str(self.port)}
        os.environ.pop("JAZZMINE_EGRESS_SOCKET", None)
        h = self.harness(**env)
        result, _ = self.run_script(h, "n1", """
import socket
try:
    socket.create_connection(("127.0.0.1", %d), timeout=5).close()
    emit_result("connected")
except OSError as e:
    emit_result(type(e).__name__)
""" % self.port)
        self.assertEqual(result, "ConnectionRefusedError")

    def test_a_port_in_use_is_reported_on_stderr_and_the_script_still_runs(self):
        squatter = socket.socket()
        squatter.bind(("127.0.0.1", self.port))
        squatter.listen(1)
        self.addCleanup(squatter.close)
        h = self.harness(JAZZMINE_EGRESS_SOCKET=self.path, JAZZMINE_EGRESS_PORT=str(self.port))
        result, events = self.run_script(h, "p1", "emit_result('ran')")
        self.assertEqual(result, "ran")
        stderr = "".join(e["text"] for e in events if e["type"] == "stderr")
        self.assertIn("jazzmine: no egress relay on 127.0.0.1:%d: [Errno 98] Address already in use" % self.port, stderr)


if __name__ == "__main__":
    unittest.main()
