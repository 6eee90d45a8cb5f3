"""The JSON form of a script's values: what emit_result, emit_intermediate and the value
of a script's last expression become in the events. Every value has one form, or is
refused with an error that names where in the value it is (docs/ANSWERS.md, "Values"):

- None, bool, str, int of at most 64 bits, finite float: themselves;
- NaN, inf and -inf: null, and their places are listed beside the value (nonfinite), so
  that an event in msgpack carries them as the floats they are;
- an int beyond 64 bits: its decimal digits, as a string;
- a lone surrogate in a str (bytes decoded with surrogateescape, say): the six
  characters of its escape, "\\udc80";
- dict and any other Mapping: an object whose keys are made strings as json.dumps makes
  them (str, int, float, bool, None), or by str() (any other key); keys that become the
  same string keep the last value, as a JSON object with a repeated key does;
- list, tuple, collections.deque: an array; set and frozenset: an array, sorted when its
  items sort;
- bytes, bytearray, memoryview: a base64 string;
- datetime, date, time: isoformat(); timedelta: its seconds as a float;
- Decimal, Fraction, complex, uuid.UUID, pathlib paths: str(); an Enum: its value's form;
  a dataclass instance: an object of its fields;
- numpy: a scalar as the Python scalar it holds (item()), an array as nested lists
  (tolist()); pandas: a DataFrame as {"columns", "index", "data"} (to_dict("split")), a
  Series as {"name", "index", "data"}, an Index as an array, a missing value (NaT, NA)
  as null;
- arrays and objects nested deeper than MAX_DEPTH: refused;
- anything else: refused (NoJSONForm), the error saying what to do instead.

The child computes the form (it runs in the script's process: nothing here is trusted
by the parent, which checks every line it relays; see run.Run._child_event)."""

import base64
import datetime
import enum
import json
import math
import re
import sys
from collections import deque
from collections.abc import Mapping

from .protocol import escape_surrogates

_dumps = json.dumps  # captured: a script may replace json.dumps in its own process

# Deepest nesting of arrays and objects a value may have. Many JSON parsers stop at a
# few hundred levels (Ruby's at 100, Python's at about 1,000 by its recursion limit).
MAX_DEPTH = 256

# An int outside these is written as its decimal digits: msgpack, and every decoder
# that reads numbers as int64 or float64, cannot hold it.
MIN_INT = -(1 << 63)
MAX_INT = (1 << 64) - 1

# 19 digits in a row: an int the fast path cannot tell from one beyond 64 bits
# (-(2**63) - 1 has 19).
_LONG_DIGITS = re.compile(r"\d{19}")


class NoJSONForm(TypeError):
    """A value, or a part of it, that has no JSON form."""


class TooLarge(Exception):
    """The value's form would pass the budget form() was given."""


def form(value, what="data", budget=None):
    """The JSON text of value's form and the places of its non-finite floats: (text,
    [[path, "nan" | "inf" | "-inf"], ...]), each path a list of keys and indices.
    Raises NoJSONForm naming where the refused part is (what names the value), or
    TooLarge when budget (a number of bytes) is given and the form is longer: then
    the value is walked item by item and given up as soon as it passes the budget,
    without converting a large array or frame first (a notebook's `df` on its last
    line must not cost the frame's conversion)."""
    if budget is None:
        text = _plain(value)
        if text is not None:
            return text, []
    walk = _Walk(what, budget)
    clean = walk.value(value, 0)
    text = _dumps(clean, ensure_ascii=False, separators=(",", ":"))
    if budget is not None and len(text) > budget:
        raise TooLarge()
    return text, walk.nonfinite


def _plain(value):
    """The JSON text of value when json.dumps writes it as its form already (the common
    case, at the C encoder's speed), else None."""
    try:
        text = _dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        text.encode("utf-8")  # strict: a lone surrogate raises
    except (TypeError, ValueError, RecursionError):
        return None
    # Possibly too deep, or an int beyond 64 bits: the walk decides. (A short text is
    # neither: not looked at, which spares a fork's child the pages of the search.)
    if len(text) > MAX_DEPTH and text.count("[") + text.count("{") > MAX_DEPTH or len(text) >= 19 and _LONG_DIGITS.search(text):
        return None
    return text


