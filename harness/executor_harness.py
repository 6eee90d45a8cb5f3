#!/usr/bin/env python3
"""jazzmine executor harness: the long-lived process inside every sandbox container.

Protocol (one JSON object a line):
  host -> harness on stdin:  execute, cancel, reset, ping
  harness -> host on stdout: ready, intermediate, log, stdout, stderr, final_result,
                             error, script_done, reset_done, pong

The script's author is the attacker (docs/SECURITY.md, the trust model): they have
read this file and run code as our uid until the timeout.

Three kinds of process:
  - the harness (this one): speaks the protocol and supervises; never runs a script and,
    once started, never forks. In a container it is PID 1, not dumpable, with no signal
    handler, and holds the protocol on descriptors of its own (see _protocol_fds), so no
    script can signal it, trace it or reach the stream;
  - the zygote, forked once after the tools are loaded: it only forks children, so the
    memory every child inherits stays as the harness left it (see _zygote_main);
  - a child per execute, forked ahead of its request and warmed up, in its own session,
    so nothing a script does to modules, globals, threads, signal handlers or the working
    directory survives into the next execution.
The harness is the only writer of the protocol stream: a child's events and output reach
it through pipes and it stamps each with the execution id; script_done, reset_done and
pong carry the nonce of the request they answer, which no child ever sees. After every
execute it kills what the execution left, checks that nothing it cannot undo was changed
(the zygote's limits, a tree too deep to wipe: see Retire), wipes the scratch
directories, has the next child forked and warmed up, and says reset_done, unasked: the
host lends the container again then. When the container must not serve again, the
harness says no reset_done and exits with code 3.

Standard library only; Python 3.11+.
"""

import codecs
import ctypes
import errno
import fcntl
import functools
import gc
import importlib.util
import io
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
import types

HARNESS_VERSION = "1"

# Seconds between SIGALRM (the script's own timeout) and the parent's SIGKILL of the
# child's process group, for scripts that block or ignore the alarm or sit in C code.
HARD_KILL_GRACE = 1.0

# Bytes kept in reserve under max_output_bytes for the error and script_done lines that
# end an execution, so that the host's own limit over the whole stream is never reached
# by a well-behaved harness.
OUTPUT_RESERVE = 4096

# Longest wait, on reset, for the next child to finish warming up.
WARM_WAIT = 0.5

# Longest request line taken; the rest of a longer one is dropped, so that a host that
# never sends a newline cannot grow the harness without bound.
MAX_REQUEST_BYTES = 16 << 20

# Protocol output kept before it is written out even without a flush.
OUT_FLUSH_BYTES = 64 * 1024

# Largest stdout/stderr chunk emitted as one event.
CHUNK_BYTES = 32 * 1024

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_OUTPUT = 1 << 20

# Events a child may send; anything else from the child pipe is dropped.
CHILD_EVENT_TYPES = ("intermediate", "log", "final_result", "error")

# Seconds past its timeout (counted by the parent from the request's dispatch) after
# which an execution is a timeout whatever its child says: a script that swallows the
# alarm or breaks the event stream cannot turn an overrun into a success.
TIMEOUT_SLACK = 0.25

# Longest event line kept from a child while its newline has not come: past it the
# execution ends at its output limit (the line could never be sent anyway).
# The buffer never holds more than the execution's output budget plus one read.
EVENT_READ = 1 << 16

# Reads of one pipe in one pass of the supervision loop, so that a script writing
# without pause cannot keep the parent from its deadlines and cancels.
READS_PER_PASS = 16

# Seconds to wait for the zygote to answer a fork request.
FORK_WAIT = 5.0

# inspect.CO_COROUTINE: inspect itself costs 1.7 MB that every fork would copy.
CO_COROUTINE = 0x80

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

# Seconds to wait for the zygote to report a killed child's end.
REAP_WAIT = 5.0


def _env_flag(name):
    return os.environ.get(name, "") == "1"


IN_CONTAINER = _env_flag("JAZZMINE_CONTAINER")
TOOLS_DIR = os.environ.get("JAZZMINE_TOOLS_DIR", "/tools")


def _scratch_dir(var, container_default):
    """A directory the harness may wipe: set explicitly, or the default inside a container.

    Outside a container an unset variable means "do not wipe": running the harness on a
    developer's host must never empty that host's /tmp.
    """
    value = os.environ.get(var)
    if value:
        return value
    return container_default if IN_CONTAINER else None


WORKSPACE = _scratch_dir("JAZZMINE_WORKSPACE", "/workspace")
TMPDIR = _scratch_dir("JAZZMINE_TMPDIR", "/tmp")
# What reset empties: the scratch directories and, in a container only (on a host they
# are the host's), where else a script can leave files for the next execution: POSIX
# shared memory and named semaphores (/dev/shm, the container's own tmpfs) and POSIX
# message queues (/dev/mqueue). System V IPC is the other such place: see _SysvIpc.
WIPED = tuple(d for d in (WORKSPACE, TMPDIR) if d) + (("/dev/shm", "/dev/mqueue") if IN_CONTAINER else ())


# ---------------------------------------------------------------------------------------
# Output to the host: the parent is the only writer.


class _Out:
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
        line = _encode(event)
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


def _encode(event):
    return (json.dumps(event, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8", "surrogatepass")


def _encoded_len(event):
    return len(_encode(event))


# ---------------------------------------------------------------------------------------
# Tools.


def _make_sync(fn):
    """Wraps an async tool so that scripts call it as a plain function.

    The coroutine runs on an event loop owned by a thread of the calling process; the loop
    is created on first use in each child (threads do not survive fork).
    """

    import asyncio  # here, not at the top: 4 MB that every fork would copy, for async tools only

    @functools.wraps(fn)
    def call(*args, **kwargs):
        loop = _tool_loop()
        return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), loop).result()

    call.__jazzmine_async__ = True
    return call


_loop_state = {"pid": None, "loop": None}
_loop_lock = threading.Lock()


def _tool_loop():
    with _loop_lock:
        if _loop_state["pid"] != os.getpid():
            import asyncio  # imported already by _make_sync: a dict lookup

            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name="jazzmine-tool-loop", daemon=True)
            t.start()
            _loop_state.update(pid=os.getpid(), loop=loop)
        return _loop_state["loop"]


