"""Record IPython's answers to the comparison cells (cells.json) into reference.json.

The cells run in order in ONE IPython InteractiveShell (not a terminal, not a kernel),
so state carries from cell to cell as in a notebook. Each cell's answer is recorded as
a Jupyter kernel (ipykernel) would send it, with nothing printed in its place:

  execution_count  the cell's number (In [n]); errors and empty cells count too
  out              the execute_result, or null: {"execution_count", "data", "metadata"},
                   where data is the displayhook's shell.display_formatter.format(value)
                   format dict. Sent only when the displayhook displays something: the
                   cell's last expression is not None, the cell does not end in ';', and
                   the format dict is not empty (a formatter that raises leaves it empty)
  stdout, stderr   what the cell wrote to file descriptors 1 and 2 (print, sys.stdout,
                   !commands, warnings); the Out prompt is not in them (ipykernel sends
                   no prompt), nor are tracebacks (they are error outputs)
  error            {"ename", "evalue"} of the ExecutionResult's error_before_exec (a
                   SyntaxError, an input transformer's error) or error_in_exec, or null
  error_outputs    the "error" messages the kernel would send, one for each traceback the
                   shell showed: {"ename", "evalue", "traceback"}; traceback is IPython's
                   traceback text without colours, for reading (not for comparing). It
                   has entries where error is null: a formatter that raised (shown by
                   IPython's catch_format_error while the cell itself succeeded)
  displays         the display_data bundles in order: display(), %matplotlib inline figures
  varies           copied from cells.json: the fields whose text changes between runs
                   (%timeit's timings); compare those loosely, or not at all

A bundle's data maps MIME types to text. Binary types (image/png, image/jpeg, image/gif,
image/webp, application/pdf) hold base64, as Jupyter sends them (IPython's PNG formatter
gives base64 text ending in a newline; raw bytes are encoded without one), and the
bundle's "base64" list names them.

Normalisation, the one rule the Go test must apply to the product's answers too: in
every text recorded (data values other than the base64 ones, stdout, stderr, evalue,
traceback), each match of the regular expression

    \b0x[0-9a-f]+

(\b an ASCII word boundary, as Go's regexp has it and Python's with re.ASCII; lower-case
hex only, as repr prints addresses) is replaced by "0x…" ("0x" followed by U+2026
HORIZONTAL ELLIPSIS). The \b keeps "<Figure size 640x480 with 1 Axes>" whole: without
it, its "0x480" would match. Nothing else is rewritten: SyntaxError's evalue keeps
IPython's cell file name (<ipython-input-N-HASH>, HASH from the cell's source).

Two choices make the shell answer as a Jupyter kernel does rather than as a terminal:
the shell's class name contains "ZMQ" and it has a `kernel` attribute (None), because
pandas 1.5 asks exactly that (is_terminal(), in_ipython_frontend()) to size its text
tables: as in a kernel, display.max_columns is 20 and the width 80 columns, rather than
the terminal's size. And matplotlib's font cache is built before the first cell (as the
product's image or warm interpreter has it), so that the cell importing pyplot does not
record "Matplotlib is building the font cache".

Usage (record.sh runs it in the reference image):
    python3 record.py [--cells cells.json] [--out reference.json|-]
"""

import argparse
import binascii
import datetime
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager

import IPython
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets import Type
from traitlets.config import Config

ADDRESS = re.compile(r"\b0x[0-9a-f]+", re.ASCII)
ADDRESS_MARK = "0x\u2026"
BINARY_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf")


def normalise(text):
    """Apply the normalisation rule (module docstring) to one text."""
    return ADDRESS.sub(ADDRESS_MARK, text)


def bundle(data, metadata):
    """A format dict as Jupyter sends it: binary types in base64 and listed, texts normalised."""
    out, b64 = {}, []
    for mime in sorted(data):
        value = data[mime]
        if mime in BINARY_MIMES:
            if isinstance(value, bytes):
                value = binascii.b2a_base64(value, newline=False).decode("ascii")
            b64.append(mime)
        elif isinstance(value, str):
            value = normalise(value)
        elif isinstance(value, bytes):
            value = normalise(value.decode("utf-8", "replace"))
        out[mime] = value
    result = {"data": out, "metadata": metadata or {}}
    if b64:
        result["base64"] = b64
    return result


class ReferenceDisplayHook(DisplayHook):
    """ipykernel's ZMQShellDisplayHook, keeping the execute_result instead of sending it."""

    def start_displayhook(self):
        self.pending = {"execution_count": None, "data": {}, "metadata": {}}

    def write_output_prompt(self):
        self.pending["execution_count"] = self.prompt_count

    def write_format_data(self, format_dict, md_dict=None):
        self.pending["data"] = format_dict
        self.pending["metadata"] = md_dict

    def finish_displayhook(self):
        sys.stdout.flush()
        sys.stderr.flush()
        if self.pending["data"]:
            self.shell.answer["results"].append(self.pending)
        self.pending = None


