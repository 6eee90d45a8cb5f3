"""Artifacts: the files an execution leaves in out/ and at the paths its request names,
collected by the parent once every process of the execution is dead (a session's
call: once the call is done, its session's processes running on), and the limits
they share with the display images (Quota).

The script's author chose every name and type under the workspace, and has read this:
each component is opened relative to its parent's descriptor with O_NOFOLLOW (so no
symbolic link, at any depth, leads out of the workspace), a file is opened with
O_NONBLOCK (a FIFO cannot block the harness) and only what fstat calls a regular file
is read. Everything else is skipped, with a warning the host passes on."""

import mimetypes
import os
import stat

from . import paths
from . import protocol as p

# Where a script leaves its artifacts, under the workspace.
OUT = "out"

# Deepest directory collected, in components under the workspace.
MAX_DEPTH = 32

FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def init():
    """Reads the MIME type tables from the image's files, before any script runs. The
    harness calls it once the zygote is forked: only the harness guesses types, and
    the tables (~0.4 MB) would be copied by every fork (each MB of data the zygote
    holds costs a fork and an exit ~0.03 ms of CPU: docs/PERFORMANCE.md)."""
    mimetypes.init()


class Quota:
    """The artifact limits of an execution (max_artifacts, max_artifact_bytes) and what
    has been sent against them: display images, then the collected files."""

    def __init__(self, req):
        self.max_count = int(req.get("max_artifacts") or p.DEFAULT_MAX_ARTIFACTS)
        self.max_bytes = int(req.get("max_artifact_bytes") or p.DEFAULT_MAX_ARTIFACT_BYTES)
        self.count = 0
        self.bytes = 0

    def over(self, count, size):
        """Why count more files of size bytes in all would pass the limits, or None."""
        if self.count + count > self.max_count:
            return "%d files, at most %d are allowed" % (self.count + count, self.max_count)
        if self.bytes + size > self.max_bytes:
            return "%d bytes, at most %d are allowed" % (self.bytes + size, self.max_bytes)
        return None

    def add(self, size):
        self.count += 1
        self.bytes += size