def load_tools(directory):
    """Loads every *.py in directory. Returns (tools by name, errors)."""
    tools, errors = {}, []
    if not directory or not os.path.isdir(directory):
        return tools, errors
    directory = os.path.abspath(directory)  # co_filename below is compared to absolute paths
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".py") or name.startswith("."):
            continue
        path = os.path.join(directory, name)
        try:
            spec = importlib.util.spec_from_file_location("jazzmine_tools." + name[:-3], path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except BaseException as e:  # a tool's SystemExit must not stop the harness either
            errors.append({"file": name, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()})
            continue
        for attr, value in vars(module).items():
            if attr.startswith("_") or not isinstance(value, types.FunctionType):
                continue
            if getattr(value, "__code__", None) is None or value.__code__.co_filename != path:
                continue  # imported into the tool file, not defined by it
            tools[attr] = _make_sync(value) if value.__code__.co_flags & CO_COROUTINE else value
    return tools, errors


# ---------------------------------------------------------------------------------------
# The child: runs one script.


class ScriptTimeout(BaseException):
    """Raised in the script by SIGALRM. A BaseException so `except Exception` won't eat it."""


class _ChildIO:
    """The child's end of the event pipe; serialises writes from the script's threads."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()
        self.dumps = json.dumps  # captured before the script can replace json.dumps

    def send(self, event, what=None):
        """Writes one event line. what names the data for the error when it is not JSON."""
        try:
            line = (self.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as e:
            if what is None:
                raise
            raise TypeError("%s must be JSON-serializable: %s" % (what, e)) from None
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # what the script printed before this event goes first
            except Exception:
                pass
        self.write(line)

    def write(self, data):
        """Writes data whole: an alarm that fires meanwhile waits until it is written,
        so that a timeout never leaves half an event line in the pipe."""
        main = threading.get_ident() == _MAIN_THREAD
        if main:
            _alarm["defer"] += 1
        try:
            with self.lock:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view):]
        finally:
            if main:
                _alarm["defer"] -= 1
                if _alarm["pending"] and not _alarm["defer"]:
                    _alarm["pending"] = False
                    raise ScriptTimeout()


def _helpers(io_, mode):
    state = {"result": False}

    def emit_result(data=None):
        """Returns data as the execution's final result. Call it once."""
        if state["result"]:
            raise RuntimeError("emit_result() may be called only once per execution")
        io_.send({"type": "final_result", "data": data}, "emit_result data")
        state["result"] = True

    def emit_intermediate(label, data=None):
        """Streams a partial result to the agent while the script runs."""
        io_.send({"type": "intermediate", "label": str(label), "data": data}, "emit_intermediate data")

    def emit_log(message, level="info"):
        """Sends a diagnostic message without affecting the result."""
        io_.send({"type": "log", "level": str(level), "message": str(message)})

    return {"emit_result": emit_result, "emit_intermediate": emit_intermediate, "emit_log": emit_log}


_STDLIB = os.path.dirname(os.__file__)
_HIDDEN_FRAMES = (os.path.abspath(__file__), os.path.join(_STDLIB, "asyncio"), os.path.join(_STDLIB, "concurrent") + "/")


def _script_traceback(e):
    """The traceback of the script's and the tools' own frames: the harness's, and the
    machinery that runs async tools on their loop, are noise to the script's author."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<script>":
        tb = tb.tb_next
    if tb is None:  # a SyntaxError, raised by compile() before any script frame
        return "".join(traceback.format_exception_only(type(e), e))
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(_HIDDEN_FRAMES)]
    return "".join(["Traceback (most recent call last):\n"] + traceback.format_list(frames) + traceback.format_exception_only(type(e), e))


# The alarm's state in a child: defer counts event writes under way in the main thread
# (where Python runs signal handlers); an alarm during one is pending until it ends.
_alarm = {"defer": 0, "pending": False, "fired": False}
_MAIN_THREAD = threading.main_thread().ident


def _on_alarm(signum, frame):
    _alarm["fired"] = True
    if _alarm["defer"]:
        _alarm["pending"] = True
        return
    raise ScriptTimeout()


def _fmt_seconds(t):
    return "%gs" % t


def _child_main(req_fd, ev_fd, out_fd, err_fd, tools):
    """Runs in the forked child. Never returns."""
    code = 0
    try:
        os.setsid()
        # fd 0 is the zygote's /dev/null already. Nothing here looks a path up: see
        # _Dir for what a lookup costs on Docker's fuse-overlayfs storage driver.
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (out_fd, err_fd):
            if fd > 2:
                os.close(fd)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=False)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        _close_all_but(0, 1, 2, req_fd, ev_fd)
        io_ = _ChildIO(ev_fd)
        _start_egress_relay()  # listening before the warm-up: off the job's critical path

        # Warm up while waiting for the request: a dry run through the same code faults
        # in the copy-on-write pages that a real run touches, off the critical path.
        # Skipped when the request is already waiting: then it would only delay it.
        if not select.select([req_fd], [], [], 0)[0]:
            _run_script(_ChildIO(0), json.loads(_WARM_UP_REQUEST), tools)  # fd 0: /dev/null, read-write
        os.write(ev_fd, b'{"type":"_warm"}\n')

        request = _read_request(req_fd)
        os.close(req_fd)
        code = _run_script(io_, request, tools)
    except BaseException:  # noqa: the child must always exit through os._exit
        try:
            os.write(2, traceback.format_exc().encode())
        except OSError:
            pass
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code)


_WARM_UP_REQUEST = json.dumps(
    {"type": "execute", "execution_id": "warm-up", "script": "emit_log('x')\nemit_result({'a': [1, 2.5, 'x', None]})", "timeout": 30, "mode": "plan"}
)


def _warm_up(tools):
    """Runs a child's first steps once, in the harness, before the zygote is forked.

    A run does work only the first one in a process does: caches filled, encoders and
    codecs looked up, objects allocated once and kept. Done in each child, after the
    fork, that was most of its CPU (a fork whose child runs a small script for the
    first time: 1.9 ms of CPU; the same script run once before the fork: 1.0 ms). Done
    here, every child inherits the result. The child still runs the warm-up script
    again, for the copy-on-write faults, which only it can take."""
    null = os.open(os.devnull, os.O_WRONLY)
    alarm = signal.getsignal(signal.SIGALRM)
    try:
        for line_buffering in (False, True):
            io.TextIOWrapper(io.FileIO(null, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=line_buffering).flush()
        _run_script(_ChildIO(null), json.loads(_WARM_UP_REQUEST), tools)
    finally:
        signal.signal(signal.SIGALRM, alarm)
        os.close(null)


def _read_request(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            break
        chunks.append(b)
        if b.endswith(b"\n"):
            break
    return json.loads(b"".join(chunks))


def _run_script(io_, req, tools):
    timeout = float(req.get("timeout") or DEFAULT_TIMEOUT)
    mode = req.get("mode") or "plan"
    for key in ("traceparent", "tracestate"):
        if req.get(key):
            os.environ[key.upper()] = req[key]
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    g.update(tools)
    g.update(_helpers(io_, mode))

    _alarm.update(defer=0, pending=False, fired=False)
    signal.signal(signal.SIGALRM, _on_alarm)
    error = None
    try:
        code = compile(req.get("script", ""), "<script>", "exec")
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            exec(code, g)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ScriptTimeout:
        error = {"type": "error", "kind": "timeout", "error": "Script timed out after %s" % _fmt_seconds(timeout)}
    except SystemExit as e:
        error = {"type": "error", "kind": "script", "error": "Script called sys.exit(%s)" % ("" if e.code is None else repr(e.code))}
    except BaseException as e:
        error = {"type": "error", "kind": "script", "error": "%s: %s" % (type(e).__name__, e), "traceback": _script_traceback(e)}
    signal.setitimer(signal.ITIMER_REAL, 0)
    if _alarm["fired"] and (error is None or error["kind"] != "timeout"):
        # The script caught its timeout and went on: it still ran out of time.
        error = {"type": "error", "kind": "timeout", "error": "Script timed out after %s" % _fmt_seconds(timeout)}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # The end in one write, behind a newline: whatever the script left unfinished on
    # the event pipe (half a line, written when the alarm fired or on purpose) ends
    # there and is dropped as malformed, and the error and the end stay whole.
    end = b"\n"
    if error is not None:
        try:
            end += (io_.dumps(error, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8", "surrogatepass")
        except BaseException:
            end += b'{"type":"error","kind":"script","error":"the script\'s error could not be encoded"}\n'
    io_.write(end + b'{"type":"_done"}\n')
    return 0


# ---------------------------------------------------------------------------------------
# The egress relay. A sandbox with an allowlist has no network: its only way out is the
# egress proxy's Unix socket, $JAZZMINE_EGRESS_SOCKET, in a volume mounted read-only (a
# script can connect to it, not replace it). HTTP clients need a TCP proxy, so every
# child relays 127.0.0.1:$JAZZMINE_EGRESS_PORT to that socket, in a daemon thread of its
# own: the relay lives and dies with the execution, and the next child binds the port
# again (the last child is dead by then). It grants nothing: a script may as well
# connect to the socket itself, and the proxy decides what the sandbox reaches.

DEFAULT_EGRESS_PORT = 3128

# Bytes a relayed connection holds for one direction before it stops reading that way.
RELAY_BUFFER = 64 * 1024

# Tries at binding the relay's port, a millisecond apart, should the last child's
# socket not be released yet.
RELAY_BIND_TRIES = 200


def _start_egress_relay():
    """Starts the relay if the container has an egress socket, and returns it. A relay
    that cannot start says why on the script's stderr; the script runs without it."""
    path = os.environ.get("JAZZMINE_EGRESS_SOCKET")
    if not path:
        return None
    port = os.environ.get("JAZZMINE_EGRESS_PORT") or str(DEFAULT_EGRESS_PORT)
    try:
        relay = _EgressRelay(path, int(port))
    except (OSError, ValueError, OverflowError) as e:
        try:
            os.write(2, ("jazzmine: no egress relay on 127.0.0.1:%s: %s\n" % (port, e)).encode())
        except OSError:
            pass
        return None
    threading.Thread(target=relay.serve, name="jazzmine-egress-relay", daemon=True).start()
    return relay


class _EgressRelay:
    """Accepts connections on 127.0.0.1:port and relays each to the Unix socket at path,
    both ways, with one poll loop for all of them."""

    def __init__(self, path, port):
        self.path = path
        self.poll = select.poll()
        self.socks = {}  # fd -> (socket, its _RelayFlow, or None for the listener)
        self.masks = {}  # fd -> the events it is registered for
        ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            for attempt in range(RELAY_BIND_TRIES):
                try:
                    ln.bind(("127.0.0.1", port))
                    break
                except OSError as e:
                    if e.errno != errno.EADDRINUSE or attempt == RELAY_BIND_TRIES - 1:
                        raise
                    time.sleep(0.001)
            ln.listen(64)
            ln.setblocking(False)
        except BaseException:
            ln.close()
            raise
        self.listener = ln
        self.socks[ln.fileno()] = (ln, None)
        self.watch(ln, select.POLLIN)

    def watch(self, sock, mask):
        """Polls sock for mask; 0 stops polling it (so that its hang-up wakes nobody)."""
        fd = sock.fileno()
        if self.masks.get(fd, 0) == mask:
            return
        if mask:
            self.poll.register(fd, mask)
            self.masks[fd] = mask
        else:
            self.poll.unregister(fd)
            del self.masks[fd]

    def forget(self, sock):
        fd = sock.fileno()
        if fd in self.masks:
            self.watch(sock, 0)
        self.socks.pop(fd, None)
        sock.close()

    def serve(self):
        while True:
            for fd, events in self.poll.poll():
                entry = self.socks.get(fd)
                if entry is None:
                    continue
                sock, flow = entry
                if flow is None:
                    self._accept()
                else:
                    flow.pump(sock, events)

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # none waiting (EAGAIN), or out of descriptors: it waits
                return
            client.setblocking(False)
            proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            proxy.setblocking(False)  # a Unix socket connects at once, or fails at once
            try:
                proxy.connect(self.path)
            except OSError as e:
                proxy.close()
                self._refuse(client, e)
                continue
            _RelayFlow(self, client, proxy)

    def _refuse(self, client, err):
        """Answers a client whose proxy connection failed with a 502 and closes it."""
        body = "jazzmine relay: the egress proxy at %s is unreachable: %s\n" % (self.path, os.strerror(err.errno) if err.errno else err)
        answer = "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body.encode()), body)
        try:
            while client.recv(RELAY_BUFFER):  # what the client sent already: unread, closing would reset
                pass
        except OSError:
            pass
        try:
            client.send(answer.encode())
            client.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        client.close()


class _RelayFlow:
    """One relayed connection: bytes both ways between a client and the proxy, at most
    RELAY_BUFFER held each way; an end of stream is passed on as a half-close."""

    def __init__(self, relay, client, proxy):
        self.relay = relay
        self.peer = {client: proxy, proxy: client}
        self.pending = {client: bytearray(), proxy: bytearray()}  # to be written to the key
        self.reading = {client: True, proxy: True}  # its end of stream not yet read
        self.shut = {client: False, proxy: False}  # written to its end
        for s in (client, proxy):
            relay.socks[s.fileno()] = (s, self)
            relay.watch(s, select.POLLIN)

    def pump(self, sock, events):
        peer = self.peer[sock]
        try:
            if self.reading[sock] and len(self.pending[peer]) < RELAY_BUFFER and events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    data = sock.recv(RELAY_BUFFER)
                except BlockingIOError:  # a wake-up with nothing to read after all
                    data = None
                if data:
                    self.pending[peer] += data
                elif data is not None:
                    self.reading[sock] = False
            self._flush(peer)
            self._flush(sock)
        except OSError:
            self.close()
            return
        if not any(self.reading.values()) and not any(self.pending.values()):
            self.close()
            return
        for s in (sock, peer):
            mask = 0
            if self.reading[s] and len(self.pending[self.peer[s]]) < RELAY_BUFFER:
                mask |= select.POLLIN
            if self.pending[s]:
                mask |= select.POLLOUT
            self.relay.watch(s, mask)

    def _flush(self, sock):
        buf = self.pending[sock]
        if buf:
            try:
                del buf[: sock.send(buf)]
            except BlockingIOError:
                pass
        if not buf and not self.reading[self.peer[sock]] and not self.shut[sock]:
            sock.shutdown(socket.SHUT_WR)
            self.shut[sock] = True

    def close(self):
        for s in self.peer:
            self.relay.forget(s)


# ---------------------------------------------------------------------------------------
# The parent.


# The zygote's messages to the harness: a kind, a pid and a wait status.
_ZMSG = struct.Struct("=cii")


def _zygote_main(sock, tools):
    """The zygote: forks the children, and reports how each ended. Never returns.

    It runs nothing but this loop, so its memory stays as the harness left it when it
    forked the zygote. A fork copies no page; it marks them copy-on-write in both
    processes, and every page the forking process writes afterwards is copied, one
    fault each (measured in a container here: ~270 faults, ~1.5 ms of CPU, per
    execution when the harness forked its children itself). This loop writes to a
    handful of pages; the harness, which never forks again, to none it shares."""
    code = 0
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the harness gone, so are we
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the children's stdin, and where their warm-up run writes
        os.dup2(null, 1)
        # Nothing of the harness's but the socket to it: not the protocol stream, not
        # the directories and counters it holds open.
        _close_all_but(0, 1, 2, sock.fileno())
        # What every child starts in, set here once rather than looked up in each.
        if WORKSPACE:
            try:
                os.chdir(WORKSPACE)
            except OSError:
                pass
        if TMPDIR:
            os.environ["TMPDIR"] = TMPDIR
        wake_r, wake_w = os.pipe()
        _nonblock(wake_r)
        _nonblock(wake_w)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        while True:
            ready = select.select([sock, wake_r], [], [])[0]
            if wake_r in ready:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    sock.send(_ZMSG.pack(b"X", pid, status))
            if sock in ready:
                msg, fds, _, _ = socket.recv_fds(sock, 16, 4)
                if not msg:
                    break  # the harness closed its end
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_r, wake_w, sock.fileno()):
                        os.close(fd)
                    _child_main(*fds, tools)
                for fd in fds:
                    os.close(fd)
                sock.send(_ZMSG.pack(b"P", pid, 0))
    except BaseException:  # noqa: the zygote must always exit through os._exit
        try:
            os.write(2, traceback.format_exc().encode())
        except OSError:
            pass
        code = 70
    os._exit(code)