class ReferenceDisplayPublisher(DisplayPublisher):
    """ipykernel's ZMQDisplayPublisher, keeping display_data instead of sending it."""

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
        sys.stdout.flush()
        sys.stderr.flush()
        self.shell.answer["displays"].append({"data": data, "metadata": metadata})

    def clear_output(self, wait=False):
        self.shell.answer["displays"].append({"clear_output": {"wait": wait}})


class ReferenceZMQShell(InteractiveShell):
    """An InteractiveShell that answers as ipykernel's ZMQInteractiveShell (see the docstring)."""

    displayhook_class = Type(ReferenceDisplayHook)
    display_pub_class = Type(ReferenceDisplayPublisher)
    kernel = None  # pandas: "hasattr(ip, 'kernel')" means a Jupyter kernel, not a terminal

    def _showtraceback(self, etype, evalue, stb):
        # ipykernel sends these three as an "error" message.
        self.answer["errors"].append(
            {"ename": str(etype.__name__), "evalue": str(evalue), "traceback": self.InteractiveTB.stb2text(stb)}
        )

    def enable_gui(self, gui=None):
        # InteractiveShell leaves this to subclasses, so that %matplotlib inline raises
        # NotImplementedError in it. ipykernel's runs the GUI's event loop; the inline
        # backend (gui None) has none, and this headless shell has no other.
        if gui not in (None, "inline"):
            raise UsageError(f"no event loop for gui {gui!r} in the reference shell")
        self.active_eventloop = gui


@contextmanager
def captured_fds():
    """Send file descriptors 1 and 2 to temporary files; yields a dict filled on exit."""
    got = {}
    files = {fd: tempfile.TemporaryFile() for fd in (1, 2)}
    saved = {}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for fd, f in files.items():
            saved[fd] = os.dup(fd)
            os.dup2(f.fileno(), fd)
        yield got
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in saved.items():
            os.dup2(old, fd)
            os.close(old)
        for fd, f in files.items():
            f.seek(0)
            got["stdout" if fd == 1 else "stderr"] = f.read().decode("utf-8", "backslashreplace")
            f.close()


def error_of(result):
    exc = result.error_before_exec or result.error_in_exec
    if exc is None:
        return None
    return {"ename": type(exc).__name__, "evalue": normalise(str(exc))}


def versions():
    v = {"ipython": IPython.__version__, "python": sys.version.split()[0]}
    for dist in ("numpy", "pandas", "matplotlib"):
        v[dist] = importlib.metadata.version(dist)
    return v


def debian_versions(packages):
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package} ${Version}\n", *packages],
            capture_output=True, text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def record(cells):
    # Built once, before the session, in another process: see the docstring.
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=True)

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.colors = "NoColor"
    shell = ReferenceZMQShell.instance(config=config)
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)

    answers = []
    for n, cell in enumerate(cells, 1):
        for name, text in cell.get("files", {}).items():
            with open(name, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        shell.answer = {"results": [], "displays": [], "errors": []}
        with captured_fds() as streams:
            result = shell.run_cell(cell["cell"], store_history=True)
        results = shell.answer["results"]
        if len(results) > 1:
            raise SystemExit(f"cell {n} ({cell['name']}): {len(results)} execute_results")
        out = None
        if results:
            r = results[0]
            out = {"execution_count": r["execution_count"], **bundle(r["data"], r["metadata"])}
        displays = [
            d if "clear_output" in d else bundle(d["data"], d["metadata"]) for d in shell.answer["displays"]
        ]
        answer = {
            "name": cell["name"],
            "execution_count": result.execution_count,
            "out": out,
            "stdout": normalise(streams["stdout"]),
            "stderr": normalise(streams["stderr"]),
            "error": error_of(result),
            "error_outputs": [
                {"ename": e["ename"], "evalue": normalise(e["evalue"]), "traceback": normalise(e["traceback"])}
                for e in shell.answer["errors"]
            ],
            "displays": displays,
        }
        if cell.get("varies"):
            answer["varies"] = cell["varies"]
        answers.append(answer)
        print(f"record: {n:3d} {cell['name']}", file=sys.stderr)
    return answers


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default=os.path.join(here, "cells.json"))
    parser.add_argument("--out", default=os.path.join(here, "reference.json"), help="'-' for stdout")
    args = parser.parse_args()

    with open(args.cells, encoding="utf-8") as f:
        cells = json.load(f)
    names = [c["name"] for c in cells]
    if len(set(names)) != len(names):
        raise SystemExit("cells.json: two cells have the same name")

    workdir = tempfile.mkdtemp(prefix="ipyref-")
    os.chdir(workdir)
    answers = record(cells)

    reference = {
        **versions(),
        "debian": debian_versions(
            ["ipython3", "python3-ipython", "python3.11", "python3-numpy", "python3-pandas", "python3-matplotlib",
             "python3-matplotlib-inline"]
        ),
        "recorded": datetime.date.today().isoformat(),
        "cells": answers,
    }
    text = json.dumps(reference, indent=2, ensure_ascii=False) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
