"""jazzmine executor harness: the long-lived process inside every sandbox container.

Protocol (one JSON object a line), version 3:
  host -> harness on stdin:  file and chunk (input files, before an execute), execute,
                             cancel, reset, ping
  harness -> host on stdout: ready, intermediate, log, stdout, stderr, display,
                             final_result, error, artifact, script_done, reset_done,
                             pong, and chunk (the bytes of a display image or an
                             artifact, right after its line)

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
    handlers or the working directory survives into the next execution. A session's
    executes ("session": true) are the exception, asked for: they run one after the
    other in one child, kept between them with what they left, until the session is
    ended (a reset, a non-session execute) or lost (see session).
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
  config    the tools directory, the preloads and what is wiped, from the environment
  system    prctl, descriptors, and what the harness reads in /proc
  limits    what a script may change and the harness cannot undo (Retire), OOM kills
  scratch   the wipe of the scratch directories and System V IPC
  tools     loading the tools, and the preloaded modules
  paths     the workspace paths of the protocol, walked without following links
  inputs    the input files, written into the workspace before an execute
  display   display(obj): the child's bundles, the parent's check of them
  mpl       the scripts' matplotlib backend (imports matplotlib only when used)
  child     the child: runs one script and sends its events
  egress    the child's relay to the egress proxy's socket
  zygote    the fork server, and the harness's side of it
  run       one execution as the parent supervises it
  session   a session's calls in one kept child, and the session's loss
  artifacts the files an execution leaves, collected after it, and their limits
  boot      the start, up to the zygote: what every child inherits
  server    the executor loop: requests, executions, resets
Importing the package imports what the zygote and its children run; boot.main imports
the rest (server and what only it uses) once the zygote is forked, so that no child
holds it, and before any script runs: the harness imports nothing of its own later.

Standard library only; Python 3.11+.
"""

from . import mpl  # noqa: F401 (imported by matplotlib only, in a child: imported now like the rest)
from .boot import main

__all__ = ["main"]