class Retire(Exception):
    """The container must not serve again: a script changed something the harness
    cannot undo or prove undone. The harness says no reset_done and exits (code 3),
    and the host retires the container."""


class ZygoteLost(Retire):
    """The zygote died, stopped or stopped answering: a script reached it. It is never
    forked again from the harness, whose memory has held executions' data."""


# ioprio_get(2) by architecture: the standard library has no wrapper.
_SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine)


def _ioprio(pid):
    """The I/O priority of pid (ioprio_get, IOPRIO_WHO_PROCESS), or None where the
    system call's number is not known here."""
    if _SYS_IOPRIO_GET is None:
        return None
    return _libc().syscall(_SYS_IOPRIO_GET, 1, pid)


class _Limits:
    """What a process of our uid may change on another of our uid without privilege,
    and a non-dumpable target does not prevent: its resource limits (prlimit), nice
    value (setpriority), scheduling policy, CPU affinity and I/O priority (ioprio_set).
    A change to the zygote's
    would pass to every later execution (a lowered hard limit cannot be raised again
    without CAP_SYS_RESOURCE), a change to ours would break the harness: either means
    Retire. Read with one system call each, after every execution."""

    RLIMITS = tuple(getattr(resource, n) for n in sorted(dir(resource)) if n.startswith("RLIMIT_"))

    def __init__(self, pid):
        self.pid = pid
        self.baseline = self.read()

    def read(self):
        try:
            return (
                tuple(resource.prlimit(self.pid, r) for r in self.RLIMITS),
                os.getpriority(os.PRIO_PROCESS, self.pid),
                os.sched_getscheduler(self.pid),
                os.sched_getparam(self.pid).sched_priority,
                frozenset(os.sched_getaffinity(self.pid)),
                _ioprio(self.pid),
            )
        except OSError:
            return None

    def check(self, what):
        if self.read() != self.baseline:
            raise Retire("a script changed the resource limits or scheduling of %s" % what)


