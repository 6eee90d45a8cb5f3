"""Where the harness finds its tools, what it preloads and what it wipes, from its
environment."""

import os


def _env_flag(name):
    return os.environ.get(name, "") == "1"


IN_CONTAINER = _env_flag("JAZZMINE_CONTAINER")
TOOLS_DIR = os.environ.get("JAZZMINE_TOOLS_DIR", "/tools")
# Modules the harness imports at start, for every script (tools.preload).
PRELOAD = tuple(name.strip() for name in os.environ.get("JAZZMINE_PRELOAD", "").split(",") if name.strip())
# The scripts' matplotlib backend (see mpl), unless the environment names another.
MPLBACKEND = "module://jazzmine_harness.mpl"


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
# message queues (/dev/mqueue). System V IPC is the other such place: see scratch.SysvIpc.
WIPED = tuple(d for d in (WORKSPACE, TMPDIR) if d) + (("/dev/shm", "/dev/mqueue") if IN_CONTAINER else ())
