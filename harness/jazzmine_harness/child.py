"""The child: runs one script, in a process forked from the zygote, and sends its
events to the parent on a pipe of its own (the parent relays them: see run.Run). A
session's child runs its calls one after another in one namespace (see
_serve_session)."""

import io
import json
import os
import select
import signal
import sys
import threading
import traceback

from . import display, egress, system
from . import protocol as p


class ScriptTimeout(BaseException):
    """Raised in the script by SIGALRM. A BaseException so `except Exception` won't eat it."""


class ChildIO:
    """The child's end of the event pipe; serialises writes from the script's threads."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()
        self.dumps = json.dumps  # captured before the script can replace json.dumps

    def send(self, event, what=None, payload=b""):
        """Writes one event line, and payload right after it (a display's image: see
        display). what names the data for the error when it is not JSON."""
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
        self.write(line, payload)

    def write(self, *parts):
        """Writes the parts whole, one after the other: an alarm that fires meanwhile
        waits until they are written, so that a timeout never leaves half an event line
        (or half an image) in the pipe."""
        main = threading.get_ident() == _MAIN_THREAD
        if main:
            _alarm["defer"] += 1
        try:
            with self.lock:
                for data in parts:
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
        io_.send({"type": p.FINAL_RESULT, "data": data}, "emit_result data")
        state["result"] = True

    def emit_intermediate(label, data=None):
        """Streams a partial result to the agent while the script runs."""
        io_.send({"type": p.INTERMEDIATE, "label": str(label), "data": data}, "emit_intermediate data")

    def emit_log(message, level="info"):
        """Sends a diagnostic message without affecting the result."""
        io_.send({"type": p.LOG, "level": str(level), "message": str(message)})

    return {"emit_result": emit_result, "emit_intermediate": emit_intermediate, "emit_log": emit_log, "display": display.make_display(io_)}


_STDLIB = os.path.dirname(os.__file__)
# Every module of the harness's package, and the event loop's machinery.
_HIDDEN_FRAMES = (os.path.dirname(os.path.abspath(__file__)) + "/", os.path.join(_STDLIB, "asyncio"), os.path.join(_STDLIB, "concurrent") + "/")


def script_traceback(e):
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


def child_main(req_fd, ev_fd, out_fd, err_fd, tools):
    """Runs in the forked child. Never returns."""
    code = 0
    try:
        os.setsid()
        # fd 0 is the zygote's /dev/null already. Nothing here looks a path up: see
        # system.Dir for what a lookup costs on Docker's fuse-overlayfs storage driver.
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
        system.close_all_but(0, 1, 2, req_fd, ev_fd)
        io_ = ChildIO(ev_fd)
        egress.start_relay()  # listening before the warm-up: off the job's critical path

        # Warm up while waiting for the request: a dry run through the same code faults
        # in the copy-on-write pages that a real run touches, off the critical path.
        # Skipped when the request is already waiting: then it would only delay it.
        if not select.select([req_fd], [], [], 0)[0]:
            run_script(ChildIO(0), json.loads(_WARM_UP_REQUEST), tools)  # fd 0: /dev/null, read-write
        os.write(ev_fd, p.WARM_LINE)

        requests = Requests(req_fd)
        request = requests.next()
        if request is not None and request.get("session") is True:
            _serve_session(io_, requests, request, tools)
        elif request is not None:
            os.close(req_fd)
            code = run_script(io_, request, tools)
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
    {"type": p.EXECUTE, "execution_id": "warm-up", "script": "emit_log('x')\nemit_result({'a': [1, 2.5, 'x', None]})", "timeout": 30, "mode": p.MODE_PLAN}
)


def warm_up(tools):
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
        run_script(ChildIO(null), json.loads(_WARM_UP_REQUEST), tools)
    finally:
        signal.signal(signal.SIGALRM, alarm)
        os.close(null)


class Requests:
    """The parent's requests on the child's request pipe, one JSON line each: one for
    a stateless child, one per call for a session's."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray()
        self.loads = json.loads  # captured before a session's script can replace it

    def next(self):
        """The next request, or None once the parent has closed the pipe."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[: end + 1]
                if line.strip():
                    return self.loads(line)
                continue
            data = os.read(self.fd, 1 << 16)
            if not data:
                return None
            self.buf += data


def _serve_session(io_, requests, request, tools):
    """Runs a session's calls, one request after another, in one namespace that keeps
    the script's globals, until the parent closes the request pipe (or kills us).

    Each call is a run_script of its own: its alarm, its emit_result, its figures and
    its end (DONE), after which the parent takes the call as done and the child as
    ready for the next. Between calls the alarm is ignored: SIGALRM is the call's
    timeout, and no call runs then."""
    namespace = new_namespace(tools)
    while request is not None:
        try:
            run_script(io_, request, tools, namespace)
        except ScriptTimeout:
            pass  # a SIGALRM from elsewhere during the call's end: its end is written
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        request = requests.next()


def _show_figures():
    """Displays the figures the script left open, when it ended by itself (normally or
    by an exception), still under its alarm. A failure here is reported on stderr and
    changes nothing of the script's outcome, but for a timeout."""
    try:
        display.show_figures()
    except Exception:
        try:
            sys.stderr.write("harness: displaying the figures left open failed:\n" + traceback.format_exc())
        except Exception:
            pass


# The end of a script whose error the script made impossible to encode.
_UNENCODABLE = p.encode({"type": p.ERROR, "kind": p.KIND_SCRIPT, "error": "the script's error could not be encoded"})


def new_namespace(tools):
    """The globals a script starts with: the tools by their names (the helpers are put
    in by each run_script)."""
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    g.update(tools)
    return g


def run_script(io_, req, tools, g=None):
    """Runs the script of req in g, a session's namespace, or in a new one, and sends
    its events and its end. The helpers (emit_result...) are the call's own: put in
    again at each call, emit_result once per call."""
    timeout = float(req.get("timeout") or p.DEFAULT_TIMEOUT)
    mode = req.get("mode") or p.MODE_PLAN
    for key in ("traceparent", "tracestate"):
        if req.get(key):
            os.environ[key.upper()] = req[key]
        else:
            os.environ.pop(key.upper(), None)  # a session's earlier call's is not this one's
    if g is None:
        g = new_namespace(tools)
    g.update(_helpers(io_, mode))

    _alarm.update(defer=0, pending=False, fired=False)
    signal.signal(signal.SIGALRM, _on_alarm)
    error = None
    try:
        code = compile(req.get("script", ""), "<script>", "exec")
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            exec(code, g)
        except ScriptTimeout:
            raise
        except BaseException:
            _show_figures()
            raise
        else:
            _show_figures()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ScriptTimeout:
        error = {"type": p.ERROR, "kind": p.KIND_TIMEOUT, "error": p.timed_out(timeout)}
    except SystemExit as e:
        error = {"type": p.ERROR, "kind": p.KIND_SCRIPT, "error": "Script called sys.exit(%s)" % ("" if e.code is None else repr(e.code))}
    except BaseException as e:
        error = {"type": p.ERROR, "kind": p.KIND_SCRIPT, "error": "%s: %s" % (type(e).__name__, e), "traceback": script_traceback(e)}
    signal.setitimer(signal.ITIMER_REAL, 0)
    if _alarm["fired"] and (error is None or error["kind"] != p.KIND_TIMEOUT):
        # The script caught its timeout and went on: it still ran out of time.
        error = {"type": p.ERROR, "kind": p.KIND_TIMEOUT, "error": p.timed_out(timeout)}
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
            end += _UNENCODABLE
    io_.write(end + p.DONE_LINE)
    return 0