class Zygote:
    """The harness's side of the zygote: asks it for children, learns how they ended.

    The children are the zygote's, not the harness's: the zygote reaps them and sends
    each wait status. What a child leaves behind is reparented to the harness, the
    subreaper (PID 1 in a container), which kills it. The zygote is forked once, at
    start, before any execution: see ZygoteLost."""

    def __init__(self, tools):
        self.tools = tools
        self.sock = None
        self.pid = None
        self.ended = {}  # pid -> wait status, reported but not yet claimed
        self.start()

    def start(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            mine.close()
            _zygote_main(theirs, self.tools)
        theirs.close()
        self.sock, self.pid = mine, pid

    def stop(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (OSError, ChildProcessError):
                pass
            self.pid = None

    def fileno(self):
        return self.sock.fileno()

    def fork(self, fds):
        """Has the zygote fork a child with fds (its request, event, stdout and stderr
        pipe ends). Raises ZygoteLost if the zygote is gone or does not answer within
        FORK_WAIT (see check for a zygote a script stopped)."""
        if self.sock is None:
            raise ZygoteLost("the zygote is gone")
        deadline = time.monotonic() + FORK_WAIT
        try:
            socket.send_fds(self.sock, [b"F"], fds)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ZygoteLost("the zygote did not answer a fork request within %gs" % FORK_WAIT)
                kind, pid, status = self._recv(left)
                if kind == b"P":
                    return pid
        except OSError as e:
            raise ZygoteLost("the zygote is gone: %s" % e) from None

    def check(self):
        """Raises ZygoteLost if the zygote was stopped or killed: what a script of our
        uid can do to it. Called after each execution, before anything waits on it."""
        if _proc_state(self.pid) in (None, "T", "t", "Z", "X"):
            raise ZygoteLost("the zygote was stopped or killed during the execution")

    def _recv(self, timeout):
        """One message; (None, 0, 0) on timeout. Raises OSError if the zygote is gone."""
        if timeout is not None and not select.select([self.sock], [], [], timeout)[0]:
            return None, 0, 0
        data = self.sock.recv(_ZMSG.size)
        if not data:
            raise ConnectionResetError("zygote gone")
        kind, pid, status = _ZMSG.unpack(data)
        if kind == b"X":
            self.ended[pid] = status
        return kind, pid, status

    def pump(self):
        """Takes in what the zygote reported, without blocking. False if it is gone."""
        try:
            while self._recv(0)[0] is not None:
                pass
        except OSError:
            return False
        return True

    def wait(self, pid, timeout=REAP_WAIT):
        """The wait status of child pid once it has ended and been reaped, or None."""
        deadline = time.monotonic() + timeout
        while pid not in self.ended:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                self._recv(left)
            except OSError:
                # The zygote died: its children are ours now (we are the subreaper).
                return self._wait_orphan(pid, deadline)
        return self.ended.pop(pid)

    def _wait_orphan(self, pid, deadline):
        while time.monotonic() < deadline:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got == pid:
                    return status
            except ChildProcessError:
                if not _pid_exists(pid):
                    return None
            time.sleep(0.001)
        return None


class Child:
    """A forked zygote, waiting for its request or running it."""

    def __init__(self, pid, req_w, ev_r, out_r, err_r, zygote):
        self.pid = pid
        self.req_w = req_w
        self.fds = {"event": ev_r, "stdout": out_r, "stderr": err_r}
        self.zygote = zygote
        self.status = None  # wait status once reaped
        self.evbuf = bytearray()  # event bytes read but not yet parsed
        self.is_warm = False
        # Prepared here, at fork time, off the critical path of the execution.
        self.poll = select.poll()
        self.names = {}
        for name, fd in self.fds.items():
            self.poll.register(fd, select.POLLIN)
            self.names[fd] = name
        self.poll.register(zygote.fileno(), select.POLLIN)
        self.names[zygote.fileno()] = "zygote"

    def ended(self):
        """Whether the zygote has reported the child's end (it sets status)."""
        if self.status is None and self.pid in self.zygote.ended:
            self.status = self.zygote.ended.pop(self.pid)
        return self.status is not None

    def close(self):
        for fd in [self.req_w, *self.fds.values()]:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_w = None
        self.fds = {}


def _nonblock(fd):
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)


@functools.lru_cache(maxsize=None)
def _libc():
    """The C library, for what the standard library lacks (prctl, System V IPC)."""
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option, value):
    try:
        return _libc().prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _close_all_but(*keep):
    """Closes every file descriptor but keep, with close_range(2): no /proc/self/fd."""
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 30)


# The harness reads /proc and wipes the scratch directories after every execution. Each
# path it looks up starts at /, and on Docker's fuse-overlayfs storage driver the lookup
# checks / through the FUSE daemon (a getxattr of its ACL: a round trip to
# fuse-overlayfs). That was ~15 round trips per execution, 4% of the machine's CPU at
# 240 jobs/s. So these directories are opened once and everything under them is reached
# relative to the open descriptor, which never crosses /.


class _Dir:
    """A directory held open; path is looked up again only if it was removed."""

    def __init__(self, path):
        self.path = path
        self.fd = None

    def fileno(self):
        """The open directory, or None if path is not one."""
        if self.fd is not None:
            try:
                if os.fstat(self.fd).st_nlink > 0:
                    return self.fd
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        return self.fd


_PROC = _Dir("/proc")


