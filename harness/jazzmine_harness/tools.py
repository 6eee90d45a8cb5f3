"""What the harness loads at start: the tools, every *.py of the tools directory (async
tools wrapped so that scripts call them as plain functions), and the modules it is
asked to preload; and what it says of the tools in its ready event (tool_specs): each
one's signature and docstring, so that an agent knows what it may call."""

import functools
import importlib
import importlib.util
import os
import threading
import traceback
import types

# inspect.CO_COROUTINE, CO_VARARGS and CO_VARKEYWORDS: inspect itself costs 1.7 MB that
# every fork would copy, so tool_specs reads the code objects as inspect does.
CO_COROUTINE = 0x80
CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


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


def tool_specs(tools):
    """What the ready event says of each tool: its name, its signature as
    inspect.signature writes it ("(text: str, n: int = 3) -> list"), its docstring
    cleaned as inspect.cleandoc does, and whether it is an async def. An async tool
    reports the function its file defines, not the wrapper that scripts call."""
    specs = []
    for name in sorted(tools):
        fn = tools[name]
        original = _unwrap(fn)
        try:
            signature = _signature(original)
        except Exception:  # a default whose repr raises must not stop the harness
            signature = "(...)"
        doc = getattr(original, "__doc__", None)
        specs.append(
            {
                "name": name,
                "signature": signature,
                "doc": _cleandoc(doc) if isinstance(doc, str) else "",
                "async": bool(getattr(fn, "__jazzmine_async__", False)),
            }
        )
    return specs


def _unwrap(fn):
    """The function under functools.wraps wrappers (ours of async tools, a tool's own
    decorators), as inspect.signature follows __wrapped__."""
    for _ in range(100):  # a cycle of __wrapped__ must not hang the harness
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    return fn


def _signature(fn):
    """str(inspect.signature(fn)) for a plain Python function, from its code object,
    defaults and annotations; "(...)" for anything else."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return "(...)"
    annotations = getattr(fn, "__annotations__", None) or {}
    defaults = getattr(fn, "__defaults__", None) or ()
    kwdefaults = getattr(fn, "__kwdefaults__", None) or {}
    names = code.co_varnames
    positional = names[: code.co_argcount]
    keyword_only = names[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    rest = code.co_argcount + code.co_kwonlyargcount
    varargs = names[rest] if code.co_flags & CO_VARARGS else None
    varkw = names[rest + bool(varargs)] if code.co_flags & CO_VARKEYWORDS else None

    def param(name, prefix="", default=_NO_DEFAULT):
        text = prefix + name
        if name in annotations:
            text += ": " + _annotation(annotations[name])
            if default is not _NO_DEFAULT:
                text += " = " + repr(default)
        elif default is not _NO_DEFAULT:
            text += "=" + repr(default)
        return text

    parts = []
    first_default = len(positional) - len(defaults)
    for i, name in enumerate(positional):
        parts.append(param(name, default=defaults[i - first_default] if i >= first_default else _NO_DEFAULT))
        if i + 1 == code.co_posonlyargcount:
            parts.append("/")
    if varargs:
        parts.append(param(varargs, "*"))
    elif keyword_only:
        parts.append("*")
    for name in keyword_only:
        parts.append(param(name, default=kwdefaults.get(name, _NO_DEFAULT)))
    if varkw:
        parts.append(param(varkw, "**"))
    text = "(" + ", ".join(parts) + ")"
    if "return" in annotations:
        text += " -> " + _annotation(annotations["return"])
    return text


_NO_DEFAULT = object()


def _annotation(a):
    """inspect.formatannotation, but for a string annotation (from __future__ import
    annotations), which reads as written rather than quoted."""
    if isinstance(a, str):
        return a
    if getattr(a, "__module__", None) == "typing":
        return repr(a).replace("typing.", "")
    if isinstance(a, types.GenericAlias):
        return str(a)
    if isinstance(a, type):
        if a.__module__ == "builtins":
            return a.__qualname__
        return a.__module__ + "." + a.__qualname__
    return repr(a)


def _cleandoc(doc):
    """inspect.cleandoc: the first line's leading blanks and the other lines' common
    indentation removed, and blank lines at either end."""
    lines = doc.expandtabs().split("\n")
    margin = None
    for line in lines[1:]:
        content = len(line.lstrip())
        if content:
            indent = len(line) - content
            margin = indent if margin is None else min(margin, indent)
    lines[0] = lines[0].lstrip()
    if margin is not None:
        lines[1:] = [line[margin:] for line in lines[1:]]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines)
