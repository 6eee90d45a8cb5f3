"""One execution as the parent sees it: the child's events and output relayed under
the execution's id, its output budget and its deadline, and its end decided."""

import base64
import codecs
import json
import os
import select
import signal
import time

from . import display, system
from . import protocol as p
from .artifacts import Quota

# Seconds between SIGALRM (the script's own timeout) and the parent's SIGKILL of the
# child's process group, for scripts that block or ignore the alarm or sit in C code.
HARD_KILL_GRACE = 1.0

# Bytes kept in reserve under max_output_bytes for the error and script_done lines that
# end an execution, so that the host's own limit over the whole stream is never reached
# by a well-behaved harness.
OUTPUT_RESERVE = 4096

# Largest stdout/stderr chunk emitted as one event.
CHUNK_BYTES = 32 * 1024

# Seconds past its timeout (counted by the parent from the request's dispatch) after
# which an execution is a timeout whatever its child says: a script that swallows the
# alarm or breaks the event stream cannot turn an overrun into a success.
TIMEOUT_SLACK = 0.25

# Longest event line kept from a child while its newline has not come: past it the
# execution ends at its output limit (the line could never be sent anyway).
# The buffer never holds more than the execution's output budget plus one read. The
# bytes of a display image are not a line: display.Pending bounds them (see display).
EVENT_READ = 1 << 16

# Reads of one pipe in one pass of the supervision loop, so that a script writing
# without pause cannot keep the parent from its deadlines and cancels.
READS_PER_PASS = 16


def out_of_memory(limit):
    """The error of a script the kernel killed for memory, limit the container's (bytes,
    or None where unknown)."""
    if not limit:
        return "Script was killed: out of memory"
    return "Script was killed: out of memory (the sandbox's limit is %d MiB, for the script and everything it started; use less at once, e.g. read a file in chunks)" % (limit >> 20)


