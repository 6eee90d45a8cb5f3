"""Input files: the file and chunk lines the host sends before an execute, written into
the workspace as they come, and the first thing that went wrong, which the execute
reports (an input_file error) instead of running its script.

They arrive while nothing runs, after the reset that ended the last execution killed
every process of it: nothing but the harness changes the workspace meanwhile. Each
file is still opened relative to directory descriptors walked without following links
(paths.open_dir), and created with O_EXCL|O_NOFOLLOW.

In a session the session's own processes run on between its calls, and the files of
its earlier calls stay: a regular file at an input's path is replaced (unlinked, then
created as above), and anything else there is an error (see Inputs.replace)."""

import base64
import binascii
import errno
import os
import stat

from . import paths
from . import protocol as p

FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# Mode of an input file whose line names none.
DEFAULT_MODE = 0o644


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _reason(e):
    """What an OSError means for an input file, in words."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "does not fit in the workspace"
    if e.errno == errno.EEXIST:
        return "already exists"
    if e.errno in (errno.ENOTDIR, errno.ELOOP):
        return "a component of its path is not a directory"
    return e.strerror or str(e)


class _NotAFile(Exception):
    """What is at an input's path in a session's workspace is not a regular file."""


class Inputs:
    """The input files of the next execute. workspace is the workspace held open
    (system.Dir), or None when the harness has none: then any input is an error."""

    def __init__(self, workspace):
        self.workspace = workspace
        self.fd = None
        # Whether a regular file already at an input's path is replaced: set while a
        # session holds the workspace (its files stay between calls). Otherwise the
        # workspace was wiped before the files came, and one there is an error.
        self.replace = False
        self._clear()

    def _clear(self):
        self._close()
        self.error = None  # the first error, whole: "input file <path>: <reason>"
        self.eid = None  # the execution the files were sent for
        self.path = None  # the last file announced
        self.left = 0  # bytes of the open file still to come

    def _close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _fail(self, reason):
        if self.error is None:
            self.error = "input file %s: %s" % (self.path if self.path is not None else "(none)", reason)
        self._close()

    def file(self, req):
        """A file line: ends the file before it and creates this one."""
        self._end_file()
        if self.error is not None:
            return  # the execute fails anyway: nothing more is written
        path = req.get("path")
        self.path = path if isinstance(path, str) else repr(path)
        eid = str(req.get("execution_id") or "")
        if self.eid is not None and eid != self.eid:
            return self._fail("sent for execution %s after files for %s" % (eid, self.eid))
        self.eid = eid
        size, mode = req.get("size"), req.get("mode")
        if mode is None:
            mode = DEFAULT_MODE
        if not _int(size) or size < 0:
            return self._fail("a size that is not a count of bytes: %r" % (size,))
        if not _int(mode):
            return self._fail("a mode that is not a number: %r" % (mode,))
        try:
            names = paths.split(path)
        except ValueError as e:
            return self._fail(str(e))
        root = self.workspace.fileno() if self.workspace is not None else None
        if root is None:
            return self._fail("the harness has no workspace")
        try:
            parent = paths.open_dir(root, names[:-1], create=True)
            try:
                self.fd = self._create(parent, names[-1], mode & 0o777)
            finally:
                os.close(parent)
            os.fchmod(self.fd, mode & 0o777)  # whatever the umask took off
        except _NotAFile as e:
            return self._fail(str(e))
        except OSError as e:
            return self._fail(_reason(e))
        self.left = size
        if not size:
            self._close()

    def _create(self, parent, name, mode):
        """The new file name in the directory parent, opened for writing. When replace
        (a session's workspace), a regular file already there is unlinked first;
        anything else there is refused (_NotAFile)."""
        try:
            return os.open(name, FILE_FLAGS, mode, dir_fd=parent)
        except FileExistsError:
            if not self.replace:
                raise
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise _NotAFile("already exists and is %s" % paths.what(st.st_mode))
        os.unlink(name, dir_fd=parent)
        return os.open(name, FILE_FLAGS, mode, dir_fd=parent)

    def chunk(self, req):
        """A chunk line: the next bytes of the open file."""
        if self.error is not None:
            return
        if self.fd is None:
            return self._fail("a chunk with no file open")
        data = req.get("data")
        try:
            if not isinstance(data, str):
                raise ValueError("not a string")
            raw = base64.b64decode(data, validate=True)
        except (ValueError, binascii.Error):
            return self._fail("a chunk that is not base64")
        if len(raw) > p.CHUNK_DATA_BYTES:
            return self._fail("a chunk of %d bytes, over %d" % (len(raw), p.CHUNK_DATA_BYTES))
        if len(raw) > self.left:
            return self._fail("more bytes than announced")
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as e:
            return self._fail(_reason(e))
        self.left -= len(raw)
        if not self.left:
            self._close()

    def _end_file(self):
        if self.fd is not None and self.left:
            self._fail("%d bytes fewer than announced" % self.left)
        self._close()

    def take(self, eid):
        """Ends the inputs of the execute of eid: the error event that must stop it, or
        None. The next files are the next execute's."""
        self._end_file()
        error = self.error
        if error is None and self.eid is not None and self.eid != eid:
            error = "input file %s: sent for execution %s, not %s" % (self.path, self.eid, eid)
        self._clear()
        if error is None:
            return None
        return {"type": p.ERROR, "kind": p.KIND_INPUT_FILE, "error": error}

    def discard(self):
        """Forgets the inputs (a reset): the wipe that follows removes their files."""
        self._clear()
