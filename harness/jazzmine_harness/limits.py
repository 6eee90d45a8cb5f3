"""What a script may change that the harness cannot undo, and the cgroup's counters:
resource limits and scheduling of the harness and the zygote; the OOM-kill counter,
the CPU time and the memory limit of the container."""

import ctypes
import os
import resource

from . import config, system


class Retire(Exception):
    """The container must not serve again: a script changed something the harness
    cannot undo or prove undone. The harness says no reset_done and exits (code 3),
    and the host retires the container."""


# ioprio_get(2) and sched_getattr(2) by architecture: the standard library has no
# wrapper.
_SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine)
_SYS_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}.get(os.uname().machine)

# The size of struct sched_attr with the utilisation clamps (SCHED_ATTR_SIZE_VER1).
_SCHED_ATTR_SIZE = 56


def _ioprio(pid):
    """The I/O priority of pid (ioprio_get, IOPRIO_WHO_PROCESS), or None where the
    system call's number is not known here."""
    if _SYS_IOPRIO_GET is None:
        return None
    return system.libc().syscall(_SYS_IOPRIO_GET, 1, pid)


def _sched(pid):
    """The scheduling attributes of pid: sched_getattr's struct sched_attr (policy,
    flags, nice, priority, the fair class's slice, deadline parameters, utilisation
    clamps), or, where that call's number is not known here or the kernel does not
    answer it (gVisor), the nice value, policy and priority."""
    if _SYS_SCHED_GETATTR is not None:
        attr = ctypes.create_string_buffer(_SCHED_ATTR_SIZE)
        if system.libc().syscall(_SYS_SCHED_GETATTR, pid, attr, _SCHED_ATTR_SIZE, 0) == 0:
            return attr.raw
    return os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority


class Limits:
    """What a process of our uid may change on another of our uid without privilege,
    and a non-dumpable target does not prevent: its resource limits (prlimit), nice
    value (setpriority), scheduling attributes (sched_setattr: policy, priority, the
    fair class's slice, which a review found a script could set for every later
    execution), CPU affinity and I/O priority (ioprio_set). A change to the zygote's
    would pass to every later execution (a lowered hard limit cannot be raised again
    without CAP_SYS_RESOURCE), a change to ours would break the harness: either means
    Retire. Read with one system call each, after every execution."""

    RLIMITS = tuple(getattr(resource, n) for n in sorted(dir(resource)) if n.startswith("RLIMIT_"))

    def __init__(self, pid):
        self.pid = pid
        self.baseline = self.read()

    def read(self):
        try:
            return (
                tuple(resource.prlimit(self.pid, r) for r in self.RLIMITS),
                _sched(self.pid),
                frozenset(os.sched_getaffinity(self.pid)),
                _ioprio(self.pid),
            )
        except OSError:
            return None

    def check(self, what):
        if self.read() != self.baseline:
            raise Retire("a script changed the resource limits or scheduling of %s" % what)


class _CgroupCounter:
    """A counter of a cgroup's flat-keyed file (KEY value lines): the first of paths that
    opens, held open and read again from offset 0 each time (one system call). Only in
    a container: on a host the cgroup is the host's session's, not the harness's."""

    paths = ()
    key = b""

    def __init__(self):
        self.fd = None
        if not config.IN_CONTAINER:
            return
        for path in self.paths:
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                return
            except OSError:
                continue

    def read(self):
        """The count, or None where it cannot be read."""
        if self.fd is None:
            return None
        try:
            data = os.pread(self.fd, 4096, 0)
        except OSError:
            return None
        for line in data.split(b"\n"):
            k, _, v = line.partition(b" ")
            if k == self.key:
                try:
                    return int(v)
                except ValueError:
                    return None
        return None


class OomCounter(_CgroupCounter):
    """The cgroup's OOM-kill counter (v2, then v1)."""

    paths = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
    key = b"oom_kill"


class CpuCounter(_CgroupCounter):
    """The CPU time, in microseconds, that every process of the container used (cgroup
    v2's cpu.stat): what an execution cost, counted by the kernel rather than said by
    the script's own process."""

    paths = ("/sys/fs/cgroup/cpu.stat",)
    key = b"usage_usec"


def memory_limit():
    """The container's memory limit in bytes (cgroup v2's memory.max, then v1's), or None
    where there is none or it cannot be read (on a host)."""
    if not config.IN_CONTAINER:
        return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, "rb") as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 1 << 60:
            return int(value)
        return None
    return None