def wanted(workspace_fd, requested):
    """Whether there may be artifacts: some are asked for, or out/ is there. One fstatat
    when neither, so that an execution that leaves none pays nothing more."""
    if requested:
        return True
    try:
        os.stat(OUT, dir_fd=workspace_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def content_type(path):
    # The leading slash: no name is taken for a URL's scheme ("data:...").
    return mimetypes.guess_type("/" + path)[0] or "application/octet-stream"


def collect(run, workspace_fd, requested):
    """Sends the artifacts of run (run.Run, whose processes are all dead): out/ and the
    requested paths, each regular file once, in sorted order, as an artifact line and
    its chunk lines. Over the limits (run.quota, which the display images used first)
    nothing is sent and run gets an artifact_limit error. Returns the paths sent."""
    files = _Found(run.quota.max_count - run.quota.count)  # path -> size
    try:
        for root in [OUT] + [r for r in requested if r != OUT]:
            _find(workspace_fd, root, files, run.warn)
        why = run.quota.over(len(files), sum(files.values())) or _sparse(workspace_fd, sum(files.values()))
    except _TooMany:  # one more than allowed is enough to say so: the walk stops there
        why = "at least %d files, at most %d are allowed" % (run.quota.count + len(files), run.quota.max_count)
    if why is not None:
        run.emit({"type": p.ERROR, "kind": p.KIND_ARTIFACT_LIMIT, "error": "artifacts: " + why})
        return []
    headers = {path: {"type": p.ARTIFACT, "execution_id": run.eid, "path": path, "size": size, "content_type": content_type(path)} for path, size in files.items()}
    if run.used() + sum(p.encoded_len(h) for h in headers.values()) > run.budget:
        run.emit(run.output_limit())  # their lines would pass max_output_bytes
        return []
    return [path for path in sorted(files) if _send(run, workspace_fd, path, headers[path])]


def empty_outbox(workspace_fd, sent):
    """Removes the files of sent (paths collect sent) that are under out/: a session's
    out/ is an outbox, and what it held has gone out with its call. The requested
    paths outside out/ stay. Each file is unlinked relative to its directory, walked
    without following links; one that cannot be is left (the session's own processes
    run meanwhile, and may have moved it)."""
    for path in sent:
        names = path.split("/")
        if len(names) < 2 or names[0] != OUT:
            continue
        try:
            parent = paths.open_dir(workspace_fd, names[:-1])
        except OSError:
            continue
        try:
            os.unlink(names[-1], dir_fd=parent)
        except OSError:
            pass
        finally:
            os.close(parent)


class _TooMany(Exception):
    """The walk found more files than may be sent."""


class _Found(dict):
    """The files found: path -> size. Past one more than room it stops the walk, so
    that a script that leaves 100,000 files does not keep the harness walking them."""

    def __init__(self, room):
        super().__init__()
        self.room = room

    def __setitem__(self, path, size):
        super().__setitem__(path, size)
        if len(self) > self.room:
            raise _TooMany()


def _sparse(workspace_fd, size):
    """Why files of size bytes in all cannot be the workspace's own, or None: more bytes
    than it holds are sparse files (a truncate() to 200 MB takes no space), which would
    store zeros past every limit the sandbox sets on the disk."""
    st = os.fstatvfs(workspace_fd)
    holds = st.f_blocks * st.f_frsize
    if size > holds:
        return "%d bytes, more than the workspace holds (%d bytes): sparse files are not stored" % (size, holds)
    return None


def _find(workspace_fd, root, files, warn):
    """Adds the regular files at root (a requested path) to files. A missing root is
    skipped silently."""
    try:
        names = paths.split(root)
    except ValueError as e:
        return warn("artifact %r skipped: %s" % (root, e))
    fd = os.dup(workspace_fd)
    try:
        for i, name in enumerate(names[:-1]):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return
            if not stat.S_ISDIR(st.st_mode):
                if stat.S_ISLNK(st.st_mode):
                    warn("artifact %s skipped: %s is a symbolic link" % (root, "/".join(names[: i + 1])))
                return
            sub = os.open(name, paths.DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
        _visit(fd, names[-1], root, len(names), files, warn)
    except OSError as e:
        warn("artifact %s skipped: %s" % (root, e.strerror))
    finally:
        os.close(fd)


def _visit(dirfd, name, path, depth, files, warn):
    """Adds the regular file dirfd/name, or those under the directory, to files."""
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        if depth > MAX_DEPTH:
            return warn("artifact %s skipped: directories nested over %d deep" % (_printable(path), MAX_DEPTH))
        try:
            fd = os.open(name, paths.DIR_FLAGS, dir_fd=dirfd)
        except OSError as e:
            return warn("artifact %s skipped: %s" % (_printable(path), e.strerror))
        try:
            for entry in sorted(os.listdir(fd)):
                _visit(fd, entry, path + "/" + entry, depth + 1, files, warn)
        except OSError as e:
            warn("artifact %s skipped: %s" % (_printable(path), e.strerror))
        finally:
            os.close(fd)
        return
    if not stat.S_ISREG(st.st_mode):
        return warn("artifact %s skipped: %s" % (_printable(path), paths.what(st.st_mode)))
    if path in files:
        return
    try:
        paths.split(path)  # the host takes only such paths: UTF-8, at most 1024 bytes
    except ValueError as e:
        return warn("artifact %s skipped: %s" % (_printable(path), e))
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dirfd)
    except OSError as e:
        return warn("artifact %s skipped: %s" % (path, e.strerror))
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISREG(st.st_mode):
        files[path] = st.st_size


def _printable(path):
    return path.encode("utf-8", "backslashreplace").decode("utf-8")


def _send(run, workspace_fd, path, header):
    """Sends one artifact: its line, then its bytes as chunk lines. Whether its line
    was sent."""
    names = path.split("/")
    try:
        parent = paths.open_dir(workspace_fd, names[:-1])
        try:
            fd = os.open(names[-1], FILE_FLAGS, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as e:
        return run.warn("artifact %s skipped: %s" % (path, e.strerror))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return run.warn("artifact %s skipped: %s" % (path, paths.what(st.st_mode)))
        # Nothing of the execution runs: the size is the one counted. Should it not be,
        # the limits still hold.
        why = run.quota.over(1, st.st_size)
        if why is not None:
            return run.warn("artifact %s skipped: it changed while collected (%s)" % (path, why))
        header["size"] = st.st_size
        run.emit(header)
        run.quota.add(st.st_size)
        left = st.st_size
        while left:
            piece = _read(fd, min(left, p.CHUNK_DATA_BYTES))
            if not piece:
                break  # cut short: the host sees fewer bytes than size (see the spec)
            run.emit_chunk(piece)
            left -= len(piece)
        return True
    finally:
        os.close(fd)


def _read(fd, n):
    """Up to n bytes of fd, fewer only at its end or on an error."""
    pieces, got = [], 0
    while got < n:
        try:
            piece = os.read(fd, n - got)
        except InterruptedError:
            continue
        except OSError:
            break
        if not piece:
            break
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces)


# Entries of the workspace stray reads at most: a hint, not an inventory.
STRAY_ENTRIES = 1000


def stray(workspace_fd, since, requested):
    """The names at the top of the workspace, but out/ and the paths requested as
    artifacts, that an execution made or changed at since (time.time()) or later: they
    do not come back. Directories end in a slash. Read by the parent, through the
    workspace's descriptor, only when the directory's own time says a name was added or
    removed since; nothing is followed."""
    try:
        if os.fstat(workspace_fd).st_mtime < since:
            return []
        wanted = {"out"} | {a.strip("/").split("/")[0] for a in requested if isinstance(a, str)}
        names = []
        with os.scandir(workspace_fd) as entries:
            for n, entry in enumerate(entries):
                if n >= STRAY_ENTRIES:
                    break
                if entry.name in wanted:
                    continue
                if entry.stat(follow_symlinks=False).st_mtime >= since:
                    names.append(entry.name + ("/" if entry.is_dir(follow_symlinks=False) else ""))
        return sorted(names)
    except OSError:
        return []
