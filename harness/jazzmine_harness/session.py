"""Sessions, the parent's side: the child that runs a session's calls, kept between
them, and the session's loss.

A session's calls ({"type":"execute",...,"session":true}) run one after another in one
child (child._serve_session), which keeps the script's globals, modules, cwd, threads
and processes between them. Between its calls the parent kills nothing and wipes
nothing: what the session left is its own. A call ends when the child says it is done
(run.Run.kept): its artifacts are collected with the session's processes running,
out/ is emptied of what was sent (an outbox), and reset_done says "ready" without a
reset.

A call whose child the parent had to kill (its hard deadline, a cancel, the output
limit) or that died ends as a stateless execution does (everything of it killed,
artifacts collected, the workspace wiped), and the session is lost: every later
session execute is answered with a session_lost error without running, never with a
silent, empty session. A non-session execute or a reset ends the session: its child
and every process it left are killed and the workspace is wiped (the reset's, or the
one before the non-session execute).

The trust boundary does not move: the parent is the only writer of the protocol and
stamps the call's events with the call's id; the child gets each request without its
nonce; the child is the zygote's, forked before any script ran; and what a script
cannot undo (limits.Retire) is checked after every call and at the reset that ends
the session."""

import os

from . import artifacts
from . import protocol as p
from .run import HARD_KILL_GRACE


def lost_error(why):
    """The error of a session execute after its session was lost, why."""
    return {"type": p.ERROR, "kind": p.KIND_SESSION_LOST, "error": "session lost: " + why}


def died(status):
    """Why a session whose child ended with wait status (or None) was lost."""
    if status is not None and os.WIFSIGNALED(status):
        return "its process died (signal %d)" % os.WTERMSIG(status)
    if status is not None and os.WIFEXITED(status):
        return "its process died (exit code %d)" % os.WEXITSTATUS(status)
    return "its process died"


def why_lost(run):
    """Why the session of run (run.Run), a call the parent did not keep, was lost."""
    if run.killed == p.KIND_TIMEOUT:
        return "its process was killed at the timeout"
    if run.killed == p.KIND_CANCELLED:
        return "its call was cancelled"
    if run.killed == p.KIND_OUTPUT_LIMIT:
        return "its process was killed at the output limit"
    if run.signal is not None:
        return "its process died (signal %d)" % run.signal
    if run.exit_code is not None:
        return "its process died (exit code %d)" % run.exit_code
    return "its process died"


class Session:
    """The session a harness holds, if any: child runs its calls (None when there is
    none), lost says why it was lost (None when it was not)."""

    def __init__(self, harness):
        self.h = harness
        self.child = None
        self.lost = None

    def end(self, why=None):
        """Kills the session's child and its process group; the caller then kills what
        else the session left and wipes (server.Harness.reset). why, when given, is
        why a later session execute finds the session lost; None forgets the session
        (a reset)."""
        if self.child is not None:
            self.h.kill_child(self.child)
            self.child = None
            self.lost = why
        elif why is None:
            self.lost = None
        self.h.inputs.replace = False

    def execute(self, run, req, started):
        """Runs a session execute: its call in the session's child (the warm child,
        for the session's first), or a session_lost error."""
        h = self.h
        refused = h.inputs.take(run.eid) or h.missing_secrets(req)
        if self.child is not None and not self._alive():
            self.end(died(self.child.status))  # between two calls
        if self.lost is not None:
            run.emit(lost_error(self.lost))
            run.done(started, None)
            h.reset()  # what is left of a session lost just now, the input files written for it
            return
        if refused is not None:
            run.emit(refused)
            run.done(started, None)
            if self.child is None:
                h.reset()  # the session's files, if any, are the session's
            return
        if self.child is None:
            child = h.start_child(run, req, started, keep_open=True)
            if child is None:
                return
        else:
            child = self.child
            if not h.dispatch(child, req, run.deadline + HARD_KILL_GRACE, keep_open=True):
                self.end("its process did not take the request")
                run.emit(lost_error(self.lost))
                run.done(started, None)
                h.reset()
                return
        self.child = child
        run.supervise(child, session=True)
        if run.kept():
            self._after_call(run, req, started)
            return
        self.child = None
        self.lost = why_lost(run)
        h.inputs.replace = False
        h.finish(run, child, req, started)

    def _alive(self):
        """Whether the session's child is still there, between two calls."""
        if not self.h.zygote.pump():
            self.h.zygote.check()  # gone: retires the harness
        return not self.child.ended()

    def _after_call(self, run, req, started):
        """Ends a call whose child is kept: its artifacts, with the session's processes
        running, then out/ emptied of them, then script_done. Then the checks of what a
        script cannot undo, as after every execution."""
        h = self.h
        self.h.inputs.replace = True
        requested = req.get("artifacts") if isinstance(req.get("artifacts"), list) else []
        workspace = h.workspace.fileno() if h.workspace is not None else None
        h.warn_stray(run, requested)
        if workspace is not None and run.collects() and artifacts.wanted(workspace, requested):
            artifacts.empty_outbox(workspace, artifacts.collect(run, workspace, requested))
        run.done(started, self.child)
        h.zygote.check()
        h.reap()
        h.limits.check("the harness")
        h.zygote_limits.check("the zygote")
        h.oom_kills = h.oom.read()  # the next call's baseline: see run.Run._conclude
