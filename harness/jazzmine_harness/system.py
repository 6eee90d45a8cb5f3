"""What the harness asks of the kernel beyond the standard library's wrappers
(prctl, close_range), and what it reads in /proc.

The harness reads /proc and wipes the scratch directories after every execution. Each
path it looks up starts at /, and on Docker's fuse-overlayfs storage driver the lookup
checks / through the FUSE daemon (a getxattr of its ACL: a round trip to
fuse-overlayfs). That was ~15 round trips per execution, 4% of the machine's CPU at
240 jobs/s. So these directories are opened once and everything under them is reached
relative to the open descriptor, which never crosses /.
"""

import ctypes
import fcntl
import functools
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
PR_SET_CHILD_SUBREAPER = 36


def nonblock(fd):
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)


@functools.lru_cache(maxsize=None)
def libc():
    """The C library, for what the standard library lacks (prctl, System V IPC)."""
    return ctypes.CDLL(None, use_errno=True)


def prctl(option, value):
    try:
        return libc().prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def dumpable():
    """PR_GET_DUMPABLE: 0 when the process is not dumpable, -1 when it cannot tell."""
    try:
        return libc().prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        return -1


def close_all_but(*keep):
    """Closes every file descriptor but keep, with close_range(2): no /proc/self/fd."""
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 30)


def signame(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


class Dir:
    """A directory held open; path is looked up again only if it was removed, and if
    reopen. Without reopen it is opened now, once."""

    def __init__(self, path, reopen=True):
        self.path = path
        self.fd = None
        self.reopen = reopen
        if not reopen:
            self._open()

    def fileno(self):
        """The open directory, or None if path is not one (or, without reopen, it was
        removed)."""
        if self.fd is not None:
            try:
                if os.fstat(self.fd).st_nlink > 0:
                    return self.fd
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None
        return self._open() if self.reopen else None

    def _open(self):
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        return self.fd


_PROC = Dir("/proc")


def read_proc(name):
    """The contents of /proc/<name>. Raises OSError."""
    dirfd = _PROC.fileno()
    if dirfd is None:
        raise FileNotFoundError("/proc")
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def pid_exists(pid):
    dirfd = _PROC.fileno()
    if dirfd is None:
        return False
    try:
        os.stat(str(pid), dir_fd=dirfd)
        return True
    except OSError:
        return False


def proc_pids():
    dirfd = _PROC.fileno()
    if dirfd is None:
        return []
    return [int(name) for name in os.listdir(dirfd) if name.isdigit()]


def uid_of(pid):
    # /proc/<pid> of a non-dumpable process is owned by root: read the real uid instead.
    try:
        for line in read_proc("%d/status" % pid).split(b"\n"):
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def children():
    """Our direct children, from /proc/self/task/<tid>/children (the parent has one
    thread), or by every process's parent in /proc where that file is missing.

    The kernel reads that file without freezing the children, so a child changing
    state during the read may be missed: Harness._kill_descendants only trusts it
    once every child it killed has been waited for, when nothing is changing any more."""
    me = os.getpid()
    try:
        return [int(p) for p in read_proc("%d/task/%d/children" % (me, me)).split()]
    except OSError:
        pass
    pids = []
    for pid in proc_pids():
        try:
            data = read_proc("%d/stat" % pid)
            if int(data[data.rindex(b")") + 2 :].split()[1]) == me:
                pids.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return pids


def proc_state(pid):
    """The state letter of /proc/<pid>/stat (R, S, T, Z...), or None if pid is gone."""
    try:
        data = read_proc("%d/stat" % pid)
        i = data.rindex(b")") + 2
        return data[i : i + 1].decode()
    except (OSError, ValueError):
        return None


def has_ended(pid):
    """Whether pid is gone or a zombie with nothing of it running. A process whose
    first thread ended alone (exit(2), not exit_group(2)) shows Z in its stat while
    its other threads run on: it has not ended, and a SIGKILL to pid ends them."""
    state = proc_state(pid)
    if state != "Z":
        return state is None
    dirfd = _PROC.fileno()
    if dirfd is None:
        return True
    try:
        fd = os.open("%d/task" % pid, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return True
    try:
        return len(os.listdir(fd)) <= 1  # the first thread, left for its parent to reap
    except OSError:
        return True
    finally:
        os.close(fd)
