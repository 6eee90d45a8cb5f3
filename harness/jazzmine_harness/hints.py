"""Errors that teach: what an error means in this sandbox, said where a model reads it.

A sandbox has what its image has and, unless it lists allowed hosts, no network; a
model that does not know it tries `pip install`, `!pip`, a URL, and reads an error that
sends it the wrong way ("Temporary failure in name resolution", "No module named pip").
Here: the network errors of a sandbox without egress say so in the exception itself (a
script that prints it, or a library that wraps it, shows the note), and the hint of an
error event (hint) says what the sandbox lacks and what to do instead.

What the harness knows of its sandbox comes from the container's environment, set by
the worker: JAZZMINE_SANDBOX (its name) and JAZZMINE_NETWORK_SANDBOXES (the sandboxes of
the worker with allowed hosts, "name (host, host); name (...)")."""

import errno
import os
import pkgutil
import re
import socket
import sys

from . import config

# Modules never worth naming to a model: packaging tools, which the image removed or
# which install nothing without a network.
_NOT_PACKAGES = {"pip", "setuptools", "pkg_resources", "wheel", "distutils", "easy_install", "_distutils_hack", "debian", "debian_bundle"}

# A line of IPython syntax that is not Python: a shell escape or a magic.
_IPYTHON_LINE = re.compile(r"[ \t]*([!%]{1,2})\s*([A-Za-z_][\w-]*)?")

# The line magics run as a no-op: %matplotlib only picks how figures show, and every
# figure a script leaves open comes back as an image anyway.
NOOP_MAGICS = ("matplotlib",)


def sandbox():
    return os.environ.get("JAZZMINE_SANDBOX") or "this sandbox"


def network_note():
    """What a network error means in a sandbox without egress."""
    note = "%s has no network access" % _quoted_sandbox()
    others = os.environ.get("JAZZMINE_NETWORK_SANDBOXES", "").strip()
    if others:
        note += "; sandboxes with network: " + others
    return note + "; send data in as input files instead"


def _quoted_sandbox():
    name = os.environ.get("JAZZMINE_SANDBOX")
    return "sandbox %r" % name if name else "this sandbox"


def install_network_hints():
    """Makes the network errors of a sandbox without egress say so. Called once, in the
    harness before the zygote is forked, so every child inherits it: a failed name
    lookup (socket.getaddrinfo, which urllib, http.client, requests and urllib3 call)
    and a refused route (socket.socket.connect to an IP address) raise the same
    exception, with the note added to its message. A script may undo it: it only
    explains."""
    note = network_note()
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect

    def getaddrinfo(host, *args, **kwargs):
        try:
            return real_getaddrinfo(host, *args, **kwargs)
        except socket.gaierror as e:
            raise socket.gaierror(e.errno, "%s (%s)" % (e.strerror, note)) from None

    def connect(self, address):
        try:
            return real_connect(self, address)
        except OSError as e:
            if e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH) and self.family in (socket.AF_INET, socket.AF_INET6):
                raise type(e)(e.errno, "%s (%s)" % (e.strerror, note)) from None
            raise

    getaddrinfo.__wrapped__ = real_getaddrinfo
    connect.__wrapped__ = real_connect
    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect


def packages():
    """The top-level modules installed beside the standard library (site-packages and
    dist-packages), sorted: what `import` finds that a bare Python would not."""
    found = set()
    paths = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    for info in pkgutil.iter_modules(paths):
        name = info.name
        if not name.startswith("_") and name not in _NOT_PACKAGES:
            found.add(name)
    return sorted(found)


def _packages_line():
    names = packages()
    if not names:
        return "It has the Python standard library and no other package."
    if len(names) > 60:
        names = names[:60] + ["... (%d in all)" % len(names)]
    return "It has, beside the standard library: " + ", ".join(names) + "."


_HOW_TO_ADD = "Other packages are added by the fleet's operator (the sandbox's requirements or apt_packages in the worker's config), or another sandbox may have them (list_sandboxes)."


def for_missing_module(name):
    """The hint of an import of a module the sandbox does not have."""
    name = name or ""
    top = name.split(".")[0]
    if top in sys.modules and name != top:
        return "%r is installed, but it has no module %r." % (top, name)
    if top == "IPython":
        return "IPython itself is not installed, but scripts run as its cells do: display() is already a global (it shows an object as Jupyter does), and the value of the last line is shown as Out."
    if top in ("pip", "conda", "mamba", "uv", "ensurepip"):
        first = "%s cannot install packages: scripts have no package manager and no network." % _quoted_sandbox().capitalize()
    else:
        first = "%s has no module %r, and none can be installed from a script (no pip, no network)." % (_quoted_sandbox().capitalize(), top)
    return " ".join((first, _packages_line(), _HOW_TO_ADD))


def ipython_line(source, lineno):
    """(marker, name) when line lineno (from 1) of source is IPython syntax, a shell
    escape (!cmd, !!cmd) or a magic (%name, %%name), else None."""
    lines = source.split("\n")
    if not 0 < (lineno or 0) <= len(lines):
        return None
    m = _IPYTHON_LINE.match(lines[lineno - 1])
    if m is None:
        return None
    return m.group(1), m.group(2) or ""


def for_ipython_syntax(marker, name):
    """The hint of a SyntaxError on a line of IPython syntax."""
    if marker.startswith("!") or name in ("pip", "conda", "mamba", "uv"):
        what = "`%s%s` is IPython syntax (a shell command)" % (marker, name) if marker.startswith("!") else "`%%%s` is an IPython magic" % name
        return "%s, and this sandbox runs plain Python 3: no shell commands, and no packages can be installed (no network). %s %s" % (what, _packages_line(), _HOW_TO_ADD)
    return "`%s%s` is an IPython magic, and this sandbox runs plain Python 3: write it in Python (time a statement with the timeit module, run a file with exec(open(path).read()), list files with os.listdir())." % (marker, name)


def for_exception(e, source):
    """The hint of a script's error e (an exception it raised, source its script), or
    None."""
    if isinstance(e, ModuleNotFoundError):
        return for_missing_module(e.name)
    if isinstance(e, SyntaxError) and e.filename == "<script>":
        found = ipython_line(source, e.lineno)
        if found is not None:
            return for_ipython_syntax(*found)
    return None


def strip_noop_magics(source, lineno):
    """source with line lineno (from 1) made `pass` (its indent kept) when it is a magic
    of NOOP_MAGICS, else None."""
    lines = source.split("\n")
    if not 0 < (lineno or 0) <= len(lines):
        return None
    m = _IPYTHON_LINE.match(lines[lineno - 1])
    if m is None or m.group(1) != "%" or m.group(2) not in NOOP_MAGICS:
        return None
    line = lines[lineno - 1]
    lines[lineno - 1] = line[: len(line) - len(line.lstrip())] + "pass"
    return "\n".join(lines)


def not_returned(names):
    """The note of files the script wrote outside out/, which do not come back."""
    shown = ", ".join(names[:10]) + (" and %d more" % (len(names) - 10) if len(names) > 10 else "")
    out = (config.WORKSPACE or "/workspace").rstrip("/") + "/out"
    return "not returned: %s, written outside %s/ (only files under out/ come back: save them there, e.g. plt.savefig('out/chart.png'))" % (shown, out)
