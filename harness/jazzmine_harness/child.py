"""The child: runs one script, in a process forked from the zygote, and sends its
events to the parent on a pipe of its own (the parent relays them: see run.Run). A
session's child runs its calls one after another in one namespace (see
_serve_session)."""

import ast
import io
import json
import os
import resource
import select
import signal
import sys
import threading
import time
import traceback

from . import config, display, egress, hints, system, values
from . import protocol as p
from .tools import CO_COROUTINE, GENERATORS, reseed_one

# The largest JSON form of a last expression's value sent as the execution's result
# (final_result) when the script emits none: a larger value is sent as its text/plain,
# which its execute_result carries too. A notebook's `df` on its last line must not make
# an event the size of the frame, nor take the time of converting it.
IMPLICIT_RESULT_BYTES = 64 << 10


class ScriptTimeout(BaseException):
    """Raised in the script by SIGALRM. A BaseException so `except Exception` won't eat it."""


class ChildIO:
    """The child's end of the event pipe; serialises writes from the script's threads."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()
        self.dumps = json.dumps  # captured before the script can replace json.dumps

    def send(self, event, payload=b""):
        """Writes one event line, and payload right after it (a display's image: see
        display). The event's values are JSON's own types; a lone surrogate in one of
        its strings is escaped (values.escape_surrogates)."""
        text = self.dumps(event, ensure_ascii=False, separators=(",", ":"))
        self._send(text, payload)

    def send_value(self, kind, value, what, budget=None, **fields):
        """Writes an event of type kind whose data is value's JSON form (values.form:
        NoJSONForm names where a part of it has none, what naming the value), with the
        places of its non-finite floats (nonfinite), and fields."""
        form, nonfinite = values.form(value, what, budget)
        head = self.dumps(dict(fields, type=kind), ensure_ascii=False, separators=(",", ":"))
        text = head[:-1] + ',"data":' + form
        if nonfinite:
            text += ',"nonfinite":' + self.dumps(nonfinite, ensure_ascii=False, separators=(",", ":"))
        self._send(text + "}")

    def line(self, event):
        """event as a line of the event pipe, without writing it."""
        return _line(self.dumps(event, ensure_ascii=False, separators=(",", ":"), default=str))

    def _send(self, text, payload=b""):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # what the script printed before this event goes first
            except Exception:
                pass
        # How much of it there is: the parent relays that much before the event, and
        # no more (see run.Run._child_event).
        line = _line(text[:-1] + ',"_o":%d,"_e":%d}' % (_WRITTEN[1].count, _WRITTEN[2].count))
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


class _Counted(io.FileIO):
    """A descriptor of the child's output, which counts the bytes written through it."""

    count = 0

    def write(self, b):
        n = super().write(b)
        if n:
            self.count += n
        return n


# The child's stdout and stderr, as sys.stdout and sys.stderr write them: their counts
# go with each event (ChildIO._send). Made at import, in the harness: every child
# starts from them (a fresh count, as the zygote never writes through them).
_WRITTEN = {1: _Counted(1, "w", closefd=False), 2: _Counted(2, "w", closefd=False)}


def _line(text):
    """text and a newline in UTF-8, a lone surrogate in it escaped."""
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (values.escape_surrogates(text) + "\n").encode("utf-8")


def _helpers(io_, state):
    def emit_result(data=None):
        """Returns data as the execution's final result. Call it once. Any value: see
        the README's contract for the form each kind of value takes."""
        if state["result"]:
            raise RuntimeError("emit_result() may be called only once per execution")
        io_.send_value(p.FINAL_RESULT, data, "emit_result data")
        state["result"] = True

    def emit_intermediate(label, data=None):
        """Streams a partial result to the agent while the script runs."""
        io_.send_value(p.INTERMEDIATE, data, "emit_intermediate data", label=values.escape_surrogates(str(label)))

    def emit_log(message, level="info"):
        """Sends a diagnostic message without affecting the result."""
        io_.send({"type": p.LOG, "level": values.escape_surrogates(str(level)), "message": values.escape_surrogates(str(message))})

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
        sys.stdout = io.TextIOWrapper(_WRITTEN[1], encoding="utf-8", errors="backslashreplace", line_buffering=False)
        sys.stderr = io.TextIOWrapper(_WRITTEN[2], encoding="utf-8", errors="backslashreplace", line_buffering=True)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        system.close_all_but(0, 1, 2, req_fd, ev_fd)
        reseed()
        # The working directory on the path, as IPython and Jupyter have it: a module the
        # job sent as an input file imports (the harness itself runs with -P).
        sys.path.insert(0, "")
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


