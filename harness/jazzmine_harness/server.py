"""The harness's executor loop: it reads the host's requests, writes the input files
that come before an execute (inputs), has each execute run in a child and supervised
(run.Run), collects its artifacts once nothing of it runs (artifacts), and after each
one kills what the execution left, checks what it cannot undo, wipes the scratch
directories and says reset_done. A session's calls run in a child kept between them,
with nothing killed or wiped until the session ends (session)."""

import json
import os
import select
import signal
import sys
import time

from . import artifacts, config, hints, system
from . import protocol as p
from .inputs import Inputs
from .limits import CpuCounter, Limits, OomCounter, Retire, memory_limit
from .run import HARD_KILL_GRACE, Run
from .scratch import Scratch, SysvIpc
from .session import Session
from .tools import tool_specs
from .zygote import Child

# Longest wait, on reset, for the next child to finish warming up.
WARM_WAIT = 0.5

# Rounds of SIGKILL to every leftover process of the container (about 1 ms each) before
# the container is retired with something still running.
KILL_ROUNDS = 1000

# Longest request line taken; the rest of a longer one is dropped, so that a host that
# never sends a newline cannot grow the harness without bound.
MAX_REQUEST_BYTES = 16 << 20


class Harness:
    def __init__(self, in_fd, out_fd, zygote, tools, tool_errors):
        """A harness on the protocol stream in_fd and out_fd, whose children zygote
        forks, with the tools loaded (see boot)."""
        self.in_fd = in_fd
        self.out = p.Out(out_fd)
        self.inbuf = bytearray()
        self.discarding = False  # inside a request line over MAX_REQUEST_BYTES
        self.pending = []  # requests read but not yet handled
        self.tools = tools
        self.tool_errors = tool_errors
        self.warm = None  # the next child, forked ahead of its request
        self.zygote = zygote
        # The cgroup's OOM-kill count when no script was running: a script killed by
        # SIGKILL while it rose ran out of memory. Read off the critical path.
        self.oom_kills = None
        self.oom = OomCounter()
        self.cpu = CpuCounter()
        self.memory_limit = memory_limit()
        self.sysv = SysvIpc() if config.IN_CONTAINER else None
        self.scratch = [Scratch(d) for d in config.WIPED]  # opened before any script runs
        # The workspace, where input files go and artifacts come from: opened once, before
        # any script runs, and never looked up again (a script could put a link there).
        self.workspace = system.Dir(config.WORKSPACE, reopen=False) if config.WORKSPACE else None
        self.inputs = Inputs(self.workspace)
        self.session = Session(self)  # the session the harness holds, if any
        self.limits = self.zygote_limits = None
        self.idle_poll = select.poll()
        self.eof = False

    # -- startup ----------------------------------------------------------------------

    def start(self):
        system.nonblock(self.in_fd)
        self.idle_poll.register(self.in_fd, select.POLLIN)
        self.oom_kills = self.oom.read()
        artifacts.init()
        self.limits, self.zygote_limits = Limits(os.getpid()), Limits(self.zygote.pid)
        self.warm = self._fork()
        # The specs are made after the zygote was forked: nothing of them is in what the
        # children start from.
        self.out.send(
            {
                "type": p.READY,
                "version": p.HARNESS_VERSION,
                "python": sys.version.split()[0],
                "pid": os.getpid(),
                "tools": sorted(self.tools),
                "tool_specs": tool_specs(self.tools),
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
        for fd in (req_w, ev_r, out_r, err_r):
            system.nonblock(fd)
        return Child(pid, req_w, ev_r, out_r, err_r, self.zygote)

    # -- main loop --------------------------------------------------------------------

    def serve(self):
        """Serves requests until stdin ends. Returns the exit code: 0, or 3 when the
        container must be retired (see Retire)."""
        code = 0
        try:
            self.start()  # its first fork may find the zygote lost already
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
        self.session.end()
        self.kill_child(self.warm)
        self.warm = None
        self.zygote.stop()
        try:
            self._kill_leftovers()
        except Retire as e:  # the container goes anyway
            sys.stderr.write("harness: %s\n" % e)
            code = 3
        return code

    def _handle(self, req):
        kind = req.get("type")
        nonce = req.get("nonce")
        if kind == p.EXECUTE:
            self._execute(req)
            # Every execute ends with the reset the host would ask for, unasked: the host
            # lends the container again at this reset_done without a round trip of its own.
            self._reset_done(nonce)
        elif kind == p.FILE:
            self.inputs.file(req)
        elif kind == p.CHUNK:
            self.inputs.chunk(req)
        elif kind == p.RESET:
            self.inputs.discard()
            self.session.end()
            self.reset()
            self._reset_done(nonce)
        elif kind == p.PING:
            self.out.send({"type": p.PONG, "version": p.HARNESS_VERSION, "nonce": nonce})
        elif kind == p.CANCEL:
            pass  # nothing is running: a late cancel is harmless
        else:
            self.out.send({"type": p.LOG, "level": "warning", "message": "harness: unknown request type %r" % (kind,)})

    def _reset_done(self, nonce):
        """Says reset_done, answering the request of nonce. The host takes it as an
        answer to that request only: the nonce never reaches a script. After an
        execute (which leaves no warm child), it forks the next one."""
        if self.session.child is not None:
            return self._ready(nonce)  # the session's child is the next call's
        if self.warm is None:
            self.warm = self._fork()
        # reset_done means ready: the next execute finds a warmed-up child.
        self._await_warm(self.warm, WARM_WAIT)
        self._ready(nonce)

    def _ready(self, nonce):
        self.out.send({"type": p.RESET_DONE, "nonce": nonce})
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
            if p.WARM_LINE in child.evbuf:
                child.evbuf = child.evbuf.replace(p.WARM_LINE, b"", 1)
                child.is_warm = True

    def read_stdin(self):
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
                    self.out.send({"type": p.LOG, "level": "warning", "message": "harness: dropped a request line over %d bytes" % MAX_REQUEST_BYTES})
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
                self.out.send({"type": p.LOG, "level": "warning", "message": "harness: ignored a malformed request: %s" % e})
                continue
            self.pending.append(req)

    def _next_request(self, timeout):
        if self.pending:
            return self.pending.pop(0)
        if self.eof:
            return None
        self.out.flush()
        if self.idle_poll.poll(None if timeout is None else int(timeout * 1000)):
            self.read_stdin()
        return self.pending.pop(0) if self.pending else None

    # -- execute ----------------------------------------------------------------------

    def _execute(self, req):
        eid = str(req.get("execution_id") or "")
        started = time.monotonic()
        run = Run(self, eid, req)
        if req.get("session") is True:
            self.session.execute(run, req, started)
            return
        refused = self._end_session() or self.inputs.take(eid) or self.missing_secrets(req)
        if refused is not None:
            run.emit(refused)
            run.done(started, None)
            self.reset()  # the input files written
            return
        child = self.start_child(run, req, started)
        if child is not None:
            run.supervise(child)
            self.finish(run, child, req, started)

    def _end_session(self):
        """Before a non-session execute: ends the session the harness holds, if any,
        kills what it left and wipes, so that the execute finds nothing of it. Input
        files sent for the execute were written into the session's workspace, and are
        wiped too: then the input_file error that stops it."""
        if self.session.child is None:
            return None
        self.session.end("it was ended by a non-session execute")
        written = self.inputs.path
        self.inputs.discard()
        self.reset()
        if written is None:
            return None
        return {"type": p.ERROR, "kind": p.KIND_INPUT_FILE, "error": "input file %s: written into a session's workspace, wiped when the session ended" % written}

    def start_child(self, run, req, started, keep_open=False):
        """The warm child (or, failing it, a new one) with req dispatched to it, or None
        when none could take it: then the execution has ended (a crashed error)."""
        child = self.warm
        self.warm = None  # the next one is forked by _reset_done, after the reset
        deadline = run.deadline + HARD_KILL_GRACE
        if child is None or not self.dispatch(child, req, deadline, keep_open):
            self.kill_child(child)
            child = self._fork()
            if not self.dispatch(child, req, deadline, keep_open):
                run.emit({"type": p.ERROR, "kind": p.KIND_CRASHED, "error": "harness could not start the script process"})
                self.kill_child(child)
                run.done(started, None)
                self.reset()
                return None
        return child

    def finish(self, run, child, req, started):
        """Ends an execution whose child is not kept: kills everything of it, collects
        its artifacts, says script_done and wipes."""
        requested = req.get("artifacts") if isinstance(req.get("artifacts"), list) else []
        workspace = self.workspace.fileno() if self.workspace is not None else None
        collect = workspace is not None and run.collects() and artifacts.wanted(workspace, requested)
        if collect:
            try:
                # Nothing of the execution may run, or change a file, while it is read.
                self._after_execution(child)
                self._kill_leftovers()
            except Retire:
                run.done(started, child)
                raise
            self.warn_stray(run, requested)
            artifacts.collect(run, workspace, requested)
        else:
            self.warn_stray(run, requested)
        run.done(started, child)
        if not collect:
            self._after_execution(child)
        self.reset()

    def warn_stray(self, run, requested):
        """Warns, in the execution's events, of the files it wrote in the workspace
        outside out/ and the requested paths: they do not come back."""
        if self.workspace is not None:
            names = artifacts.stray(self.workspace.fileno(), run.since, requested)
            if names:
                run.warn(hints.not_returned(names))

    def missing_secrets(self, req):
        """The error of an execute whose required secrets are not all set, or None."""
        missing = [k for k in (req.get("required_secrets") or []) if not os.environ.get(str(k))]
        if not missing:
            return None
        return {"type": p.ERROR, "kind": p.KIND_MISSING_SECRETS, "error": "Missing required secrets: " + ", ".join(sorted(map(str, missing)))}

    def dispatch(self, child, req, deadline, keep_open=False):
        """Writes req to child's request pipe, by deadline (time.monotonic), and closes
        the pipe unless keep_open (a session's child reads its next call there).
        Whether the child took it. The pipe is non-blocking: a session's own thread
        may fill it, and must not hang the harness."""
        # Encoded again without the nonce: the script must never learn it.
        data = (json.dumps({k: v for k, v in req.items() if k != "nonce"}, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
        try:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(child.req_w, view):]
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [child.req_w], [], left)[1]:
                        return False
            if not keep_open:
                os.close(child.req_w)
                child.req_w = None
            return True
        except OSError:
            return False

    def _after_execution(self, child):
        self.kill_group(child.pid)
        child.close()
        self.zygote.check()
        if not child.ended():
            child.status = self.zygote.wait(child.pid)
        self.reap()
        self._kill_descendants()

    def kill_group(self, pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass

    def kill_child(self, child):
        if child is None:
            return
        self.kill_group(child.pid)
        try:
            os.kill(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.close()
        if not child.ended():
            child.status = self.zygote.wait(child.pid)

    def reap(self):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    # -- reset ------------------------------------------------------------------------

    def reset(self):
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
        if not config.IN_CONTAINER:
            self._kill_descendants()
            return
        # Every other process of the PID namespace but us, the zygote and the warm
        # child: catches anything that escaped our subtree, such as a process a script
        # made the zygote's child (clone's CLONE_PARENT, which seccomp also denies).
        # Zombies are left to their parent, the zygote or us, to reap; a zombie whose
        # other threads run is not one (system.has_ended).
        me, uid = os.getpid(), os.getuid()
        keep = {1, me, self.zygote.pid, self.warm.pid if self.warm else None}
        ended_before = None
        for rounds in range(KILL_ROUNDS + 1):
            others, ended = [pid for pid in system.proc_pids() if pid not in keep], set()
            if others:  # the common case, nothing left, costs one listdir
                others = [pid for pid in others if system.uid_of(pid) == uid]
                ended = {pid for pid in others if system.has_ended(pid)}
                others = [pid for pid in others if pid not in ended]
            # A process that forked and ended since the listing is listed ended, and its
            # child not at all: only the same ended ones twice mean that nothing runs.
            if not others and (not ended or ended == ended_before):
                break
            if rounds == KILL_ROUNDS:
                # Something forks faster than it is killed, or cannot be killed: it
                # would see the next execution.
                raise Retire("processes of an execution outlived %d rounds of kills: %s" % (KILL_ROUNDS, sorted(others or ended)[:8]))
            ended_before = ended
            for pid in others:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.reap()
            time.sleep(0.0005)
        self.reap()

    def _kill_descendants(self):
        """Kills what earlier children left behind: with PR_SET_CHILD_SUBREAPER every
        orphaned descendant (a setsid double fork included) is reparented to us.

        Each killed child is waited for, so its own children have been reparented to us
        by the time the list is read again; the loop ends when the list is empty."""
        for _ in range(10000):
            kids = [pid for pid in system.children() if pid != self.zygote.pid]
            if not kids:
                return
            for pid in kids:
                self.kill_group(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            for pid in kids:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
        raise Retire("orphans of an execution outlived 10000 rounds of kills")