def _read_proc(name):
    """The contents of /proc/<name>. Raises OSError."""
    dirfd = _PROC.fileno()
    if dirfd is None:
        raise FileNotFoundError("/proc")
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _pid_exists(pid):
    dirfd = _PROC.fileno()
    if dirfd is None:
        return False
    try:
        os.stat(str(pid), dir_fd=dirfd)
        return True
    except OSError:
        return False


# Deepest directory tree the wipe descends, holding a descriptor per level: a deeper one
# is a script's attempt to outlast it, and retires the container.
WIPE_DEPTH = 256


class _Scratch(_Dir):
    """A directory reset empties, and the mode it had when the harness started: a
    script may chmod it (it owns it) to make the next execution fail."""

    def __init__(self, path):
        super().__init__(path)
        self.mode = None
        fd = self.fileno()
        if fd is not None:
            st = os.fstat(fd)
            if st.st_uid == os.getuid():
                self.mode = stat.S_IMODE(st.st_mode)

    def wipe(self):
        """Empties the directory, dotfiles too, without following links, and gives it
        back its mode. Raises Retire if anything is left.

        It walks the tree iteratively, relative to open directory descriptors, making
        each directory ours (chmod) before it opens it: no recursion limit, no path
        length limit, and no directory a script made unreadable or unsearchable at any
        depth is skipped (shutil.rmtree was: 0o111 directories and paths past PATH_MAX
        outlived it, and a library's files planted under $HOME ran in later
        executions). What it cannot remove, it reports."""
        dirfd = self.fileno()
        if dirfd is None:
            return
        if self.mode is not None:
            if stat.S_IMODE(os.fstat(dirfd).st_mode) != self.mode:
                os.chmod(dirfd, self.mode)
            self._clear_xattrs(dirfd)
        names = os.listdir(dirfd)
        if not names:
            return  # the common case: one listing
        try:
            os.chmod(dirfd, stat.S_IRWXU if self.mode is None else self.mode | stat.S_IRWXU)
        except OSError:
            pass  # /dev/shm and /dev/mqueue are root's, and never ours to lock
        stack = [(dirfd, None, names)]  # (descriptor, name in its parent, entries left)
        try:
            while stack:
                fd, name, left = stack[-1]
                if not left:
                    stack.pop()
                    if name is not None:
                        os.close(fd)
                        try:
                            os.rmdir(name, dir_fd=stack[-1][0])
                        except OSError:
                            pass
                    continue
                entry = left.pop()
                try:
                    st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    try:
                        os.unlink(entry, dir_fd=fd)
                    except OSError:
                        pass
                    continue
                if len(stack) > WIPE_DEPTH:
                    raise Retire("a directory tree in %s deeper than %d levels" % (self.path, WIPE_DEPTH))
                try:
                    os.chmod(entry, stat.S_IRWXU, dir_fd=fd)  # a directory: nothing else runs now
                    sub = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue
                try:
                    stack.append((sub, entry, os.listdir(sub)))
                except OSError:
                    stack.append((sub, entry, []))
        finally:
            for fd, name, _ in stack:
                if name is not None:
                    os.close(fd)
        left = os.listdir(dirfd)
        if left:
            raise Retire("could not empty %s: %d entries left" % (self.path, len(left)))

    # Extended attributes of a scratch directory that a script may set and reset removes.
    XATTRS = ("user.", "system.posix_acl_")

    def _clear_xattrs(self, dirfd):
        """Removes the extended attributes a script set on the directory itself: data
        the next execution could read (user.*), and default ACLs that would give every
        file it creates mode 0 (system.posix_acl_*). One listxattr when there are none.
        Raises Retire if one cannot be removed."""
        try:
            names = [n for n in os.listxattr(dirfd) if n.startswith(self.XATTRS)]
        except OSError:
            return  # the filesystem has none
        for name in names:
            try:
                os.removexattr(dirfd, name)
            except OSError:
                raise Retire("could not remove the extended attribute %s of %s" % (name, self.path)) from None


class _OomCounter:
    """The cgroup's OOM-kill counter (v2, then v1), its file held open and read again
    from offset 0 each time."""

    def __init__(self):
        self.fd = None
        for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                return
            except OSError:
                continue

    def read(self):
        """The count, or None where it cannot be read."""
        if self.fd is None:
            return None
        try:
            data = os.pread(self.fd, 4096, 0)
        except OSError:
            return None
        for line in data.split(b"\n"):
            k, _, v = line.partition(b" ")
            if k == b"oom_kill":
                try:
                    return int(v)
                except ValueError:
                    return None
        return None


class _SysvIpc:
    """Removes the System V shared memory segments, semaphore sets and message queues
    of our IPC namespace (the container's): they outlive the processes that made them,
    so an execution could leave data to the next. They are listed in /proc/sysvipc,
    whose files are held open and read again from offset 0, and removed with IPC_RMID
    through ctypes: the standard library has no System V IPC. Every process of the
    container runs as our uid, so every object is ours to remove."""

    IPC_RMID = 0

    def __init__(self):
        self.kinds = []  # (fd, remove(id))
        try:
            libc = _libc()
        except OSError:
            return
        removers = {
            "shm": lambda i: libc.shmctl(i, self.IPC_RMID, None),
            "sem": lambda i: libc.semctl(i, 0, self.IPC_RMID),
            "msg": lambda i: libc.msgctl(i, self.IPC_RMID, None),
        }
        for kind, remove in removers.items():
            try:
                self.kinds.append((os.open("/proc/sysvipc/" + kind, os.O_RDONLY | os.O_CLOEXEC), remove))
            except OSError:
                continue

    def remove_all(self):
        for fd, remove in self.kinds:
            tried = set()
            while True:  # a listing longer than one read is removed in rounds
                try:
                    lines = os.pread(fd, 1 << 16, 0).split(b"\n")[1:]  # the first is a header
                except OSError:
                    break
                ids = set()
                for line in lines:
                    fields = line.split()
                    if len(fields) > 1 and fields[1].isdigit():
                        ids.add(int(fields[1]))  # key, then the id
                ids -= tried  # one that could not be removed is not tried again
                if not ids:
                    break
                for i in ids:
                    remove(i)
                tried |= ids


def _proc_pids():
    dirfd = _PROC.fileno()
    if dirfd is None:
        return []
    return [int(name) for name in os.listdir(dirfd) if name.isdigit()]


def _uid_of(pid):
    # /proc/<pid> of a non-dumpable process is owned by root: read the real uid instead.
    try:
        for line in _read_proc("%d/status" % pid).split(b"\n"):
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _children():
    """Our direct children, from /proc/self/task/<tid>/children (the parent has one
    thread), or by every process's parent in /proc where that file is missing.

    The kernel reads that file without freezing the children, so a child changing
    state during the read may be missed: _kill_descendants only trusts it once every
    child it killed has been waited for, when nothing is changing any more."""
    me = os.getpid()
    try:
        return [int(p) for p in _read_proc("%d/task/%d/children" % (me, me)).split()]
    except OSError:
        pass
    pids = []
    for pid in _proc_pids():
        try:
            data = _read_proc("%d/stat" % pid)
            if int(data[data.rindex(b")") + 2 :].split()[1]) == me:
                pids.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return pids


