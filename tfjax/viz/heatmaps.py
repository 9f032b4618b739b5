"""Heat maps of arrays: positional tables, their dot products, masks and attention weights.

Each function takes numpy or jax arrays, checks their shapes (a `ValueError` names the expected
one) and returns a new `matplotlib.figure.Figure` on its own Agg canvas. The image of each
panel holds the values drawn, unchanged: `fig.axes[0].images[0].get_array()` is the table, the
mask or the weights given. Rows are queries (or positions) from the top, columns keys (or
dimensions) from the left, as the arrays print.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tfjax.viz import canvas

_CELL = 0.28  # inches per token of an attention map or mask
_GRID_UP_TO = 40  # cells per side up to which masks get white lines between cells
_EVERY_TICK_UP_TO = 16  # cells per side up to which masks number every position
_MASK_COLORS = ("#eeeeee", "#2b6cb0")  # False (masked), True (attends)


def _label_room(tokens: Sequence[str] | None) -> float:
    """Inches below a panel for its x tick labels, drawn rotated: grows with the longest."""
    return 0.075 * max((len(token) for token in tokens or ()), default=0)


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _table(table: npt.ArrayLike) -> np.ndarray:
    return canvas.matrix("table", table, "[L, D] (positions x dimensions)").astype(np.float32)


def positional_heatmap(
    table: npt.ArrayLike, *, title: str | None = None, ax: Any = None
) -> canvas.Figure:
    """Positions down, dimensions across, values on a blue-white-red scale centred on 0.

    Args:
        table: [L, D] float, e.g. `tfjax.nn.positional.sinusoidal_table(128, 64)`.
        title: the figure's title; default names the shape.
        ax: a matplotlib Axes to draw into (with its colour bar beside it) instead of a new
            figure; the function then returns `ax.figure`.

    Raises:
        ValueError: `table` is not [L, D].
    """
    values = _table(table)  # [L, D]
    length, dim = values.shape
    bound = float(np.abs(values).max()) or 1.0
    fig, ax = canvas.one_axes(ax, 6.4, 4.8)
    image = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    ax.set(
        xlabel="dimension d", ylabel="position", title=title or f"{length} positions x {dim} dims"
    )
    canvas.label_axis(ax, "x", None)
    canvas.label_axis(ax, "y", None)
    fig.colorbar(image, ax=ax, label="value")
    return fig


def similarity_heatmap(
    table: npt.ArrayLike, *, title: str | None = None, ax: Any = None
) -> canvas.Figure:
    """The dot product of every pair of positions, `table @ table.T` ([L, L]).

    Args:
        table: [L, D] float, one row per position.
        title: the figure's title; default names the shape.
        ax: a matplotlib Axes to draw into instead of a new figure (returns `ax.figure`).

    Raises:
        ValueError: `table` is not [L, D].
    """
    values = _table(table)  # [L, D]
    length = values.shape[0]
    products = values @ values.T  # [L, L]
    fig, ax = canvas.one_axes(ax, 5.6, 4.8)
    image = ax.imshow(products, cmap="viridis")
    default = f"dot products of {length} positions"
    ax.set(xlabel="position j", ylabel="position i", title=title or default)
    canvas.label_axis(ax, "x", None)
    canvas.label_axis(ax, "y", None)
    fig.colorbar(image, ax=ax, label="table[i] · table[j]")
    return fig


def _mask(name: str, mask: npt.ArrayLike) -> np.ndarray:
    values = canvas.matrix(name, mask, "[L, S] (or [1, 1, L, S]: leading 1s are dropped)")
    if values.dtype != np.bool_:
        integer = np.issubdtype(values.dtype, np.integer)
        if not (integer and np.isin(values, (0, 1)).all()):
            raise ValueError(f"{name} must be bool (True = attend), got {values.dtype}")
        values = values.astype(bool)
    return values  # [L, S] bool


def _draw_mask(ax: Any, values: np.ndarray) -> Any:
    """The mask as cells: blue attends, grey masked; white lines between cells when few."""
    from matplotlib import colors

    cmap = colors.ListedColormap(_MASK_COLORS)
    image = ax.imshow(values, cmap=cmap, vmin=0, vmax=1)
    length, kv_length = values.shape
    if max(length, kv_length) <= _GRID_UP_TO:
        ax.set_xticks(np.arange(kv_length + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(length + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", linewidth=1.0)
        ax.tick_params(which="minor", length=0)
    return image


def _positions(size: int) -> list[str] | None:
    """Every position as a tick label on a small mask; None (a few ticks) on a large one."""
    return [str(i) for i in range(size)] if size <= _EVERY_TICK_UP_TO else None


def _mask_colorbar(fig: Any, image: Any, axes: Any) -> None:
    bar = fig.colorbar(image, ax=axes, ticks=[0.25, 0.75], shrink=0.6)
    bar.ax.set_yticklabels(["False: masked", "True: attends"])


def mask_matrix(
    mask: npt.ArrayLike,
    *,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str | None = None,
    ax: Any = None,
) -> canvas.Figure:
    """Which key (column) each query (row) may attend: blue True, grey False.

    Args:
        mask: [L, S] bool, or broadcastable with leading axes of size 1 (e.g. the
            [1, 1, L, S] of `tfjax.nn.masking.causal_mask`); 0/1 integers are taken as bool.
        query_labels: L tick labels for the rows (default: positions).
        key_labels: S tick labels for the columns (default: positions).
        title: the figure's title; default names the shape.
        ax: a matplotlib Axes to draw into instead of a new figure (returns `ax.figure`).

    Raises:
        ValueError: `mask` is not [L, S] after dropping leading 1s, is not bool, or a label
            count differs from L or S.
    """
    values = _mask("mask", mask)  # [L, S]
    length, kv_length = values.shape
    canvas.check_labels("query_labels", query_labels, length, "L")
    canvas.check_labels("key_labels", key_labels, kv_length, "S")
    fig, ax = canvas.one_axes(
        ax, _clamp(_CELL * kv_length + 3.2, 4.5, 10.0), _clamp(_CELL * length + 1.6, 3.2, 9.0)
    )
    image = _draw_mask(ax, values)
    ax.set(
        xlabel="key", ylabel="query", title=title or f"mask: {length} queries x {kv_length} keys"
    )
    canvas.label_axis(ax, "x", _positions(kv_length) if key_labels is None else key_labels)
    canvas.label_axis(ax, "y", _positions(length) if query_labels is None else query_labels)
    _mask_colorbar(fig, image, ax)
    return fig


def _layout(count: int, ncols: int) -> tuple[int, int]:
    """(columns, rows) of `count` panels in rows of at most `ncols`."""
    if ncols < 1:
        raise ValueError(f"ncols must be >= 1, got {ncols}")
    cols = min(ncols, count)
    return cols, math.ceil(count / cols)


def _grid(fig: Any, count: int, cols: int, rows: int) -> list[Any]:
    """`count` axes in `rows` x `cols`; the unused places of the last row are removed."""
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[count:]:
        ax.remove()
    return list(axes[:count])


def mask_grid(
    masks: Mapping[str, npt.ArrayLike], *, ncols: int = 4, ax: Any = None
) -> canvas.Figure:
    """Several masks side by side, one titled panel each, with one shared colour key.

    Args:
        masks: name -> [L, S] bool mask (leading 1s dropped, as in `mask_matrix`); the shapes
            may differ.
        ncols: panels per row (without `ax`).
        ax: the matplotlib Axes to draw into instead of a new figure, one per mask (a single
            Axes for one mask), all of one figure; returns that figure.

    Raises:
        ValueError: no masks, a mask that is not [L, S] bool (named in the message),
            `ncols` < 1, or `ax` not one Axes per mask.
    """
    if not masks:
        raise ValueError("masks is empty: give at least one name -> [L, S] mask")
    values = {name: _mask(f"mask {name!r}", mask) for name, mask in masks.items()}
    side = max(max(v.shape) for v in values.values())
    panel = _clamp(_CELL * side + 0.9, 2.4, 4.5)
    cols, rows = _layout(len(values), ncols)
    if ax is not None:
        fig, axes = canvas.given_axes(ax, len(values))
    else:
        fig = canvas.new_figure(panel * cols + 1.4, (panel + 0.4) * rows)
        axes = _grid(fig, len(values), cols, rows)
    for ax, (name, mask) in zip(axes, values.items(), strict=True):
        image = _draw_mask(ax, mask)
        ax.set(title=name, xlabel="key", ylabel="query")
        canvas.label_axis(ax, "x", _positions(mask.shape[1]))
        canvas.label_axis(ax, "y", _positions(mask.shape[0]))
    _mask_colorbar(fig, image, axes)
    return fig


def _weights(weights: npt.ArrayLike, expected: str, ndim: int) -> np.ndarray:
    return canvas.matrix("weights", weights, expected, ndim=ndim).astype(np.float32)


def _check_tokens(query_tokens, key_tokens, length: int, kv_length: int) -> None:
    canvas.check_labels("query_tokens", query_tokens, length, "L (weights' query rows)")
    canvas.check_labels("key_tokens", key_tokens, kv_length, "S (weights' key columns)")


def _draw_weights(ax: Any, values: np.ndarray, vmax: float) -> Any:
    return ax.imshow(values, cmap="viridis", vmin=0.0, vmax=vmax)


def attention_map(
    weights: npt.ArrayLike,
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    ax: Any = None,
) -> canvas.Figure:
    """One head's attention weights: queries down, keys across, the weight as colour.

    Args:
        weights: [L, S] float (leading axes of size 1 are dropped, so one example's
            [1, 1, L, S] works too); each row usually sums to 1.
        query_tokens: L labels for the rows (e.g. the target tokens).
        key_tokens: S labels for the columns (e.g. the source tokens).
        title: the figure's title.
        ax: a matplotlib Axes to draw into instead of a new figure (returns `ax.figure`).

    Raises:
        ValueError: `weights` is not [L, S], or a token count differs from L or S.
    """
    values = _weights(weights, "[L, S] (one head; attention_heads draws [N, L, S])", 2)
    length, kv_length = values.shape
    _check_tokens(query_tokens, key_tokens, length, kv_length)
    width = _clamp(_CELL * kv_length + 2.8, 4.0, 12.0)
    height = _clamp(_CELL * length + 1.8, 3.2, 12.0) + _label_room(key_tokens)
    fig, ax = canvas.one_axes(ax, width, height)
    image = _draw_weights(ax, values, float(values.max()) or 1.0)
    ax.set(xlabel="key", ylabel="query", title=title or "attention weights")
    canvas.label_axis(ax, "x", key_tokens)
    canvas.label_axis(ax, "y", query_tokens)
    fig.colorbar(image, ax=ax, label="attention weight", shrink=0.8)
    return fig


def attention_heads(
    weights: npt.ArrayLike,
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    ncols: int = 4,
    ax: Any = None,
) -> canvas.Figure:
    """Every head's attention weights, one panel per head on one colour scale.

    Args:
        weights: [N, L, S] float (leading axes of size 1 are dropped, so one example's
            [1, N, L, S] works too).
        query_tokens: L labels for the rows (shown on the first panel of each row).
        key_tokens: S labels for the columns (shown on every panel).
        title: the figure's title (not set on a figure given through `ax`).
        ncols: panels per row; with `ax`, where the rows of `ax` begin (query labels).
        ax: the matplotlib Axes to draw into instead of a new figure, one per head (a single
            Axes for one head), all of one figure; returns that figure.

    Raises:
        ValueError: `weights` is not [N, L, S], a token count differs from L or S, `ncols`
            < 1, or `ax` not one Axes per head.
    """
    values = _weights(weights, "[N, L, S] (heads x queries x keys)", 3)
    num_heads, length, kv_length = values.shape
    _check_tokens(query_tokens, key_tokens, length, kv_length)
    cols, rows = _layout(num_heads, ncols)
    panel_w = _clamp(_CELL * kv_length + 0.9, 2.4, 6.0)
    panel_h = _clamp(_CELL * length + 0.9, 2.2, 6.0) + _label_room(key_tokens)
    own_figure = ax is None
    if not own_figure:
        fig, axes = canvas.given_axes(ax, num_heads)
    else:
        fig = canvas.new_figure(panel_w * cols + 1.6, panel_h * rows + 0.6 + 0.4 * bool(title))
        axes = _grid(fig, num_heads, cols, rows)
    vmax = float(values.max()) or 1.0
    for head, ax in enumerate(axes):
        image = _draw_weights(ax, values[head], vmax)
        ax.set(title=f"head {head}", xlabel="key")
        canvas.label_axis(ax, "x", key_tokens)
        if head % cols == 0:
            ax.set(ylabel="query")
            canvas.label_axis(ax, "y", query_tokens)
        else:
            canvas.label_axis(ax, "y", None if query_tokens is None else [""] * length)
    fig.colorbar(image, ax=axes, label="attention weight", shrink=0.8)
    if title and own_figure:
        fig.suptitle(title)
    return fig
