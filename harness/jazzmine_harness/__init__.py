"""jazzmine executor harness: the long-lived process inside every sandbox container.

Protocol (one JSON object a line):
  host -> harness on stdin:  execute, cancel, reset, ping
  harness -> host on stdout: ready, intermediate, log, stdout, stderr, final_result,
                             error, script_done, reset_done, pong

The script's author is the attacker (docs/SECURITY.md, the trust model): they have
read this package and run code as our uid until the timeout.

Three kinds of process:
  - the harness (server.Harness): speaks the protocol and supervises; never runs a
    script and, once started, never forks. In a container it is PID 1, not dumpable,
    with no signal handler, and holds the protocol on descriptors of its own (see
    protocol.protocol_fds), so no script can signal it, trace it or reach the stream;
  - the zygote, forked once after the tools are loaded: it only forks children, so the
    memory every child inherits stays as the harness left it (see zygote.zygote_main);
  - a child per execute (child.child_main), forked ahead of its request and warmed up,
    in its own session, so nothing a script does to modules, globals, threads, signal
    handlers or the working directory survives into the next execution.
The harness is the only writer of the protocol stream: a child's events and output reach
it through pipes and it stamps each with the execution id (run.Run); script_done,
reset_done and pong carry the nonce of the request they answer, which no child ever
sees. After every execute it kills what the execution left, checks that nothing it
cannot undo was changed (the zygote's limits, a tree too deep to wipe: see
limits.Retire), wipes the scratch directories (scratch), has the next child forked and
warmed up, and says reset_done, unasked: the host lends the container again then. When
the container must not serve again, the harness says no reset_done and exits with code 3.

The modules, each one concern:
  protocol  the protocol's names (held to Go's by a Go test), its framing, its stream
  config    the tools directory and what is wiped, from the environment
  system    prctl, descriptors, and what the harness reads in /proc
  limits    what a script may change and the harness cannot undo (Retire), OOM kills
  scratch   the wipe of the scratch directories and System V IPC
  tools     loading the tools
  child     the child: runs one script and sends its events
  egress    the child's relay to the egress proxy's socket
  zygote    the fork server, and the harness's side of it
  run       one execution as the parent supervises it
  server    the executor loop: requests, executions, resets
Importing the package imports every module of it, before the protocol's descriptors
are moved and any execution begins: the harness imports nothing of its own later.

Standard library only; Python 3.11+.
"""

from .server import main

__all__ = ["main"]
