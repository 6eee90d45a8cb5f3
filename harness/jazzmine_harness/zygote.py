"""The zygote, the fork server: forked once by the harness after the tools are loaded,
before any execution, it forks a child for each execution and reports how each ended.
Zygote is the harness's side of it, Child one child as the harness sees it."""

import os
import select
import signal
import socket
import struct
import time
import traceback

from . import config, system
from . import protocol as p
from .child import child_main
from .limits import Retire

# Seconds to wait for the zygote to answer a fork request.
FORK_WAIT = 5.0

# Seconds to wait for the zygote to report a killed child's end.
REAP_WAIT = 5.0

# How often a wait on the zygote looks whether it was stopped meanwhile (see check):
# a fork request then fails at once, a wait for a child's end gives up.
CHECK_EVERY = 0.05

# The zygote's messages to the harness: a kind, a pid and a wait status.
_ZMSG = struct.Struct("=cii")


def zygote_main(sock, tools):
    """The zygote: forks the children, and reports how each ended. Never returns.

    It runs nothing but this loop, so its memory stays as the harness left it when it
    forked the zygote. A fork copies no page; it marks them copy-on-write in both
    processes, and every page the forking process writes afterwards is copied, one
    fault each (measured in a container here: ~270 faults, ~1.5 ms of CPU, per
    execution when the harness forked its children itself). This loop writes to a
    handful of pages; the harness, which never forks again, to none it shares."""
    code = 0
    try:
        system.prctl(system.PR_SET_PDEATHSIG, signal.SIGKILL)  # the harness gone, so are we
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the children's stdin, and where their warm-up run writes
        os.dup2(null, 1)
        # Nothing of the harness's but the socket to it: not the protocol stream, not
        # the directories and counters it holds open.
        system.close_all_but(0, 1, 2, sock.fileno())
        # What every child starts in, set here once rather than looked up in each.
        if config.WORKSPACE:
            try:
                os.chdir(config.WORKSPACE)
            except OSError:
                pass
        if config.TMPDIR:
            os.environ["TMPDIR"] = config.TMPDIR
        wake_r, wake_w = os.pipe()
        system.nonblock(wake_r)
        system.nonblock(wake_w)
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
                    child_main(*fds, tools)
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


class ZygoteLost(Retire):
    """The zygote died, stopped or stopped answering: a script reached it. It is never
    forked again from the harness, whose memory has held executions' data."""


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
            zygote_main(theirs, self.tools)
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
                kind, pid, status = self._recv(min(left, CHECK_EVERY))
                if kind == b"P":
                    # An end reported for an earlier process of this pid (one the
                    # zygote reaped but no child of ours) is not this child's.
                    self.ended.pop(pid, None)
                    return pid
                if kind is None:
                    self.check()
        except OSError as e:
            raise ZygoteLost("the zygote is gone: %s" % e) from None

    def check(self):
        """Raises ZygoteLost if the zygote was stopped or killed: what a script of our
        uid can do to it. Called after each execution, before anything waits on it, and
        every CHECK_EVERY while something does: a SIGSTOP the script sent takes effect
        only once the zygote is scheduled, which on a busy host may be after the first
        check."""
        if self.lost():
            raise ZygoteLost("the zygote was stopped or killed during the execution")

    def lost(self):
        """Whether the zygote is stopped, traced or gone."""
        return system.proc_state(self.pid) in (None, "T", "t", "Z", "X")

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
                if self._recv(min(left, CHECK_EVERY))[0] is None and self.lost():
                    return None  # it reports nothing more; the check after the run says why
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
                if not system.pid_exists(pid):
                    return None
            time.sleep(0.001)
        return None


class Child:
    """A forked zygote, waiting for its request or running it."""

    def __init__(self, pid, req_w, ev_r, out_r, err_r, zygote):
        self.pid = pid
        self.req_w = req_w
        self.fds = {"event": ev_r, p.STDOUT: out_r, p.STDERR: err_r}
        self.zygote = zygote
        self.status = None  # wait status once reaped
        self.evbuf = bytearray()  # event bytes read but not yet parsed
        self.relayed = {p.STDOUT: 0, p.STDERR: 0}  # bytes relayed of each output: a session's calls go on counting
        self.pulled = {p.STDOUT: bytearray(), p.STDERR: bytearray()}  # bytes read from each output pipe, not yet relayed
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
