"""The wipe after every execution: the scratch directories emptied and given back
their modes and extended attributes, and System V IPC removed."""

import ctypes
import os
import stat
import struct

from . import system
from .limits import Retire

# Deepest directory tree the wipe descends, holding a descriptor per level: a deeper one
# is a script's attempt to outlast it, and retires the container.
WIPE_DEPTH = 256


class Scratch(system.Dir):
    """A directory reset empties, and the mode it had when the harness started: a
    script may chmod it (it owns it) to make the next execution fail."""

    def __init__(self, path):
        super().__init__(path)
        self.mode = None
        fd = self.fileno()
        if fd is not None:
            st = os.fstat(fd)
            if st.st_uid == os.getuid():
                self.mode = stat.S_IMODE(st.st_mode)

    def wipe(self):
        """Empties the directory, dotfiles too, without following links, and gives it
        back its mode. Raises Retire if anything is left.

        It walks the tree iteratively, relative to open directory descriptors, making
        each directory ours (chmod) before it opens it: no recursion limit, no path
        length limit, and no directory a script made unreadable or unsearchable at any
        depth is skipped (shutil.rmtree was: 0o111 directories and paths past PATH_MAX
        outlived it, and a library's files planted under $HOME ran in later
        executions). What it cannot remove, it reports."""
        dirfd = self.fileno()
        if dirfd is None:
            return
        if self.mode is not None:
            if stat.S_IMODE(os.fstat(dirfd).st_mode) != self.mode:
                os.chmod(dirfd, self.mode)
            self._clear_xattrs(dirfd)
        names = os.listdir(dirfd)
        if not names:
            return  # the common case: one listing
        try:
            os.chmod(dirfd, stat.S_IRWXU if self.mode is None else self.mode | stat.S_IRWXU)
        except OSError:
            pass  # /dev/shm and /dev/mqueue are root's, and never ours to lock
        stack = [(dirfd, None, names)]  # (descriptor, name in its parent, entries left)
        try:
            while stack:
                fd, name, left = stack[-1]
                if not left:
                    stack.pop()
                    if name is not None:
                        os.close(fd)
                        try:
                            os.rmdir(name, dir_fd=stack[-1][0])
                        except OSError:
                            pass
                    continue
                entry = left.pop()
                try:
                    st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    try:
                        os.unlink(entry, dir_fd=fd)
                    except OSError:
                        pass
                    continue
                if len(stack) > WIPE_DEPTH:
                    raise Retire("a directory tree in %s deeper than %d levels" % (self.path, WIPE_DEPTH))
                try:
                    os.chmod(entry, stat.S_IRWXU, dir_fd=fd)  # a directory: nothing else runs now
                    sub = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue
                try:
                    stack.append((sub, entry, os.listdir(sub)))
                except OSError:
                    stack.append((sub, entry, []))
        finally:
            for fd, name, _ in stack:
                if name is not None:
                    os.close(fd)
        left = os.listdir(dirfd)
        if left:
            raise Retire("could not empty %s: %d entries left" % (self.path, len(left)))

    # Extended attributes of a scratch directory that a script may set and reset removes.
    XATTRS = ("user.", "system.posix_acl_")

    def _clear_xattrs(self, dirfd):
        """Removes the extended attributes a script set on the directory itself: data
        the next execution could read (user.*), and default ACLs that would give every
        file it creates mode 0 (system.posix_acl_*). One listxattr when there are none.
        Raises Retire if one cannot be removed."""
        try:
            names = [n for n in os.listxattr(dirfd) if n.startswith(self.XATTRS)]
        except OSError:
            return  # the filesystem has none
        for name in names:
            try:
                os.removexattr(dirfd, name)
            except OSError:
                raise Retire("could not remove the extended attribute %s of %s" % (name, self.path)) from None


class SysvIpc:
    """Removes the System V shared memory segments, semaphore sets and message queues
    of our IPC namespace (the container's): they outlive the processes that made them,
    so an execution could leave data to the next. They are listed in /proc/sysvipc,
    whose files are held open and read again from offset 0, and removed with IPC_RMID
    through ctypes: the standard library has no System V IPC. Every process of the
    container runs as our uid, so every object is ours to remove."""

    IPC_RMID = 0
    # The commands that count a kind's objects (SHM_INFO, SEM_INFO, MSG_INFO).
    SHM_INFO, SEM_INFO, MSG_INFO = 14, 19, 12

    def __init__(self):
        self.kinds = []  # (fd, remove(id))
        try:
            libc = system.libc()
        except OSError:
            return
        removers = {
            "shm": lambda i: libc.shmctl(i, self.IPC_RMID, None),
            "sem": lambda i: libc.semctl(i, 0, self.IPC_RMID),
            "msg": lambda i: libc.msgctl(i, self.IPC_RMID, None),
        }
        for kind, remove in removers.items():
            try:
                self.kinds.append((os.open("/proc/sysvipc/" + kind, os.O_RDONLY | os.O_CLOEXEC), remove))
            except OSError:
                continue

    def remove_all(self):
        """Removes every object. Raises Retire where the kernel does not list them (no
        /proc/sysvipc) and some are left."""
        if not self.kinds:
            self._none_left()
            return
        for fd, remove in self.kinds:
            tried = set()
            while True:  # a listing longer than one read is removed in rounds
                try:
                    lines = os.pread(fd, 1 << 16, 0).split(b"\n")[1:]  # the first is a header
                except OSError:
                    break
                ids = set()
                for line in lines:
                    fields = line.split()
                    if len(fields) > 1 and fields[1].isdigit():
                        ids.add(int(fields[1]))  # key, then the id
                ids -= tried  # one that could not be removed is not tried again
                if not ids:
                    break
                for i in ids:
                    remove(i)
                tried |= ids

    def _none_left(self):
        """Where the kernel has no /proc/sysvipc (gVisor), the objects cannot be listed,
        and so not removed: their counts are read instead (the *_INFO commands, one call
        each), and an execution that left any retires the container. Only a script that
        makes them pays, with a container of its own next time."""
        try:
            libc = system.libc()
        except OSError:
            return
        shm = ctypes.create_string_buffer(64)  # struct shm_info: used_ids, then shm_tot (pages)
        sem = (ctypes.c_int * 10)()  # struct seminfo: semusz, the sets, is its 8th field
        msg = (ctypes.c_int * 8)()  # struct msginfo: msgpool, the queues, is its first
        left = []
        if libc.shmctl(0, self.SHM_INFO, shm) >= 0 and struct.unpack_from("=i4xQ", shm.raw)[1] > 0:
            left.append("shared memory")
        if libc.semctl(0, 0, self.SEM_INFO, sem) >= 0 and sem[7] > 0:
            left.append("semaphore sets")
        if libc.msgctl(0, self.MSG_INFO, msg) >= 0 and msg[0] > 0:
            left.append("message queues")
        if left:
            raise Retire("an execution left System V %s, which this kernel does not list (no /proc/sysvipc)" % ", ".join(left))
