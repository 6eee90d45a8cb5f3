"""The scripts' matplotlib backend, MPLBACKEND=module://jazzmine_harness.mpl (set by
the harness at start unless MPLBACKEND is set): Agg, whose show() displays every open
figure (display.show_figures) and closes them. The figures a script leaves open are
displayed when it ends (child.run_script).

Matplotlib is the script's, not the harness's: most images have none, and the package
imports its modules at start. So nothing of matplotlib's is imported here until
matplotlib loads this module as its backend, in a child whose script uses pyplot, and
asks it for its canvas (__getattr__)."""

from . import display

# What matplotlib asks a backend module for besides show.
_CLASSES = ("FigureCanvas", "FigureManager")


def __getattr__(name):
    """FigureCanvas and FigureManager, Agg's, imported when matplotlib first asks."""
    if name not in _CLASSES:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    from matplotlib.backend_bases import FigureManagerBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    # Kept as globals too: matplotlib 3.6 builds its backend class from vars(module).
    globals().update(FigureCanvas=FigureCanvasAgg, FigureManager=FigureManagerBase)
    return globals()[name]


def show(*args, **kwargs):
    """pyplot.show(): displays every open figure, in figure number order, and closes
    them. Its arguments (block) mean nothing here: nothing waits for a window."""
    display.show_figures()