def _count(v, kind):
    """v when it is a finite, non-negative number of kind (float or int) below 2**53,
    else None: the child says it, and may say anything."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if not (0 <= v < 2**53):  # NaN fails too
        return None
    return kind(v)


def _nonfinite(places):
    """The places of non-finite floats a child listed beside an event's data (see
    values), when the list is well formed: [[path of keys and indices, "nan" | "inf" |
    "-inf"], ...]; else None, and the floats stay null."""
    if not isinstance(places, list) or not places:
        return None
    for place in places:
        if not (isinstance(place, list) and len(place) == 2 and place[1] in p.NONFINITE and isinstance(place[0], list)):
            return None
        for step in place[0]:
            if not (isinstance(step, str) or isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**53):
                return None
    return places


class Run:
    """One execution as the parent sees it: relays the child's events and output."""

    def __init__(self, harness, eid, req):
        self.h = harness
        self.eid = eid
        self.mode = req.get("mode") or p.MODE_PLAN
        self.timeout = float(req.get("timeout") or p.DEFAULT_TIMEOUT)
        limit = int(req.get("max_output_bytes") or p.DEFAULT_MAX_OUTPUT)
        self.budget = max(limit - OUTPUT_RESERVE, 0)
        self.start_written = harness.out.written
        self.unbudgeted = 0  # bytes of chunk lines written: not in the output budget
        self.quota = Quota(req)  # the artifact limits, display images' and files'
        self.image = None  # a display line whose image bytes are still coming
        self.images = 0  # display images sent: display/<n> is the next one's path
        self.decoders = {
            p.STDOUT: codecs.getincrementaldecoder("utf-8")(errors="replace"),
            p.STDERR: codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        self.nonce = req.get("nonce")
        # The parent's own clock decides timeouts: the child is the script's process
        # and may say anything, or nothing (see TIMEOUT_SLACK).
        self.deadline = time.monotonic() + self.timeout
        self.ended_at = None  # when supervision saw the child end, or gave up on it
        self.result = False
        self.shown = False  # an execute_result was relayed: a result for plan mode too
        self.held = None  # the child's error, emitted at its end (see _child_event)
        self.finished = False  # the child said it is done
        self.session = False  # a session's call: its child is kept once done (see kept)
        self.killed = None  # why the parent killed the child: timeout, cancelled, output_limit
        self.over_limit = False
        self.exit_code = None
        self.signal = None
        # What the execution cost: the container's CPU time from here to its end (the
        # cgroup's counter), or else what the child said of its own (cpu_ms), and the
        # child's peak memory (peak_kib), both from its end's line (see child.run_script).
        self.cpu_before = harness.cpu.read()
        self.since = time.time()  # files of the workspace changed since are the execution's (see Harness.warn_stray)
        self.child_cpu_ms = None
        self.peak_kib = None

    # -- output accounting ---------------------------------------------------------------

    def used(self):
        """Bytes of the output budget used: every line of the execution but chunks."""
        return self.h.out.written - self.start_written - self.unbudgeted

    def answered(self):
        """Whether the execution gave a result: a final_result, or the value of its
        last expression (whose JSON form may be too large to send as one)."""
        return self.result or self.shown

    def emit(self, event, line=None):
        event["execution_id"] = self.eid
        if event["type"] == p.FINAL_RESULT:
            self.result = True
        self.h.out.write(line or p.encode(event))

    def emit_limited(self, event):
        """Emits a script-produced event unless it would pass the output budget."""
        if self.over_limit:
            return False
        event["execution_id"] = self.eid
        line = p.encode(event)  # once: the budget is counted on the line that is sent
        if self.used() + len(line) > self.budget:
            self.over_limit = True
            return False
        self.emit(event, line)
        return True

    def emit_chunk(self, piece):
        """A chunk line carrying piece (bytes, at most p.CHUNK_DATA_BYTES) of the image
        or artifact whose line was just emitted. Outside the output budget."""
        line = p.encode({"type": p.CHUNK, "execution_id": self.eid, "data": base64.b64encode(piece).decode("ascii")})
        self.h.out.write(line)
        self.unbudgeted += len(line)

    def warn(self, message):
        """A warning for the host, within the output budget."""
        self.emit_limited({"type": p.LOG, "level": "warning", "message": message})

    def output_limit(self):
        return {"type": p.ERROR, "kind": p.KIND_OUTPUT_LIMIT, "error": "Output limit exceeded: the script wrote more than %d bytes" % (self.budget + OUTPUT_RESERVE)}

    def collects(self):
        """Whether the execution's artifacts are collected: not when it was cancelled,
        nor when its output budget is spent (no artifact line could be sent)."""
        return self.killed != p.KIND_CANCELLED and not self.over_limit

    def emit_text(self, stream, text):
        while text and not self.over_limit:
            piece = text[:CHUNK_BYTES]
            room = self.budget - self.used()
            if p.encoded_len({"type": stream, "execution_id": self.eid, "text": piece}) > room:
                # Emit the longest prefix that fits, then stop the script.
                lo, hi = 0, len(piece)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if p.encoded_len({"type": stream, "execution_id": self.eid, "text": piece[:mid]}) <= room:
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

    def supervise(self, child, session=False):
        """Relays the child's events and output until it says the script is done, it
        ends, or the parent kills it (timeout, cancel, output limit), then decides the
        execution's end. A session's child that said its call is done is left
        running, as it is, for the next call: see kept."""
        h = self.h
        poll = child.poll
        self.session = session
        if not h.eof:
            poll.register(h.in_fd, select.POLLIN)
            child.names[h.in_fd] = "stdin"
        hard = self.deadline + HARD_KILL_GRACE
        exited = False
        self._during_run()  # requests that arrived together with the execute
        if child.evbuf:  # what a session's processes wrote after its last call's end
            self._take_events(child, child.evbuf)
        while not self.finished and not exited and self.killed is None:
            wait = hard - time.monotonic()
            if wait <= 0:
                self.killed = p.KIND_TIMEOUT
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
                    # The output first, then the events: an event written before any
                    # of it is in the event pipe by then, and relays the output the
                    # child had written before it (see _child_event); the rest after.
                    self._pull_text(child, what)
                    self._read_events(child)
                    self._read_text(child, what, pipe=False)
            if zygote_gone and not exited:
                exited = self._orphan_ended(child)
            if self.over_limit and self.killed is None:
                self.killed = p.KIND_OUTPUT_LIMIT
        self.ended_at = time.monotonic()
        if self.kept():
            # The call is done; the session's child and its processes go on. What it
            # printed before its end is in the pipes: relayed now.
            self._drain_text(child)
            self._conclude(child, 0)
            return
        self._stop(child)

    def kept(self):
        """Whether the execution was a session's call that its child said was done,
        with nothing killed: the child is kept for the next call."""
        return self.session and self.finished and self.killed is None

    def _stop(self, child):
        """Kills the child and everything of its process group, relays what was
        already written, and concludes with how the child ended."""
        # Stop everything of this execution, then relay what was already written.
        self.h.kill_group(child.pid)
        try:
            os.kill(child.pid, signal.SIGKILL)
        except OSError:
            pass
        self._drain_text(child)
        self._read_events(child)
        self._drain_text(child)
        if self.image is not None:  # the child ended before its image did
            image, self.image = self.image, None
            image.keep, image.why = None, "the script ended before its bytes did"
            self._display(image)
        # A child that said it was done exited 0 as far as the script is concerned; it is
        # reaped after script_done, off the critical path.
        status = 0 if self.finished and self.killed is None else self._wait(child)
        self._conclude(child, status)

    def _stdin(self, child):
        h = self.h
        h.read_stdin()
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
            if kind == p.CANCEL:
                if str(req.get("execution_id") or "") == self.eid and self.killed is None:
                    self.killed = p.KIND_CANCELLED
            elif kind == p.PING:
                h.out.send({"type": p.PONG, "version": p.HARNESS_VERSION, "nonce": req.get("nonce")})
            elif kind == p.RESET:
                if self.killed is None:
                    self.killed = p.KIND_CANCELLED
                keep.append(req)
            elif kind == p.EXECUTE:
                other = str(req.get("execution_id") or "")
                h.out.send({"type": p.ERROR, "execution_id": other, "kind": p.KIND_INFRASTRUCTURE, "error": "harness is busy with execution %s" % self.eid})
                h.out.send({"type": p.SCRIPT_DONE, "execution_id": other, "exit_code": None, "signal": None, "duration_ms": 0, "nonce": req.get("nonce")})
            else:
                keep.append(req)
        h.pending[:] = keep

    def _pull_text(self, child, stream):
        """Reads what the child's stream holds, READS_PER_PASS reads at most, into
        child.pulled, without relaying it yet."""
        pulled = child.pulled[stream]
        for _ in range(READS_PER_PASS):
            data = self._read_pipe(child, stream, CHUNK_BYTES)
            if not data:
                return
            pulled += data
            if len(data) < CHUNK_BYTES:
                return

    def _read_pipe(self, child, stream, n):
        """At most n bytes of the child's stream, or b"" when it holds none now (or has
        ended: then its pipe is closed)."""
        fd = child.fds.get(stream)
        if fd is None:
            return b""
        try:
            data = os.read(fd, n)
        except OSError:  # BlockingIOError: nothing now
            return b""
        if not data:
            self._close_fd(child, stream)
        return data

    def _read_text(self, child, stream, upto=None, pipe=True):
        """Relays the child's output of stream, what was pulled first, then what its
        pipe holds (unless not pipe: what it holds may have been written after an
        event not read yet), READS_PER_PASS reads at most, and no byte past the upto'th
        it has written when upto is given."""
        pulled = child.pulled[stream]
        for _ in range(READS_PER_PASS):
            want = CHUNK_BYTES if upto is None else min(CHUNK_BYTES, upto - child.relayed[stream])
            if want <= 0:
                return
            if pulled:
                data = bytes(pulled[:want])
                del pulled[:want]
            elif not pipe:
                return
            else:
                data = self._read_pipe(child, stream, want)
                if not data:
                    return
            child.relayed[stream] += len(data)
            text = self.decoders[stream].decode(data)
            if text:
                self.emit_text(stream, text)
            if self.over_limit:
                return

    def _drain_text(self, child, upto=None):
        """Relays what the child's output pipes hold; with upto (the bytes the child
        says it had written to stdout and stderr), no more than that of each."""
        for stream in (p.STDOUT, p.STDERR):
            for _ in range(64):  # bounded: a grandchild may keep writing
                before = self.used()
                self._read_text(child, stream, None if upto is None else upto[stream])
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
            except OSError:
                break
            if not data:
                self._close_fd(child, "event")
                break
            buf += data
            whole = self.image is not None or b"\n" in data
            if whole:
                self._take_events(child, buf)
                if self.finished and self.session:
                    return  # what follows the call's end is the next call's
            if self.image is None and len(buf) > max(self.budget - self.used(), 0) + EVENT_READ:
                # A line longer than what may still be sent could never be sent: the
                # script is over its output limit, and nothing more is kept.
                buf.clear()
                self.over_limit = True
                return
            if whole and self.image is None:
                break

    def _take_events(self, child, buf):
        """Handles what buf holds whole: event lines, and the image bytes a display line
        announced, which follow it (see display)."""
        drained = False  # once without counts: see _child_event
        while not (self.finished and self.session):  # a session's next call's events stay in buf
            image = self.image
            if image is not None:
                image.take(buf)
                if image.left:
                    return
                self.image = None
                self._display(image)
                continue
            end = buf.find(b"\n")
            if end < 0:
                return
            line = bytes(buf[:end])
            del buf[: end + 1]
            if line:  # empty: the newline the child puts before its end (see child.run_script)
                drained = self._child_event(line, child, drained)

    def _child_event(self, line, child, drained):
        """Relays one line from the child, which is the script's process: whatever it
        holds (not JSON, nested past any parser's limit, a NaN, a lone surrogate, a
        type or a field the protocol does not have) is dropped with a warning or made
        what the protocol carries, never an error of the harness's. Returns whether
        the output pipes were drained for a line without counts.

        What the script printed before the event goes first. The child flushes its
        output before it writes an event, and says how many bytes it had written to
        stdout and stderr then (_o, _e): that much is relayed first, and no more, so
        that what it printed after the event comes after it, even when the parent reads
        several events at once. A line without counts (the script's own writes on the
        pipe) relays what the pipes hold, once for the lines read together."""
        try:
            ev = json.loads(line)
            kind = ev.get("type")
        except Exception:  # ValueError, RecursionError, AttributeError (not an object)...
            self.warn("harness: dropped a malformed event line from the script")
            return drained
        if kind == p.WARM:
            # The child's warm-up, left in the pipe when the execute came before the
            # parent had read it (a busy host): written before the script started, so
            # it relays nothing. Draining the pipes for it, as for a line without
            # counts, put everything the script had printed so far before its events.
            return drained
        upto = {p.STDOUT: ev.get("_o"), p.STDERR: ev.get("_e")}
        if all(isinstance(n, int) and not isinstance(n, bool) for n in upto.values()):
            self._drain_text(child, upto)
        elif not drained:
            self._drain_text(child)
            drained = True
        self._relay(ev, kind)
        return drained

    def _relay(self, ev, kind):
        """Relays the event ev, of type kind, from the child (see _child_event)."""
        if kind == p.DONE:
            self.finished = True
            self.child_cpu_ms, self.peak_kib = _count(ev.get("cpu_ms"), float), _count(ev.get("peak_memory_kib"), int)
            return
        if kind not in p.CHILD_EVENT_TYPES:
            self.warn("harness: dropped an event of unknown type %r from the script" % (kind if isinstance(kind, str) else type(kind).__name__,))
            return
        if kind in (p.DISPLAY, p.EXECUTE_RESULT):
            self.image = display.Pending.parse(ev, lambda size: self.quota.over(1, size))
            return  # sent by _take_events once its image, if any, has come
        clean = {"type": kind}
        if kind in (p.INTERMEDIATE, p.FINAL_RESULT):
            clean["data"] = ev.get("data")
            nonfinite = _nonfinite(ev.get("nonfinite"))
            if nonfinite:
                clean["nonfinite"] = nonfinite
            if kind == p.INTERMEDIATE:
                clean["label"] = str(ev.get("label", ""))
        elif kind == p.LOG:
            clean["level"] = str(ev.get("level", "info"))
            clean["message"] = str(ev.get("message", ""))
        else:
            clean["kind"] = self._error_kind(ev.get("kind"))
            clean["error"] = str(ev.get("error", ""))
            if clean["kind"] == p.KIND_TIMEOUT:
                clean["error"] = p.timed_out(self.timeout)
            if ev.get("traceback"):
                clean["traceback"] = str(ev["traceback"])
            if ev.get("hint") and clean["kind"] == p.KIND_SCRIPT:
                clean["hint"] = str(ev["hint"])
        if kind == p.FINAL_RESULT and time.monotonic() > self.deadline + TIMEOUT_SLACK:
            self.warn("harness: dropped a result that came after the script's timeout")
            return
        if kind == p.ERROR:
            # Held until the child's end, which may turn it into a timeout: a script
            # must not be able to pass an overrun off as its own error by sending one
            # early and then running on.
            if self.held is None:
                self.held = clean
            return
        if kind == p.FINAL_RESULT and self.result:
            return  # one result per execution
        self.emit_limited(clean)

    def _display(self, image):
        """Sends a display line from the child (display.Pending) whose image bytes have
        all come: with its image as chunk lines, or without it and a warning why."""
        if image.data is None:
            self.warn("harness: dropped a malformed display line from the script")
            return
        event = {"type": image.kind, "data": image.data}
        if image.kind == p.EXECUTE_RESULT:
            event["execution_count"] = image.count
        if image.keep is not None:
            n = self.images + 1
            event.update(path="display/%d.%s" % (n, display.IMAGE_TYPES[image.content_type]), content_type=image.content_type, size=len(image.keep))
        if not self.emit_limited(event):
            return
        if image.kind == p.EXECUTE_RESULT:
            self.shown = True
        if image.keep is not None:
            self.images += 1
            self.quota.add(len(image.keep))
            view = memoryview(image.keep)
            for i in range(0, len(view), p.CHUNK_DATA_BYTES):
                self.emit_chunk(view[i : i + p.CHUNK_DATA_BYTES])
        elif image.why:
            self.warn("display image left out: %s" % image.why)

    def _error_kind(self, claimed):
        """The kind of an error the child reports: a timeout only once the parent's own
        clock says so, and a timeout whatever it says once the slack is past; otherwise
        the script's own failure. The child is the script's process: any other kind it
        claims (crashed, oom, infrastructure...) would let a script steer the host."""
        now = time.monotonic()
        if now > self.deadline + TIMEOUT_SLACK or claimed == p.KIND_TIMEOUT and now >= self.deadline:
            return p.KIND_TIMEOUT
        return p.KIND_SCRIPT

    def _orphan_ended(self, child):
        """Whether a child whose zygote died has ended: it is ours to reap by now."""
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            return not system.pid_exists(child.pid)
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
        limit = self.output_limit()
        if self.killed == p.KIND_TIMEOUT or late and self.killed is None:
            self.emit({"type": p.ERROR, "kind": p.KIND_TIMEOUT, "error": p.timed_out(self.timeout)})
        elif self.killed == p.KIND_CANCELLED:
            self.emit({"type": p.ERROR, "kind": p.KIND_CANCELLED, "error": "Execution cancelled"})
        elif self.killed == p.KIND_OUTPUT_LIMIT:
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
                    self.emit({"type": p.ERROR, "kind": p.KIND_OOM, "error": out_of_memory(self.h.memory_limit)})
                else:
                    self.emit({"type": p.ERROR, "kind": p.KIND_CRASHED, "error": "Script process was killed by signal %s" % system.signame(sig)})
            elif self.mode == p.MODE_PLAN and not self.answered():
                self.emit({"type": p.ERROR, "kind": p.KIND_SCRIPT, "error": "Script process exited with code %s before it gave a result" % code, "hint": p.NO_RESULT_HINT})
            elif code or self.session:
                # A session's process that ends takes the session with it: never a
                # success the next call would find lost.
                self.emit({"type": p.ERROR, "kind": p.KIND_SCRIPT, "error": "Script process exited with code %s" % code + (", ending its session" if self.session else "")})
        elif not self.answered() and self.mode == p.MODE_PLAN:
            self.emit({"type": p.ERROR, "kind": p.KIND_SCRIPT, "error": p.NO_RESULT, "hint": p.NO_RESULT_HINT})

    def done(self, started, child):
        ev = {
            "type": p.SCRIPT_DONE,
            "execution_id": self.eid,
            "exit_code": self.exit_code,
            "signal": system.signame(self.signal) if self.signal else None,
            "duration_ms": round((time.monotonic() - started) * 1000, 3),
            "nonce": self.nonce,
        }
        cpu_after = self.h.cpu.read()
        if self.cpu_before is not None and cpu_after is not None:
            ev["cpu_ms"] = round((cpu_after - self.cpu_before) / 1000, 3)
        elif self.child_cpu_ms is not None:
            ev["cpu_ms"] = self.child_cpu_ms
        if self.peak_kib is not None:
            ev["peak_memory_bytes"] = self.peak_kib * 1024
        self.h.out.send(ev)
        self.h.out.flush()  # the host waits for it: never behind anything
