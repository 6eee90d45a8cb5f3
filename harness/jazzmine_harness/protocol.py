"""The protocol's names and its framing: one JSON object a line, and the parent's
writer of the stream (the only one: see Out)."""

import json
import os
import re

HARNESS_VERSION = "3"

# Request types, host to harness.
EXECUTE = "execute"
CANCEL = "cancel"
RESET = "reset"
PING = "ping"
# An input file of the next execute (path, mode, size), and a piece of its bytes: the
# chunk line is the same both ways (see CHUNK below).
FILE = "file"
CHUNK = "chunk"
REQUEST_TYPES = (EXECUTE, CANCEL, RESET, PING, FILE, CHUNK)

# Modes of an execute request: what counts as success.
MODE_PLAN = "plan"
MODE_INTERACTIVE = "interactive"
MODES = (MODE_PLAN, MODE_INTERACTIVE)

# Event types, harness to host. All but the last four are also events of the worker's
# on NATS (the Go package wire); the harness's Go test
# TestThePythonHarnessNamesWhatGoNames holds these lists to wire's and the harness's.
# A display or artifact line that names a size is followed at once by its bytes, as
# chunk lines (CHUNK, base64, at most CHUNK_DATA_BYTES decoded bytes each) adding up to
# it, with nothing between them.
INTERMEDIATE = "intermediate"
LOG = "log"
STDOUT = "stdout"
STDERR = "stderr"
FINAL_RESULT = "final_result"
ERROR = "error"
SCRIPT_DONE = "script_done"
DISPLAY = "display"
EXECUTE_RESULT = "execute_result"
ARTIFACT = "artifact"
READY = "ready"
RESET_DONE = "reset_done"
PONG = "pong"
EVENT_TYPES = (INTERMEDIATE, LOG, STDOUT, STDERR, FINAL_RESULT, ERROR, SCRIPT_DONE, DISPLAY, EXECUTE_RESULT, ARTIFACT, READY, RESET_DONE, PONG, CHUNK)

# Error kinds, the kind of an error event.
KIND_SCRIPT = "script"
KIND_TIMEOUT = "timeout"
KIND_OUTPUT_LIMIT = "output_limit"
KIND_CRASHED = "crashed"
KIND_OOM = "oom"
KIND_CANCELLED = "cancelled"
KIND_MISSING_SECRETS = "missing_secrets"
KIND_INFRASTRUCTURE = "infrastructure"
KIND_INPUT_FILE = "input_file"  # an input file could not be written: the script did not run
KIND_ARTIFACT_LIMIT = "artifact_limit"  # the artifacts passed max_artifacts or max_artifact_bytes
KIND_SESSION_LOST = "session_lost"  # the session's process was killed or died: the script did not run
KIND_SESSION_LIMIT = "session_limit"  # the worker's alone (too many sessions); named here for the names test
ERROR_KINDS = (
    KIND_SCRIPT,
    KIND_TIMEOUT,
    KIND_OUTPUT_LIMIT,
    KIND_CRASHED,
    KIND_OOM,
    KIND_CANCELLED,
    KIND_MISSING_SECRETS,
    KIND_INFRASTRUCTURE,
    KIND_INPUT_FILE,
    KIND_ARTIFACT_LIMIT,
    KIND_SESSION_LOST,
    KIND_SESSION_LIMIT,
)

# Events a child may send; anything else from the child pipe is dropped.
# A display or execute_result line from the child may be followed by raw image bytes:
# see display.Pending.
CHILD_EVENT_TYPES = (INTERMEDIATE, LOG, FINAL_RESULT, ERROR, DISPLAY, EXECUTE_RESULT)

# What a non-finite float is called in the nonfinite list of an event's data (see
# values): the place of each, for the host to put the float back in msgpack.
NONFINITE = ("nan", "inf", "-inf")

# What a child says on its event pipe to its parent alone, never relayed, each a line
# of its own: it has warmed up (WARM), and its script is done (DONE).
WARM = "_warm"
DONE = "_done"
WARM_LINE = b'{"type":"_warm"}\n'
DONE_LINE = b'{"type":"_done"}\n'

# The error of a plan-mode script that gave no result, and what to do about it (held to
# Go's harness.ErrNoResult and harness.NoResultHint by a Go test).
NO_RESULT = "Script finished without a result (plan mode requires one)"
NO_RESULT_HINT = "End the script with an expression: its value is the result, as the last line of a notebook cell is shown. Or call emit_result(value)."

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_OUTPUT = 1 << 20
DEFAULT_MAX_ARTIFACTS = 64
DEFAULT_MAX_ARTIFACT_BYTES = 64 << 20

# Most decoded bytes a chunk line carries, both ways.
CHUNK_DATA_BYTES = 196608

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
    """event as a protocol line: JSON, UTF-8, one line. What JSON or UTF-8 cannot carry
    (a lone surrogate, a non-finite float: from a child's line, which json.loads takes)
    is made what it can (sanitize), never a line the host would refuse."""
    try:
        return (_dumps(event, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return (_dumps(sanitize(event, 0), ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")


_dumps = json.dumps  # the harness's own: a module never looked up again

# Deepest nesting sanitize keeps; deeper values become null.
SANITIZE_DEPTH = 300


def sanitize(v, depth):
    """v, a value json.loads made, with lone surrogates escaped as text (see
    values.escape_surrogates), non-finite floats and what nests deeper than
    SANITIZE_DEPTH made null."""
    if isinstance(v, str):
        return escape_surrogates(v)
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if depth >= SANITIZE_DEPTH and isinstance(v, (list, dict)):
        return None
    if isinstance(v, list):
        return [sanitize(x, depth + 1) for x in v]
    if isinstance(v, dict):
        return {sanitize(str(k), depth): sanitize(x, depth + 1) for k, x in v.items()}
    return v


_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(s):
    """s with each lone surrogate (U+D800 to U+DFFF, which UTF-8 cannot carry) replaced
    by the six characters of its escape: "\\udc80"."""
    return _SURROGATE.sub(_escape, s)


def _escape(m):
    return "\\u%04x" % ord(m.group())


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
