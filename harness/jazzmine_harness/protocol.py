"""The protocol's names and its framing: one JSON object a line, and the parent's
writer of the stream (the only one: see Out)."""

import json
import os

HARNESS_VERSION = "1"

# Request types, host to harness.
EXECUTE = "execute"
CANCEL = "cancel"
RESET = "reset"
PING = "ping"
REQUEST_TYPES = (EXECUTE, CANCEL, RESET, PING)

# Modes of an execute request: what counts as success.
MODE_PLAN = "plan"
MODE_INTERACTIVE = "interactive"
MODES = (MODE_PLAN, MODE_INTERACTIVE)

# Event types, harness to host. All but the last three are also events of the worker's
# on NATS (the Go package wire); the harness's Go test
# TestThePythonHarnessNamesWhatGoNames holds these lists to wire's and the harness's.
INTERMEDIATE = "intermediate"
LOG = "log"
STDOUT = "stdout"
STDERR = "stderr"
FINAL_RESULT = "final_result"
ERROR = "error"
SCRIPT_DONE = "script_done"
READY = "ready"
RESET_DONE = "reset_done"
PONG = "pong"
EVENT_TYPES = (INTERMEDIATE, LOG, STDOUT, STDERR, FINAL_RESULT, ERROR, SCRIPT_DONE, READY, RESET_DONE, PONG)

# Error kinds, the kind of an error event.
KIND_SCRIPT = "script"
KIND_TIMEOUT = "timeout"
KIND_OUTPUT_LIMIT = "output_limit"
KIND_CRASHED = "crashed"
KIND_OOM = "oom"
KIND_CANCELLED = "cancelled"
KIND_MISSING_SECRETS = "missing_secrets"
KIND_INFRASTRUCTURE = "infrastructure"
ERROR_KINDS = (KIND_SCRIPT, KIND_TIMEOUT, KIND_OUTPUT_LIMIT, KIND_CRASHED, KIND_OOM, KIND_CANCELLED, KIND_MISSING_SECRETS, KIND_INFRASTRUCTURE)

# Events a child may send; anything else from the child pipe is dropped.
CHILD_EVENT_TYPES = (INTERMEDIATE, LOG, FINAL_RESULT, ERROR)

# What a child says on its event pipe to its parent alone, never relayed, each a line
# of its own: it has warmed up (WARM), and its script is done (DONE).
WARM = "_warm"
DONE = "_done"
WARM_LINE = b'{"type":"_warm"}\n'
DONE_LINE = b'{"type":"_done"}\n'

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_OUTPUT = 1 << 20

# Protocol output kept before it is written out even without a flush.
OUT_FLUSH_BYTES = 64 * 1024


class Out:
    """Writes protocol lines to fd 1 and counts the bytes written.

    Lines wait in a buffer until flush, which the harness calls before it waits for
    anything: lines that come together, such as a result and the script_done after it,
    leave in one write. Through Docker's attach path each write is a wake-up of the
    shim and of dockerd: a second write a tenth of a millisecond after the first made
    the host see the end of a trivial job 0.5 ms later (measured, median)."""

    def __init__(self, fd):
        self.fd = fd
        self.written = 0
        self.buf = bytearray()

    def send(self, event):
        line = encode(event)
        self.write(line)
        return len(line)

    def write(self, data):
        self.buf += data
        self.written += len(data)
        if len(self.buf) >= OUT_FLUSH_BYTES:
            self.flush()

    def flush(self):
        if not self.buf:
            return
        view = memoryview(bytes(self.buf))
        self.buf.clear()
        while view:
            try:
                n = os.write(self.fd, view)
            except InterruptedError:
                continue
            view = view[n:]


def timed_out(timeout):
    """The error of a script that ran out of its timeout, in seconds."""
    return "Script timed out after %gs" % timeout


def encode(event):
    return (json.dumps(event, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8", "surrogatepass")


def encoded_len(event):
    return len(encode(event))


def protocol_fds():
    """Moves the protocol stream off fds 0 and 1 to descriptors of its own, and puts
    /dev/null on 0 and stderr on 1: what a tool prints at import, or a library writes
    to stdout, goes to the container's log instead of into the protocol."""
    in_fd, out_fd = os.dup(0), os.dup(1)  # not inheritable: no exec'd program gets them
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return in_fd, out_fd