class _Walk:
    """One walk over a value that json.dumps cannot write as its form."""

    def __init__(self, what, budget):
        self.what = what
        self.path = []
        self.nonfinite = []
        self.nodes = 0
        # A rough bound on the nodes of a value whose form may take budget bytes.
        self.max_nodes = None if budget is None else budget

    def refuse(self, message):
        path = ["[%r]" % k for k in self.path]
        if len(path) > 8:
            path = path[:4] + ["...(%d levels)..." % (len(path) - 7)] + path[-3:]
        raise NoJSONForm("%s%s: %s" % (self.what, "".join(path), message))

    def value(self, v, depth):
        self.nodes += 1
        if self.max_nodes is not None and self.nodes > self.max_nodes:
            raise TooLarge()
        if v is None or v is True or v is False:
            return v
        t = type(v)
        if t is str:
            self.spend(len(v))
            return escape_surrogates(v)
        if t is int:
            return v if MIN_INT <= v <= MAX_INT else str(v)
        if t is float:
            return self.float(v)
        if isinstance(v, (list, tuple, deque)):
            self.spend(len(v))
            return self.array(v, depth)
        if isinstance(v, Mapping):
            self.spend(len(v))
            return self.object(v.items(), depth)
        if isinstance(v, (set, frozenset)):
            self.spend(len(v))
            items = list(v)
            try:
                items.sort()
            except TypeError:
                pass
            return self.array(items, depth)
        return self.other(v, depth)

    def spend(self, n):
        """Counts n more items (or characters) against the budget, before they are
        converted: TooLarge once past it."""
        if self.max_nodes is not None:
            self.nodes += n
            if self.nodes > self.max_nodes:
                raise TooLarge()

    def float(self, f):
        if math.isfinite(f):
            return float(f)
        self.nonfinite.append([list(self.path), "nan" if f != f else ("inf" if f > 0 else "-inf")])
        return None

    def array(self, items, depth):
        if depth >= MAX_DEPTH:
            self.refuse("arrays and objects nest deeper than %d levels" % MAX_DEPTH)
        out = []
        for i, item in enumerate(items):
            self.path.append(i)
            out.append(self.value(item, depth + 1))
            self.path.pop()
        return out

    def object(self, items, depth):
        if depth >= MAX_DEPTH:
            self.refuse("arrays and objects nest deeper than %d levels" % MAX_DEPTH)
        out = {}
        for k, item in items:
            key = _key(k)
            self.path.append(key)
            out[key] = self.value(item, depth + 1)
            self.path.pop()
        return out

    def other(self, v, depth):
        """The form of a value that is not one of JSON's own types."""
        if isinstance(v, bool):
            return bool(v)
        if isinstance(v, enum.Enum):
            return self.value(v.value, depth)
        if isinstance(v, int):
            return self.value(int(v), depth)
        if isinstance(v, float):
            return self.float(float(v))
        if isinstance(v, str):
            self.spend(len(v))
            return escape_surrogates(str(v))
        if isinstance(v, (bytes, bytearray, memoryview)):
            self.spend(len(v))
            return base64.b64encode(bytes(v)).decode("ascii")
        if isinstance(v, datetime.timedelta):
            return self.float(v.total_seconds())
        if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
            return _missing_or(v, lambda: v.isoformat())
        if isinstance(v, complex) or _is_any(v, _STR_FORMS):
            return str(v)
        dataclasses = sys.modules.get("dataclasses")
        if dataclasses is not None and dataclasses.is_dataclass(v) and not isinstance(v, type):
            return self.object(((f.name, getattr(v, f.name)) for f in dataclasses.fields(v)), depth)
        known = _numpy(v) or _pandas(v)
        if known is not None:
            kind, convert = known
            if kind == "missing":
                return None
            size = getattr(v, "size", 0)  # the items of an array or a frame, before they are converted
            self.spend(size if isinstance(size, int) else 0)
            return self.value(convert(), depth)
        self.refuse("%s has no JSON form; convert it first (str(value), a dict or a list of its fields), or display(value) to show it" % _a(v))


# The types whose form is str(value), by module and name: looked up, never imported (a
# value of one means its module is loaded; importing them here would put them, and
# dataclasses' inspect, in every fork of the zygote).
_STR_FORMS = (("decimal", "Decimal"), ("fractions", "Fraction"), ("uuid", "UUID"), ("pathlib", "PurePath"))


def _is_any(v, types):
    for module, name in types:
        m = sys.modules.get(module)
        if m is not None and isinstance(v, getattr(m, name, ())):
            return True
    return False


def _key(k):
    """A key as json.dumps makes it a string, or str(k) where json.dumps would refuse."""
    if isinstance(k, str):
        return escape_surrogates(k)
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, int):
        return str(int(k))
    if isinstance(k, float):
        f = float(k)
        return _dumps(f) if math.isfinite(f) else ("NaN" if f != f else ("Infinity" if f > 0 else "-Infinity"))
    return escape_surrogates(str(k))


def _a(v):
    name = type(v).__qualname__
    module = type(v).__module__
    if module not in ("builtins", "__main__"):
        name = module + "." + name
    return "a value of type %s" % name


def _missing_or(v, then):
    """None for pandas' NaT (a datetime that isoformat()s as "NaT"), else then()."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and v is pandas.NaT:
        return None
    return then()


def _numpy(v):
    """("value", convert) for a numpy value, None for anything else. numpy is looked up,
    never imported: a value of numpy's means numpy is loaded."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    if isinstance(v, np.ndarray):
        return "value", v.tolist
    if isinstance(v, np.datetime64):
        if np.isnat(v):
            return "missing", None
        return "value", lambda: str(v)
    if isinstance(v, np.generic):
        return "value", v.item
    return None


def _pandas(v):
    """("value", convert) for a pandas value, ("missing", None) for NA and NaT, None for
    anything else."""
    pd = sys.modules.get("pandas")
    if pd is None:
        return None
    if v is pd.NaT or v is getattr(pd, "NA", None):
        return "missing", None
    if isinstance(v, pd.DataFrame):
        return "value", lambda: v.to_dict(orient="split")
    if isinstance(v, pd.Series):
        return "value", lambda: {"name": v.name, "index": v.index.tolist(), "data": v.tolist()}
    if isinstance(v, pd.Index):
        return "value", v.tolist
    if isinstance(v, pd.Timedelta):
        return "value", v.total_seconds
    if isinstance(v, pd.Period):
        return "value", lambda: str(v)
    return None
