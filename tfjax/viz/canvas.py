"""What every picture shares: matplotlib imported on demand, an Agg figure, checked inputs, save.

`new_figure` makes a `matplotlib.figure.Figure` with its own Agg canvas (no pyplot, so the
process-wide backend and pyplot's figure list are left alone); a missing matplotlib is a
one-line `tfjax.errors.DependencyError` naming the `viz` extra. Without pyplot, Jupyter knows
no way to show a figure but its text (`<Figure size 640x480 with 2 Axes>`), so the figures are
of a subclass that also renders itself as PNG (`_repr_png_`): `display(fig)`, or a figure left
as a cell's last expression, shows the picture. `matrix` turns a numpy or jax array into a
numpy one, dropping leading axes of size 1 and raising a `ValueError` that names the expected
shape.
"""

import functools
import io
import os
import pathlib
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from tfjax import errors

# matplotlib.figure.Figure; matplotlib is imported only when a figure is drawn.
Figure: TypeAlias = Any
INSTALL_HINT = 'pip install "tfjax[viz]"'
DPI = 100  # 6.4 x 4.8 inches -> 640 x 480 pixels: README-sized


def figure_tools() -> tuple[type, type]:
    """(Figure class, Agg canvas class), or a one-line error saying how to install matplotlib.

    The Figure class is `matplotlib.figure.Figure` plus `_repr_png_`, so notebooks show it.
    """
    try:
        # `from matplotlib import` looks matplotlib itself up: a test that hides it sees it gone
        from matplotlib import figure
        from matplotlib.backends import backend_agg
    except ImportError as err:
        raise errors.DependencyError(
            f"drawing needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from err
    return _notebook_figure_class(figure.Figure), backend_agg.FigureCanvasAgg


@functools.cache
def _notebook_figure_class(base: type) -> type:
    class NotebookFigure(base):
        """A matplotlib Figure that IPython and Jupyter show as a PNG, pyplot or not."""

        def _repr_png_(self) -> bytes:
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=DPI)
            return buffer.getvalue()

    return NotebookFigure


def new_figure(width: float, height: float) -> Figure:
    """An empty `width` x `height` inch figure on its own Agg canvas, constrained layout."""
    figure_class, canvas_class = figure_tools()
    fig = figure_class(figsize=(width, height), layout="constrained")
    canvas_class(fig)  # Agg on this figure only
    return fig


def one_axes(ax: Any, width: float, height: float) -> tuple[Figure, Any]:
    """(figure, axes) to draw one panel in: the caller's `ax` and its figure (matplotlib's
    convention for placing a picture in one's own figure), else a new `width` x `height`
    figure with one axes."""
    if ax is not None:
        _check_axes([ax], 1)
        return ax.figure, ax
    fig = new_figure(width, height)
    return fig, fig.subplots()


def given_axes(ax: Any, count: int) -> tuple[Figure, list[Any]]:
    """The caller's axes for `count` panels: one Axes when `count` is 1, else a sequence of
    `count` Axes (e.g. `fig.subplots(1, count)`) of one figure.

    Raises:
        ValueError: a wrong number of axes, or axes of different figures.
    """
    axes = [ax] if count == 1 and not isinstance(ax, Sequence | np.ndarray) else list(np.ravel(ax))
    _check_axes(axes, count)
    return axes[0].figure, axes


def _check_axes(axes: list[Any], count: int) -> None:
    from matplotlib.axes import Axes

    if len(axes) != count or not all(isinstance(a, Axes) for a in axes):
        raise ValueError(
            f"ax must be {'a matplotlib Axes' if count == 1 else f'{count} matplotlib Axes'} "
            f"(one per panel), got {len(axes)} item(s) of type "
            f"{', '.join(sorted({type(a).__name__ for a in axes}))}"
        )
    if len({id(a.figure) for a in axes}) > 1:
        raise ValueError("ax: all the axes must belong to one figure")


def save(fig: Figure, path: str | os.PathLike) -> pathlib.Path:
    """Writes `fig` to `path` (PNG, or the format its suffix names) at `DPI` dots per inch.

    Creates the parent folder. Returns the path written.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def matrix(name: str, values: npt.ArrayLike, expected: str, *, ndim: int = 2) -> np.ndarray:
    """`values` as an `ndim`-D numpy array, leading axes of size 1 dropped (dtype kept).

    Args:
        name: the argument's name, for the error.
        values: a numpy or jax array (or nested lists).
        expected: the expected shape in axis letters, e.g. "[L, S]", for the error.
        ndim: how many axes remain once leading axes of size 1 are dropped.

    Raises:
        ValueError: `values` has another number of axes, or an axis of size 0.
    """
    array = np.asarray(values)
    shape = array.shape
    while array.ndim > ndim and array.shape[0] == 1:
        array = array[0]
    if array.ndim != ndim or 0 in array.shape:
        raise ValueError(f"{name} must be {expected}, got shape {shape}")
    return array


def check_labels(name: str, labels: Sequence[str] | None, size: int, axis: str) -> None:
    """Raises `ValueError` unless `labels` is None or holds one label per row of `axis`."""
    if labels is not None and len(labels) != size:
        raise ValueError(f"{name} has {len(labels)} labels for {axis} = {size}")


def label_axis(ax: Any, which: str, labels: Sequence[str] | None) -> None:
    """Tick labels along one axis of an image: one per cell, else a few integer positions.

    x labels longer than 2 characters (tokens) stand at 90 degrees, so ~20 short tokens stay
    readable side by side.
    """
    if labels is None:
        ax.locator_params(axis=which, integer=True)  # positions
        return
    text = [str(label) for label in labels]
    if which == "x":
        rotation = 90 if max(map(len, text), default=0) > 2 else 0
        ax.set_xticks(range(len(text)), text, rotation=rotation, fontsize="small")
    else:
        ax.set_yticks(range(len(text)), text, fontsize="small")