class Harness:
    def __init__(self, in_fd=0, out_fd=1):
        self.in_fd = in_fd
        self.out = _Out(out_fd)
        self.inbuf = bytearray()
        self.discarding = False  # inside a request line over MAX_REQUEST_BYTES
        self.pending = []  # requests read but not yet handled
        self.tools = {}
        self.tool_errors = []
        self.warm = None  # the next child, forked ahead of its request
        self.zygote = None
        # The cgroup's OOM-kill count when no script was running: a script killed by
        # SIGKILL while it rose ran out of memory. Read off the critical path.
        self.oom_kills = None
        self.oom = _OomCounter()
        self.sysv = _SysvIpc() if IN_CONTAINER else None
        self.scratch = [_Scratch(d) for d in WIPED]  # opened before any script runs
        self.limits = self.zygote_limits = None
        self.idle_poll = select.poll()
        self.eof = False

    # -- startup ----------------------------------------------------------------------

    def start(self):
        # Same-uid processes (a script's leftovers) may not ptrace us or open /proc/<pid>/mem
        # or /proc/<pid>/fd; orphaned descendants are reparented to us, so reset finds them.
        _prctl(PR_SET_DUMPABLE, 0)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        # No handler for anything a process can send: as a container's PID 1 the kernel
        # then drops every signal sent from inside the container, SIGKILL and SIGSTOP
        # too (pid_namespaces(7)). Python's own SIGINT handler would let a script end us.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        self.tools, self.tool_errors = load_tools(TOOLS_DIR)
        _nonblock(self.in_fd)
        self.idle_poll.register(self.in_fd, select.POLLIN)
        self.oom_kills = self.oom.read()
        _warm_up(self.tools)
        gc.collect()
        gc.freeze()  # the children never touch the parent's objects' GC headers
        self.zygote = Zygote(self.tools)
        self.limits, self.zygote_limits = _Limits(os.getpid()), _Limits(self.zygote.pid)
        self.warm = self._fork()
        self.out.send(
            {
                "type": "ready",
                "version": HARNESS_VERSION,
                "python": sys.version.split()[0],
                "pid": os.getpid(),
                "tools": sorted(self.tools),
                "tool_errors": self.tool_errors,
            }
        )

    def _fork(self):
        req_r, req_w = os.pipe()
        ev_r, ev_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = self.zygote.fork([req_r, ev_w, out_w, err_w])
        finally:
            for fd in (req_r, ev_w, out_w, err_w):
                os.close(fd)
        for fd in (ev_r, out_r, err_r):
            _nonblock(fd)
        return Child(pid, req_w, ev_r, out_r, err_r, self.zygote)

    # -- main loop --------------------------------------------------------------------

    def serve(self):
        """Serves requests until stdin ends. Returns the exit code: 0, or 3 when the
        container must be retired (see Retire)."""
        self.start()
        code = 0
        try:
            while not self.eof or self.pending:
                req = self._next_request(None)
                if req is None:
                    continue
                self._handle(req)
        except Retire as e:
            # No reset_done: the host sees the stream end and retires the container.
            sys.stderr.write("harness: %s; exiting, the container must not be used again\n" % e)
            code = 3
        self.out.flush()
        self._kill_child(self.warm)
        self.warm = None
        self.zygote.stop()
        self._kill_leftovers()
        return code

    def _handle(self, req):
        kind = req.get("type")
        nonce = req.get("nonce")
        if kind == "execute":
            self._execute(req)
            # Every execute ends with the reset the host would ask for, unasked: the host
            # lends the container again at this reset_done without a round trip of its own.
            self._reset_done(nonce)
        elif kind == "reset":
            self._reset()
            self._reset_done(nonce)
        elif kind == "ping":
            self.out.send({"type": "pong", "version": HARNESS_VERSION, "nonce": nonce})
        elif kind == "cancel":
            pass  # nothing is running: a late cancel is harmless
        else:
            self.out.send({"type": "log", "level": "warning", "message": "harness: unknown request type %r" % (kind,)})

    def _reset_done(self, nonce):
        """Says reset_done, answering the request of nonce. The host takes it as an
        answer to that request only: the nonce never reaches a script."""
        if self.warm is None:
            self.warm = self._fork()
        # reset_done means ready: the next execute finds a warmed-up child.
        self._await_warm(self.warm, WARM_WAIT)
        self.out.send({"type": "reset_done", "nonce": nonce})
        self.out.flush()

    def _await_warm(self, child, timeout):
        """Waits until child has warmed up, at most timeout seconds."""
        fd = child.fds.get("event")
        deadline = time.monotonic() + timeout
        while not child.is_warm and fd is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return
            try:
                data = os.read(fd, 1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                return
            child.evbuf += data
            if b'{"type":"_warm"}\n' in child.evbuf:
                child.evbuf = child.evbuf.replace(b'{"type":"_warm"}\n', b"", 1)
                child.is_warm = True

    def _read_stdin(self):
        try:
            data = os.read(self.in_fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.eof = True
            self.idle_poll.unregister(self.in_fd)
            return
        self.inbuf += data
        if b"\n" not in data:  # scan what came, not the whole buffer again
            if len(self.inbuf) > MAX_REQUEST_BYTES:
                self.inbuf.clear()
                if not self.discarding:
                    self.discarding = True
                    self.out.send({"type": "log", "level": "warning", "message": "harness: dropped a request line over %d bytes" % MAX_REQUEST_BYTES})
            return
        while True:
            end = self.inbuf.find(b"\n")
            if end < 0:
                break
            line = bytes(self.inbuf[:end])
            del self.inbuf[: end + 1]
            if self.discarding:
                self.discarding = False  # the end of the line that was too long
                continue
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                self.out.send({"type": "log", "level": "warning", "message": "harness: ignored a malformed request: %s" % e})
                continue
            self.pending.append(req)

    def _next_request(self, timeout):
        if self.pending:
            return self.pending.pop(0)
        if self.eof:
            return None
        self.out.flush()
        if self.idle_poll.poll(None if timeout is None else int(timeout * 1000)):
            self._read_stdin()
        return self.pending.pop(0) if self.pending else None

    # -- execute ----------------------------------------------------------------------

    def _execute(self, req):
        eid = str(req.get("execution_id") or "")
        started = time.monotonic()
        run = Run(self, eid, req)
        missing = [k for k in (req.get("required_secrets") or []) if not os.environ.get(str(k))]
        if missing:
            run.emit({"type": "error", "kind": "missing_secrets", "error": "Missing required secrets: " + ", ".join(sorted(map(str, missing)))})
            run.done(started, None)
            return
        child = self.warm
        self.warm = None
        if child is None or not self._dispatch(child, req):
            self._kill_child(child)
            child = self._fork()
            if not self._dispatch(child, req):
                run.emit({"type": "error", "kind": "crashed", "error": "harness could not start the script process"})
                self._kill_child(child)
                run.done(started, None)
                self.warm = self._fork()
                return
        run.supervise(child)
        run.done(started, child)
        self._after_execution(child)
        self._reset()
        self.warm = self._fork()

    def _dispatch(self, child, req):
        # Encoded again without the nonce: the script must never learn it.
        data = (json.dumps({k: v for k, v in req.items() if k != "nonce"}, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(child.req_w, view):]
            os.close(child.req_w)
            child.req_w = None
            return True
        except OSError:
            return False

    def _after_execution(self, child):
        self._kill_group(child.pid)
        child.close()
        self.zygote.check()
        if not child.ended():
            child.status = self.zygote.wait(child.pid)
        self._reap()
        self._kill_descendants()

    def _kill_group(self, pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass

    def _kill_child(self, child):
        if child is None:
            return
        self._kill_group(child.pid)
        try:
            os.kill(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.close()
        if not child.ended():
            child.status = self.zygote.wait(child.pid)

    def _reap(self):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    # -- reset ------------------------------------------------------------------------

    def _reset(self):
        """Kills what earlier executions left, wipes the scratch directories and, in a
        container, empties /dev/shm and /dev/mqueue and removes System V IPC objects.

        The warm child survives: it was forked after the last execution's leftovers were
        killed, has run no script, and is not dumpable, so no other process of our uid
        could ptrace it or reach its memory or file descriptors meanwhile.
        """
        self._kill_leftovers()
        # Nothing of the executions' runs now: what they changed stays changed.
        self.limits.check("the harness")
        self.zygote_limits.check("the zygote")
        for d in self.scratch:
            d.wipe()
        if self.sysv is not None:
            self.sysv.remove_all()
        self.oom_kills = self.oom.read()

    def _kill_leftovers(self):
        if not IN_CONTAINER:
            self._kill_descendants()
            return
        # Every other process of the PID namespace but us, PID 1 and the warm child:
        # catches anything that escaped our subtree, though subreaping should leave none.
        me, uid = os.getpid(), os.getuid()
        keep = {1, me, self.zygote.pid, self.warm.pid if self.warm else None}
        for _ in range(1000):
            others = [p for p in _proc_pids() if p not in keep]
            if others:  # the common case, nothing left, costs one listdir
                others = [p for p in others if _uid_of(p) == uid and not _is_zombie(p)]
            if not others:
                break
            for p in others:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            self._reap()
            time.sleep(0.0005)
        self._reap()

    def _kill_descendants(self):
        """Kills what earlier children left behind: with PR_SET_CHILD_SUBREAPER every
        orphaned descendant (a setsid double fork included) is reparented to us.

        Each killed child is waited for, so its own children have been reparented to us
        by the time the list is read again; the loop ends when the list is empty."""
        for _ in range(10000):
            kids = [p for p in _children() if p != self.zygote.pid]
            if not kids:
                return
            for p in kids:
                self._kill_group(p)
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            for p in kids:
                try:
                    os.waitpid(p, 0)
                except ChildProcessError:
                    pass


def _proc_state(pid):
    """The state letter of /proc/<pid>/stat (R, S, T, Z...), or None if pid is gone."""
    try:
        data = _read_proc("%d/stat" % pid)
        i = data.rindex(b")") + 2
        return data[i : i + 1].decode()
    except (OSError, ValueError):
        return None


def _is_zombie(pid):
    return _proc_state(pid) in (None, "Z")


class Run:
    """One execution as the parent sees it: relays the child's events and output."""

    def __init__(self, harness, eid, req):
        self.h = harness
        self.eid = eid
        self.mode = req.get("mode") or "plan"
        self.timeout = float(req.get("timeout") or DEFAULT_TIMEOUT)
        limit = int(req.get("max_output_bytes") or DEFAULT_MAX_OUTPUT)
        self.budget = max(limit - OUTPUT_RESERVE, 0)
        self.start_written = harness.out.written
        self.decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")(errors="replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        self.nonce = req.get("nonce")
        # The parent's own clock decides timeouts: the child is the script's process
        # and may say anything, or nothing (see TIMEOUT_SLACK).
        self.deadline = time.monotonic() + self.timeout
        self.ended_at = None  # when supervision saw the child end, or gave up on it
        self.result = False
        self.held = None  # the child's error, emitted at its end (see _child_event)
        self.finished = False  # the child said it is done
        self.killed = None  # why the parent killed the child: timeout, cancelled, output_limit
        self.over_limit = False
        self.exit_code = None
        self.signal = None

    # -- output accounting ---------------------------------------------------------------

    def used(self):
        return self.h.out.written - self.start_written

    def emit(self, event, line=None):
        event["execution_id"] = self.eid
        if event["type"] == "final_result":
            self.result = True
        self.h.out.write(line or _encode(event))

    def emit_limited(self, event):
        """Emits a script-produced event unless it would pass the output budget."""
        if self.over_limit:
            return False
        event["execution_id"] = self.eid
        line = _encode(event)  # once: the budget is counted on the line that is sent
        if self.used() + len(line) > self.budget:
            self.over_limit = True
            return False
        self.emit(event, line)
        return True

    def emit_text(self, stream, text):
        while text and not self.over_limit:
            piece = text[:CHUNK_BYTES]
            room = self.budget - self.used()
            if _encoded_len({"type": stream, "execution_id": self.eid, "text": piece}) > room:
                # Emit the longest prefix that fits, then stop the script.
                lo, hi = 0, len(piece)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if _encoded_len({"type": stream, "execution_id": self.eid, "text": piece[:mid]}) <= room:
                        lo = mid
                    else:
                        hi = mid - 1
                if lo > 0:
                    self.emit({"type": stream, "text": piece[:lo]})
                self.over_limit = True
                return
            self.emit({"type": stream, "text": piece})
            text = text[len(piece):]

    # -- supervision ---------------------------------------------------------------------

    def supervise(self, child):
        h = self.h
        poll = child.poll
        if not h.eof:
            poll.register(h.in_fd, select.POLLIN)
            child.names[h.in_fd] = "stdin"
        hard = self.deadline + HARD_KILL_GRACE
        exited = False
        self._during_run()  # requests that arrived together with the execute
        while not self.finished and not exited and self.killed is None:
            wait = hard - time.monotonic()
            if wait <= 0:
                self.killed = "timeout"
                break
            zygote_gone = "zygote" not in child.names.values()
            timeout_ms = min(wait, 0.25) if zygote_gone else wait
            ready = poll.poll(0)
            if not ready:  # about to wait: what is written so far goes out now
                h.out.flush()
                ready = poll.poll(max(1, int(timeout_ms * 1000)))
            for fd, _ in ready:
                what = child.names.get(fd)
                if what == "stdin":
                    self._stdin(child)
                elif what == "zygote":
                    if not self.h.zygote.pump():  # a script killed it: poll for the end
                        poll.unregister(fd)
                        del child.names[fd]
                    exited = child.ended()
                elif what == "event":
                    self._read_events(child)
                elif what is not None:
                    self._read_text(child, what)
            if zygote_gone and not exited:
                exited = self._orphan_ended(child)
            if self.over_limit and self.killed is None:
                self.killed = "output_limit"
        self.ended_at = time.monotonic()
        # Stop everything of this execution, then relay what was already written.
        self.h._kill_group(child.pid)
        try:
            os.kill(child.pid, signal.SIGKILL)
        except OSError:
            pass
        self._drain_text(child)
        self._read_events(child)
        self._drain_text(child)
        # A child that said it was done exited 0 as far as the script is concerned; it is
        # reaped after script_done, off the critical path.
        status = 0 if self.finished and self.killed is None else self._wait(child)
        self._conclude(child, status)

    def _stdin(self, child):
        h = self.h
        h._read_stdin()
        if h.eof:
            child.poll.unregister(h.in_fd)
            child.names.pop(h.in_fd, None)
        self._during_run()

    def _during_run(self):
        """Answers what may be answered while a script runs; keeps the rest for later."""
        h = self.h
        keep = []
        for req in h.pending:
            kind = req.get("type")
            if kind == "cancel":
                if str(req.get("execution_id") or "") == self.eid and self.killed is None:
                    self.killed = "cancelled"
            elif kind == "ping":
                h.out.send({"type": "pong", "version": HARNESS_VERSION, "nonce": req.get("nonce")})
            elif kind == "reset":
                if self.killed is None:
                    self.killed = "cancelled"
                keep.append(req)
            elif kind == "execute":
                other = str(req.get("execution_id") or "")
                h.out.send({"type": "error", "execution_id": other, "kind": "infrastructure", "error": "harness is busy with execution %s" % self.eid})
                h.out.send({"type": "script_done", "execution_id": other, "exit_code": None, "signal": None, "duration_ms": 0, "nonce": req.get("nonce")})
            else:
                keep.append(req)
        h.pending[:] = keep

    def _read_text(self, child, stream):
        fd = child.fds.get(stream)
        if fd is None:
            return
        for _ in range(READS_PER_PASS):
            try:
                data = os.read(fd, CHUNK_BYTES)
            except BlockingIOError:
                return
            except OSError:
                return
            if not data:
                self._close_fd(child, stream)
                return
            text = self.decoders[stream].decode(data)
            if text:
                self.emit_text(stream, text)
            if len(data) < CHUNK_BYTES or self.over_limit:
                return

    def _drain_text(self, child):
        for stream in ("stdout", "stderr"):
            for _ in range(64):  # bounded: a grandchild may keep writing
                before = self.used()
                self._read_text(child, stream)
                if self.used() == before or self.over_limit:
                    break

    def _close_fd(self, child, name):
        fd = child.fds.pop(name, None)
        if fd is not None:
            try:
                child.poll.unregister(fd)
            except KeyError:
                pass
            try:
                os.close(fd)
            except OSError:
                pass

    def _read_events(self, child):
        fd = child.fds.get("event")
        if fd is None:
            return
        buf = child.evbuf
        for _ in range(READS_PER_PASS):
            try:
                data = os.read(fd, EVENT_READ)
            except (BlockingIOError, OSError):
                break
            if not data:
                self._close_fd(child, "event")
                break
            buf += data
            if b"\n" not in data and len(buf) > max(self.budget - self.used(), 0) + EVENT_READ:
                # A line longer than what may still be sent could never be sent: the
                # script is over its output limit, and nothing more is kept.
                buf.clear()
                self.over_limit = True
                return
            if b"\n" in data:
                break
        end = buf.rfind(b"\n")
        if end < 0:
            return
        # The child flushes its output before it writes an event, so everything it
        # printed before the events just read is in the output pipes now: relay it
        # first. (Draining before the read would race with the child's writes.)
        self._drain_text(child)
        lines = bytes(buf[:end]).split(b"\n")
        del buf[: end + 1]
        for line in lines:
            if line:  # empty: the newline the child puts before its end (see _run_script)
                self._child_event(line)

    def _child_event(self, line):
        try:
            ev = json.loads(line)
            kind = ev.get("type")
        except (ValueError, AttributeError):
            self.emit_limited({"type": "log", "level": "warning", "message": "harness: dropped a malformed event line from the script"})
            return
        if kind == "_done":
            self.finished = True
            return
        if kind == "_warm":
            return
        if kind not in CHILD_EVENT_TYPES:
            self.emit_limited({"type": "log", "level": "warning", "message": "harness: dropped an event of unknown type %r from the script" % (kind,)})
            return
        clean = {"type": kind}
        if kind in ("intermediate", "final_result"):
            clean["data"] = ev.get("data")
            if kind == "intermediate":
                clean["label"] = str(ev.get("label", ""))
        elif kind == "log":
            clean["level"] = str(ev.get("level", "info"))
            clean["message"] = str(ev.get("message", ""))
        else:
            clean["kind"] = self._error_kind(ev.get("kind"))
            clean["error"] = str(ev.get("error", ""))
            if clean["kind"] == "timeout":
                clean["error"] = "Script timed out after %s" % _fmt_seconds(self.timeout)
            if ev.get("traceback"):
                clean["traceback"] = str(ev["traceback"])
        if kind == "final_result" and time.monotonic() > self.deadline + TIMEOUT_SLACK:
            self.emit_limited({"type": "log", "level": "warning", "message": "harness: dropped a result that came after the script's timeout"})
            return
        if kind == "error":
            # Held until the child's end, which may turn it into a timeout: a script
            # must not be able to pass an overrun off as its own error by sending one
            # early and then running on.
            if self.held is None:
                self.held = clean
            return
        if kind == "final_result" and self.result:
            return  # one result per execution
        self.emit_limited(clean)

    def _error_kind(self, claimed):
        """The kind of an error the child reports: a timeout only once the parent's own
        clock says so, and a timeout whatever it says once the slack is past; otherwise
        the script's own failure. The child is the script's process: any other kind it
        claims (crashed, oom, infrastructure...) would let a script steer the host."""
        now = time.monotonic()
        if now > self.deadline + TIMEOUT_SLACK or claimed == "timeout" and now >= self.deadline:
            return "timeout"
        return "script"

    def _orphan_ended(self, child):
        """Whether a child whose zygote died has ended: it is ours to reap by now."""
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            return not _pid_exists(child.pid)
        if pid == child.pid:
            child.status = status
            return True
        return False

    def _wait(self, child):
        if not child.ended():
            child.status = self.h.zygote.wait(child.pid)
        return child.status

    def _conclude(self, child, status):
        code = sig = None
        for stream, dec in self.decoders.items():
            tail = dec.decode(b"", final=True)
            if tail:
                self.emit_text(stream, tail)
        if status is not None:
            if os.WIFEXITED(status):
                code = os.WEXITSTATUS(status)
            elif os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
        self.exit_code, self.signal = code, sig
        late = self.ended_at is not None and self.ended_at > self.deadline + TIMEOUT_SLACK
        limit = {"type": "error", "kind": "output_limit", "error": "Output limit exceeded: the script wrote more than %d bytes" % (self.budget + OUTPUT_RESERVE)}
        if self.killed == "timeout" or late and self.killed is None:
            self.emit({"type": "error", "kind": "timeout", "error": "Script timed out after %s" % _fmt_seconds(self.timeout)})
        elif self.killed == "cancelled":
            self.emit({"type": "error", "kind": "cancelled", "error": "Execution cancelled"})
        elif self.killed == "output_limit":
            self.emit(limit)
        elif self.held is not None:
            if not self.emit_limited(self.held):
                self.emit(limit)
        elif not self.finished:
            # The child ended without saying it was done: os._exit, a signal, OOM.
            if sig is not None:
                oom_before, oom_after = self.h.oom_kills, self.h.oom.read()
                self.h.oom_kills = oom_after
                if sig == signal.SIGKILL and oom_before is not None and oom_after is not None and oom_after > oom_before:
                    self.emit({"type": "error", "kind": "oom", "error": "Script was killed: out of memory"})
                else:
                    self.emit({"type": "error", "kind": "crashed", "error": "Script process was killed by signal %s" % _signame(sig)})
            elif self.mode == "plan" and not self.result:
                self.emit({"type": "error", "kind": "script", "error": "Script process exited with code %s before calling emit_result()" % code})
            elif code:
                self.emit({"type": "error", "kind": "script", "error": "Script process exited with code %s" % code})
        elif not self.result and self.mode == "plan":
            self.emit({"type": "error", "kind": "script", "error": "Script finished without calling emit_result() (plan mode requires a result)"})

    def done(self, started, child):
        ev = {
            "type": "script_done",
            "execution_id": self.eid,
            "exit_code": self.exit_code,
            "signal": _signame(self.signal) if self.signal else None,
            "duration_ms": round((time.monotonic() - started) * 1000, 3),
            "nonce": self.nonce,
        }
        self.h.out.send(ev)
        self.h.out.flush()  # the host waits for it: never behind anything


def _signame(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _protocol_fds():
    """Moves the protocol stream off fds 0 and 1 to descriptors of its own, and puts
    /dev/null on 0 and stderr on 1: what a tool prints at import, or a library writes
    to stdout, goes to the container's log instead of into the protocol."""
    in_fd, out_fd = os.dup(0), os.dup(1)  # not inheritable: no exec'd program gets them
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return in_fd, out_fd


def main():
    sys.exit(Harness(*_protocol_fds()).serve())


if __name__ == "__main__":
    main()
