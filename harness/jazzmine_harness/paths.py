"""Workspace paths of the protocol (input files, requested artifacts): the rules a path
follows, and the directories on its way, opened one component at a time relative to
the one before and never through a symbolic link."""

import os
import stat

# The host's limits on a path (and the harness's again: see split).
MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# Mode of the directories made on the way to an input file.
DIR_MODE = 0o755


def split(path):
    """The components of path, a workspace-relative, '/'-separated path. Raises
    ValueError saying why path is not one. The host refuses such paths already; the
    harness refuses them again rather than trust that it did."""
    if not isinstance(path, str) or not path:
        raise ValueError("not a path")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("not valid UTF-8") from None
    if "\x00" in path:
        raise ValueError("a NUL in the path")
    if size > MAX_PATH_BYTES:
        raise ValueError("a path over %d bytes" % MAX_PATH_BYTES)
    if path.startswith("/"):
        raise ValueError("an absolute path")
    names = path.split("/")
    for name in names:
        if name in ("", ".", ".."):
            raise ValueError("an empty, '.' or '..' component")
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise ValueError("a component over %d bytes" % MAX_NAME_BYTES)
    return names


def open_dir(dirfd, names, create=False):
    """The directory dirfd/names[0]/names[1]/..., each component opened relative to
    the one before with O_NOFOLLOW|O_DIRECTORY, and, if create, made (DIR_MODE) where
    it is missing. Returns a new descriptor, the caller's to close. Raises OSError:
    ENOTDIR for a symbolic link or anything else not a directory on the way."""
    fd = os.dup(dirfd)
    try:
        for name in names:
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, DIR_MODE, dir_fd=fd)
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                os.fchmod(sub, DIR_MODE)  # whatever the umask took off
            os.close(fd)
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def what(mode):
    """What a file of mode (st_mode) is, for a message: "a symbolic link", "a FIFO"..."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"