def reseed():
    """Seeds again, from the kernel's entropy, every generator the harness found when
    it had loaded the tools and the preloaded modules (tools.generators): a fork
    inherits their state, and every execution of a container would draw the same
    numbers, the ones an earlier execution (another tenant's, maybe) drew. That is
    numpy's global RandomState (np.random.rand, pandas' sample without random_state),
    and any random.Random, numpy RandomState or Generator a tool or a module made at
    import; and multiprocessing's authentication key, made at import. random's own
    reseeds itself at a fork, and tempfile's names, uuid, secrets and
    numpy.random.default_rng() read the kernel's entropy anew. Python's hash secret
    cannot change after the interpreter starts: see docs/ANSWERS.md."""
    for g in GENERATORS:
        reseed_one(g)
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)


_WARM_UP_REQUEST = json.dumps(
    {"type": p.EXECUTE, "execution_id": "warm-up", "script": "emit_log('x')\nemit_result({'a': [1, 2.5, 'x', None]})\n6 * 7", "timeout": 30, "mode": p.MODE_PLAN}
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
    timeout, and no call runs then. The calls are a REPL's cells: each is numbered (its
    execute_result's execution_count), and _ holds the last value shown."""
    namespace = new_namespace(tools)
    count = 0
    while request is not None:
        count += 1
        try:
            run_script(io_, request, tools, namespace, count)
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


# The name the value of a cell's last expression is given in its globals while the
# cell runs (compile_cell), taken out again at its end.
_OUT = "__jazzmine_out__"


def compile_cell(source):
    """The code of source, and whether its last statement is an expression to show, as
    IPython runs a cell: its last statement is shown when it is an expression not
    silenced by a trailing semicolon. That statement is compiled as an assignment to
    _OUT, so that the cell is one code object: one compile, and one coroutine when it
    awaits at its top level. A line magic of hints.NOOP_MAGICS (%matplotlib inline) is
    run as `pass`; any other IPython syntax is the SyntaxError it is (hints.for_exception
    says what to do instead)."""
    for _ in range(100):
        try:
            tree = compile(source, "<script>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            break
        except SyntaxError as e:
            stripped = hints.strip_noop_magics(source, e.lineno)
            if stripped is None:
                raise
            source = stripped
    shown = bool(tree.body) and isinstance(tree.body[-1], ast.Expr) and not _silenced(source, tree.body[-1])
    if shown:
        node = tree.body[-1]
        at = {"lineno": node.lineno, "col_offset": node.col_offset, "end_lineno": node.end_lineno, "end_col_offset": node.end_col_offset}
        tree.body[-1] = ast.Assign(targets=[ast.Name(_OUT, ast.Store(), **at)], value=node.value, **at)
    return compile(tree, "<script>", "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), shown


def run_cell(code, shown, g):
    """Runs code (compile_cell's) in g and returns the value of its last expression
    when shown (None otherwise). A cell with a top-level await runs as IPython runs
    it: inside a coroutine on the process's event loop (kept for a session's later
    calls), so that what it starts (a task) runs."""
    g.pop(_OUT, None)
    value = eval(code, g)
    if code.co_flags & CO_COROUTINE:
        _event_loop().run_until_complete(value)
    return g.pop(_OUT, None) if shown else None


def _event_loop():
    """The process's event loop for cells with a top-level await, made at the first."""
    if _loop["loop"] is None:
        import asyncio  # for such cells only: 4 MB that every fork would copy

        _loop["loop"] = asyncio.new_event_loop()
        asyncio.set_event_loop(_loop["loop"])
    return _loop["loop"]


_loop = {"loop": None}


def _silenced(source, node):
    """Whether the expression statement node, the script's last, is followed by a
    semicolon on its line (IPython's DisplayHook.quiet). Its end column is counted in
    UTF-8 bytes."""
    end = node.end_lineno
    start = 0
    for _ in range(end - 1):
        start = source.index("\n", start) + 1
    stop = source.find("\n", start)
    line = source[start : stop if stop >= 0 else len(source)]
    rest = line.encode("utf-8", "surrogatepass")[node.end_col_offset :].decode("utf-8", "surrogatepass")
    return rest.lstrip(" \t\r\f\\").startswith(";")


# The value show_value last put in _, in this process (a session's calls share it).
_shown = {"value": object()}


def show_value(io_, g, value, count, state):
    """Shows value, a script's last expression's, as IPython's displayhook does: nothing
    for None; else an execute_result (Jupyter's mimebundle: text/plain as IPython's
    pretty printer writes it, the object's other _repr_*_ forms, and an image), _ set
    to it, and, when the script emitted no result, a final_result of its JSON form
    (values.form; its text/plain when it has none or a larger one than
    IMPLICIT_RESULT_BYTES), or none when that is larger too."""
    if value is None:
        return
    if "_" not in g or g["_"] is _shown["value"]:
        g["_"] = value  # not when the script set _ itself: IPython leaves it then
    _shown["value"] = value
    try:
        data, image = _scalar_bundle(value) or display.bundle(value)
    except Exception as e:
        # IPython's formatters catch this and show its traceback; the cell succeeds
        # with no Out. Here it goes to stderr, where the model reads it.
        sys.stderr.write("The value of the last expression could not be shown: %s: %s\n" % (type(e).__name__, e))
        return
    event = {"type": p.EXECUTE_RESULT, "data": data, "execution_count": count}
    raw = b""
    if image is not None:
        event["image"] = {"content_type": image[0], "size": len(image[1])}
        raw = image[1]
    io_.send(event, payload=raw)
    if state["result"]:
        return
    try:
        io_.send_value(p.FINAL_RESULT, value, "the last expression's value", IMPLICIT_RESULT_BYTES)
    except Exception:  # NoJSONForm, TooLarge, or whatever the value's own methods raise
        if len(data["text/plain"]) > IMPLICIT_RESULT_BYTES:
            return  # the execute_result carries it: no second copy (plan mode counts the Out)
        io_.send_value(p.FINAL_RESULT, data["text/plain"], "the last expression's text")
    state["result"] = True


# The types whose text/plain is their repr, as IPython's printer writes it, and which
# have no other form: shown without the printer, whose pages a fork would copy.
_SCALARS = (int, float, str, bool, complex)


def _scalar_bundle(value):
    """The bundle of a value of a builtin scalar type (not a subclass: those may have
    _repr_*_ methods), else None."""
    if type(value) in _SCALARS:
        return {"text/plain": p.escape_surrogates(repr(value))}, None
    return None


def _usage(before):
    """The CPU time, in milliseconds, the process used since before (a _cpu(); where
    it can, the harness counts the whole container's in its cgroup instead), and the
    peak resident memory of the process, in KiB."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu = me.ru_utime + me.ru_stime - before
    return round(max(cpu, 0.0) * 1000, 3), me.ru_maxrss


def _cpu():
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def run_script(io_, req, tools, g=None, count=1):
    """Runs the script of req in g, a session's namespace, or in a new one, and sends
    its events and its end. The helpers (emit_result...) are the call's own: put in
    again at each call, emit_result once per call. count numbers the call among a
    session's (its execute_result's execution_count)."""
    timeout = float(req.get("timeout") or p.DEFAULT_TIMEOUT)
    for key in ("traceparent", "tracestate"):
        if req.get(key):
            os.environ[key.upper()] = req[key]
        else:
            os.environ.pop(key.upper(), None)  # a session's earlier call's is not this one's
    if g is None:
        g = new_namespace(tools)
    state = {"result": False}
    g.update(_helpers(io_, state))
    source = req.get("script", "")
    if not isinstance(source, str):
        source = ""
    cpu_before = _cpu()

    _alarm.update(defer=0, pending=False, fired=False)
    signal.signal(signal.SIGALRM, _on_alarm)
    error = None
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            code, shown = compile_cell(source)
            value = run_cell(code, shown, g)
            if shown:
                show_value(io_, g, value, count, state)
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
        # As IPython says it: the script ends there, with this error; the process,
        # and a session, go on.
        error = {"type": p.ERROR, "kind": p.KIND_SCRIPT, "error": "SystemExit" if e.code is None else "SystemExit: %s" % (e.code,)}
    except BaseException as e:
        error = {"type": p.ERROR, "kind": p.KIND_SCRIPT, "error": "%s: %s" % (type(e).__name__, e), "traceback": script_traceback(e)}
        try:
            hint = hints.for_exception(e, source)
        except Exception:
            hint = None
        if hint:
            error["hint"] = hint
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
            end += io_.line(error)
        except BaseException:
            end += _UNENCODABLE
    cpu_ms, peak_kib = _usage(cpu_before)
    end += b'{"type":"_done","cpu_ms":%s,"peak_memory_kib":%d}\n' % (repr(cpu_ms).encode(), peak_kib)
    io_.write(end)
    return 0
