"""The harness's start, up to the zygote: what every child inherits. The modules that
the harness alone runs (its loop, the runs it supervises, the wipe, input files and
artifacts) are imported after the zygote is forked, so that no child starts with them
or could reach them: 0.8 MB less for every fork to copy and every exit to unmap
(docs/PERFORMANCE.md)."""

import gc
import os
import signal
import sys

from . import config, display, hints, system
from . import protocol as p
from .child import warm_up
from .tools import find_generators, load_tools, preload
from .zygote import Zygote


def main():
    in_fd, out_fd = p.protocol_fds()
    tools, tool_errors = prepare()
    zygote = Zygote(tools)
    # Still before any script runs, from the image's read-only files: the exception to
    # "the harness imports nothing of its own in a function" (test_package).
    from . import server

    gc.freeze()  # as the harness had them before: out of its collections' way
    sys.exit(server.Harness(in_fd, out_fd, zygote, tools, tool_errors).serve())


def prepare():
    """Makes the process every child is forked from, but for the zygote's own loop:
    loads the tools and the preloaded modules, warms the interpreter up and freezes
    what it holds. Returns the tools and the errors of loading them."""
    # Same-uid processes (a script's leftovers) may not ptrace us or open /proc/<pid>/mem
    # or /proc/<pid>/fd; orphaned descendants are reparented to us, so reset finds them.
    # Checked: a harness left dumpable would run every script beside a zygote it may read.
    system.prctl(system.PR_SET_DUMPABLE, 0)
    if system.dumpable() != 0:
        sys.exit("harness: could not make itself non-dumpable (prctl): refusing to run scripts")
    system.prctl(system.PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # No handler for anything a process can send: as a container's PID 1 the kernel
    # then drops every signal sent from inside the container, SIGKILL and SIGSTOP
    # too (pid_namespaces(7)). Python's own SIGINT handler would let a script end us.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Before anything imports matplotlib: it reads its backend when imported. Ours is
    # Agg that displays what plt.show() shows, so it replaces a plain Agg (an image's
    # or the sandbox's env) too; any other backend set is the sandbox's own.
    if os.environ.get("MPLBACKEND", "").lower() in ("", "agg"):
        os.environ["MPLBACKEND"] = config.MPLBACKEND
    if config.IN_CONTAINER and not os.environ.get("JAZZMINE_EGRESS_SOCKET"):
        hints.install_network_hints()  # no network: its errors say so (see hints)
    preload_errors = preload(config.PRELOAD)
    display.as_in_a_notebook()
    tools, tool_errors = load_tools(config.TOOLS_DIR)
    find_generators()
    warm_up(tools)
    gc.collect()
    gc.freeze()  # the children never touch the parent's objects' GC headers
    return tools, tool_errors + preload_errors
