"""display(obj): rich output, the way Jupyter renders an object. The child side makes
the bundle (text forms, and one image) and sends it; the parent side (Pending, clean)
checks what the child sent, which is the script's to say.

How an image travels from the child to the parent: as raw bytes on the child's event
pipe, right after the display line that announces them
(`{"type":"display","data":{...},"image":{"content_type":"image/png","size":N}}\\n`
then N bytes). Not as base64 inside the line: the parent bounds an unfinished event
line by the output budget (run.EVENT_READ), which a PNG would pass, and holding one
line of base64 while decoding it took four to five times the image's size in the
parent. Framed, the parent knows the size before the first byte and decides then, by
the artifact limits (artifacts.Quota), whether to keep the bytes (at most the limit's
worth, once) or read them into nothing; the output budget bounds only the line. A
script may write to the event pipe itself and announce any size: the bytes it then
sends are its image, the parent picks the path, and a wrong count only garbles the
script's own events (the end of the child, which follows, is then lost and the
execution fails as a child that never said it was done)."""

import base64
import binascii
import io
import sys
from io import StringIO

from . import pretty, values
from . import protocol as p

# The images a display may carry, best first, and the extension of their path.
IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg"}

# The text forms Jupyter asks an object for, in its order, when the object has no
# _repr_mimebundle_; text/plain is repr(obj) always.
TEXT_REPRS = (("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"), ("text/latex", "_repr_latex_"), ("application/json", "_repr_json_"))
IMAGE_REPRS = (("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"), ("image/svg+xml", "_repr_svg_"))

# Longest name of a text form the parent passes on.
MAX_MIME = 127

# The display function of the script running in this process: mpl.show reaches it here.
_current = {"display": None}


# -- the child's side --------------------------------------------------------------------


def make_display(io_):
    """The display function of a script whose events go to io_ (child.ChildIO)."""

    def display(*objs):
        """Shows each object as Jupyter would: its text forms (repr, _repr_html_,
        _repr_markdown_...) and one image (_repr_png_, _repr_jpeg_, _repr_svg_, or a
        matplotlib Figure)."""
        for obj in objs:
            data, image = bundle(obj)
            event = {"type": p.DISPLAY, "data": data}
            raw = b""
            if image is not None:
                event["image"] = {"content_type": image[0], "size": len(image[1])}
                raw = image[1]
            io_.send(event, payload=raw)

    _current["display"] = display
    return display


def as_in_a_notebook():
    """Sets what a library decides by whether it runs in a notebook as a Jupyter kernel
    has it, where it is loaded: pandas shows at most 20 columns of a frame, wrapping
    its text table, where in a terminal (which is what pandas takes any process
    without IPython for) it fits the frame to the terminal's width with '...'. A
    script may set it otherwise. Called once the preloaded modules are, and before a
    value is shown."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and not _as_in_a_notebook["pandas"]:
        _as_in_a_notebook["pandas"] = True
        try:
            if pandas.get_option("display.max_columns") == 0:
                pandas.set_option("display.max_columns", 20)
        except Exception:
            pass


_as_in_a_notebook = {"pandas": False}


def plain(obj):
    """obj's text/plain, as IPython's PlainTextFormatter writes it: IPython's pretty
    printer at 79 columns, at most 1,000 items of a sequence."""
    as_in_a_notebook()
    stream = StringIO()
    printer = pretty.RepresentationPrinter(stream, False, 79, "\n", max_seq_length=pretty.MAX_SEQ_LENGTH)
    printer.pretty(obj)
    printer.flush()
    return values.escape_surrogates(stream.getvalue())


def bundle(obj):
    """The text forms of obj (a dict of strings) and its image, (content type, bytes)
    or None, as Jupyter's display formatter makes them."""
    data = {"text/plain": plain(obj)}
    if isinstance(obj, type):
        return data, None  # a class: its _repr_*_ are unbound functions
    if _is_figure(obj):
        out = io.BytesIO()
        obj.savefig(out, format="png", dpi=obj.dpi)  # figsize * dpi pixels
        return data, ("image/png", out.getvalue())
    forms = _call(obj, "_repr_mimebundle_")
    if not isinstance(forms, dict):
        forms = None
    texts = forms.items() if forms is not None else ((mime, _call(obj, name)) for mime, name in TEXT_REPRS)
    for mime, value in texts:
        if not isinstance(mime, str) or mime == "text/plain" or mime.startswith("image/"):
            continue
        if mime.endswith("json") and not isinstance(value, str) and value is not None:
            try:
                value = values.form(value, mime)[0]
            except (values.NoJSONForm, RecursionError):
                continue
        if isinstance(value, str):
            data[mime] = values.escape_surrogates(value)
    for mime, name in IMAGE_REPRS:
        raw = _image_bytes(mime, forms.get(mime) if forms is not None else _call(obj, name))
        if raw:  # an empty image is none
            return data, (mime, raw)
    return data, None


