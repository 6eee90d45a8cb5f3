"""What the harness loads at start: the tools, every *.py of the tools directory (async
tools wrapped so that scripts call them as plain functions), and the modules it is
asked to preload; and what it says of the tools in its ready event (tool_specs): each
one's signature and docstring, so that an agent knows what it may call."""

import functools
import gc
import importlib
import importlib.util
import os
import random
import sys
import threading
import traceback
import types

# inspect.CO_COROUTINE: inspect itself costs 1.7 MB that every fork would copy (it is
# imported by tool_specs alone, after the zygote is forked).
CO_COROUTINE = 0x80


def _make_sync(fn):
    """Wraps an async tool so that scripts call it as a plain function.

    The coroutine runs on an event loop owned by a thread of the calling process; the loop
    is created on first use in each child (threads do not survive fork).
    """

    import asyncio  # here, not at the top: 4 MB that every fork would copy, for async tools only

    @functools.wraps(fn)
    def call(*args, **kwargs):
        loop = _tool_loop()
        return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), loop).result()

    call.__jazzmine_async__ = True
    return call


_loop_state = {"pid": None, "loop": None}
_loop_lock = threading.Lock()


def _tool_loop():
    with _loop_lock:
        if _loop_state["pid"] != os.getpid():
            import asyncio  # imported already by _make_sync: a dict lookup

            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name="jazzmine-tool-loop", daemon=True)
            t.start()
            _loop_state.update(pid=os.getpid(), loop=loop)
        return _loop_state["loop"]


def load_tools(directory):
    """Loads every *.py in directory. Returns (tools by name, errors)."""
    tools, errors = {}, []
    if not directory or not os.path.isdir(directory):
        return tools, errors
    directory = os.path.abspath(directory)  # co_filename below is compared to absolute paths
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".py") or name.startswith("."):
            continue
        path = os.path.join(directory, name)
        try:
            spec = importlib.util.spec_from_file_location("jazzmine_tools." + name[:-3], path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except BaseException as e:  # a tool's SystemExit must not stop the harness either
            errors.append({"file": name, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()})
            continue
        for attr, value in vars(module).items():
            if attr.startswith("_") or not isinstance(value, types.FunctionType):
                continue
            if getattr(value, "__code__", None) is None or value.__code__.co_filename != path:
                continue  # imported into the tool file, not defined by it
            tools[attr] = _make_sync(value) if value.__code__.co_flags & CO_COROUTINE else value
    return tools, errors


def preload(names):
    """Imports each module of names (JAZZMINE_PRELOAD) in the harness, before the zygote
    is forked, so that every script finds it in sys.modules. Returns the errors, as
    load_tools does, with the file "preload:<module>"; the others are loaded anyway."""
    errors = []
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as e:  # a module's SystemExit must not stop the harness either
            errors.append({"file": "preload:" + name, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()})
    return errors


# The pseudo-random generators that the tools and the preloaded modules made when
# they were imported, found once they are loaded (find_generators): each child seeds
# them again before its script runs (child.reseed).
GENERATORS = []


def find_generators():
    """Finds every pseudo-random generator alive in the harness: a random.Random (but
    SystemRandom, which has no state), and numpy's RandomState, Generator and bit
    generators, numpy looked up, not imported. Called once, when the tools and the
    preloaded modules are loaded, before the zygote is forked."""
    kinds = [random.Random]
    np = sys.modules.get("numpy")
    if np is not None:
        kinds += [np.random.RandomState, np.random.Generator, np.random.BitGenerator]
    kinds = tuple(kinds)
    GENERATORS[:] = [o for o in gc.get_objects() if isinstance(o, kinds) and not isinstance(o, random.SystemRandom)]


def reseed_one(g):
    """Seeds g, a generator of GENERATORS, from the kernel's entropy."""
    if isinstance(g, random.Random):
        g.seed()
        return
    np = sys.modules["numpy"]  # a generator of numpy's means numpy is loaded
    if isinstance(g, np.random.RandomState):
        g.seed()
    elif isinstance(g, np.random.Generator):
        g.bit_generator.state = type(g.bit_generator)().state
    else:  # a bit generator
        g.state = type(g)().state


def tool_specs(tools):
    """What the ready event says of each tool: its name, its signature as
    inspect.signature writes it ("(text: str, n: int = 3) -> list"; a string annotation,
    from __future__ import annotations, as written rather than quoted), its docstring as
    inspect.getdoc gives it, and whether it is an async def. An async tool reports the
    function its file defines, not the wrapper that scripts call.

    It imports inspect: call it only after the zygote is forked, so that no child
    starts with inspect loaded (the harness itself never forks after that)."""
    import inspect

    specs = []
    for name in sorted(tools):
        fn = tools[name]
        # A default whose repr raises, a cycle of __wrapped__: the harness goes on.
        try:
            signature = str(_as_written(inspect.signature(fn)))
        except Exception:
            signature = "(...)"
        try:
            doc = inspect.getdoc(inspect.unwrap(fn)) or ""
        except Exception:
            doc = inspect.getdoc(fn) or ""
        specs.append(
            {
                "name": name,
                "signature": signature,
                "doc": doc,
                "async": bool(getattr(fn, "__jazzmine_async__", False)),
            }
        )
    return specs


class _Written:
    """A string annotation, which inspect.formatannotation would quote: its repr is
    the annotation as written."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _as_written(sig):
    """sig with its string annotations as written."""

    def written(a):
        return _Written(a) if isinstance(a, str) else a

    params = [p.replace(annotation=written(p.annotation)) for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation=written(sig.return_annotation))