def _is_figure(obj):
    figure = sys.modules.get("matplotlib.figure")  # no import: matplotlib is the script's
    return figure is not None and isinstance(obj, figure.Figure)


def _call(obj, name):
    """obj.name(), or None where obj has no such method or it fails (said on stderr,
    as Jupyter does). A (data, metadata) pair gives its data."""
    try:
        method = getattr(obj, name, None)
    except Exception:
        return None
    if not callable(method):
        return None
    try:
        value = method(include=None, exclude=None) if name == "_repr_mimebundle_" else method()
    except Exception as e:
        sys.stderr.write("display: %s.%s() raised %s: %s\n" % (type(obj).__name__, name, type(e).__name__, e))
        return None
    if isinstance(value, tuple) and len(value) == 2:
        value = value[0]
    return value


def _image_bytes(mime, value):
    """The bytes of an image repr: bytes, or a base64 string (PNG, JPEG), or the text
    of an SVG. None when value is none of these."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        return None
    if mime == "image/svg+xml":
        return value.encode("utf-8", "surrogatepass")
    try:
        return base64.b64decode(value)
    except (ValueError, binascii.Error):
        return None


def show_figures():
    """Displays every figure pyplot holds open, in figure number order, and closes
    them: pyplot.show() (see mpl), and the end of a script. Nothing when the script
    has not imported pyplot."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    display = _current["display"]
    if pyplot is None or helpers is None or display is None:
        return
    figures = [m.canvas.figure for m in sorted(helpers.Gcf.get_all_fig_managers(), key=lambda m: m.num)]
    try:
        for figure in figures:
            display(figure)
    finally:
        for figure in figures:
            pyplot.close(figure)


# -- the parent's side -------------------------------------------------------------------


def clean(data):
    """The text forms of a display line from the child as the host gets them: strings
    under names that look like MIME types, no image (an image comes as chunk lines).
    None when data is not an object."""
    if not isinstance(data, dict):
        return None
    return {
        k: v
        for k, v in data.items()
        if isinstance(k, str) and isinstance(v, str) and 0 < k.find("/") < len(k) - 1 and len(k) <= MAX_MIME and not k.startswith("image/")
    }


class Pending:
    """A display or execute_result line from the child, waiting for the image bytes it
    announced.

    kind is the line's type, count an execute_result's execution_count; data is the
    line's text forms (clean), or None when the line was malformed. content_type and
    left come from the line; keep is where the bytes go, or None when they are read
    into nothing: why says then why the image is left out."""

    kind = p.DISPLAY
    count = 1

    def __init__(self, data, content_type, size, why):
        self.data = data
        self.content_type = content_type
        self.left = size
        self.why = why
        self.keep = bytearray() if why is None else None

    def take(self, buf):
        """Moves the image's bytes from the front of buf (a bytearray)."""
        n = min(self.left, len(buf))
        if self.keep is not None:
            self.keep += buf[:n]
        del buf[:n]
        self.left -= n

    @classmethod
    def parse(cls, event, over):
        """The Pending of a display or execute_result event from the child. over(size)
        says why an image of size bytes would pass the artifact limits, or None."""
        pending = cls._parse(event, over)
        pending.kind = event.get("type")
        count = event.get("execution_count")
        if isinstance(count, int) and not isinstance(count, bool) and 0 < count < 2**31:
            pending.count = count
        return pending

    @classmethod
    def _parse(cls, event, over):
        data = clean(event.get("data"))
        image = event.get("image")
        if image is None:
            return cls(data, None, 0, "")
        size = image.get("size") if isinstance(image, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return cls(data, None, 0, "the script announced it badly")  # no bytes to skip: none can be counted
        content_type = image.get("content_type")
        if not isinstance(content_type, str) or content_type not in IMAGE_TYPES:
            why = "not an image type the harness sends"
        else:
            why = over(size)
        if data is None and why is None:
            why = "its display line was malformed"
        return cls(data, content_type, size, why)
