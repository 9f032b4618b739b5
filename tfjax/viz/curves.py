"""Learning curves of runs: each metric against step, read from each workdir's metrics.jsonl.

`learning_curves` draws one panel per metric; each run has one colour, its train records a
line and its eval records markers on a dashed line. `metric_series` (the points of one curve)
and `wide_positive_range` (when an axis goes logarithmic) are the pure parts, shared with
`experiments/plot.py`'s sweep plots.
"""

import math
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from tfjax import errors
from tfjax.training import logger
from tfjax.viz import canvas

Workdir = str | os.PathLike
_WIDE_RANGE = 10.0  # log scale when max / min exceeds this
# How each kind of record is drawn: train a line, eval (fewer points) markers on a dashed line.
_STYLES = {
    "train": {"linestyle": "-"},
    "eval": {"linestyle": "--", "marker": "o", "markersize": 4},
}


def metric_series(
    records: Sequence[Mapping], metric: str, kind: str
) -> tuple[list[int], list[float]]:
    """(steps, values) of `metric` in the records of `kind`, oldest first.

    For kind "eval" the "final_eval" record joins the curve when it comes after the last
    periodic evaluation (a final evaluation at the step of a periodic one is on another number
    of examples, so it is not a point of the same curve).

    Args:
        records: `logger.read_metrics` records (dicts with "step" and "kind").
        metric: the name of the value, e.g. "loss"; records without it are skipped.
        kind: "train", "eval" or any other record kind.
    """

    def points(wanted: str) -> list[tuple[int, float]]:
        return [
            (r["step"], float(r[metric]))
            for r in records
            if r.get("kind") == wanted and metric in r
        ]

    curve = points(kind)
    if kind == "eval":
        for step, value in points("final_eval"):
            if not curve or step > curve[-1][0]:
                curve.append((step, value))
    return [step for step, _ in curve], [value for _, value in curve]


def wide_positive_range(values: Sequence[float]) -> bool:
    """Whether the finite values are all positive and max / min exceeds 10 (log scale)."""
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) > _WIDE_RANGE


def _labelled(
    workdirs: Workdir | Sequence[Workdir] | Mapping[str, Workdir],
) -> dict[str, pathlib.Path]:
    """label -> workdir: a mapping as given; otherwise each folder's name (its path if two
    names are alike)."""
    if isinstance(workdirs, Mapping):
        return {str(label): pathlib.Path(path) for label, path in workdirs.items()}
    if isinstance(workdirs, str | os.PathLike):
        workdirs = [workdirs]
    paths = [pathlib.Path(w) for w in workdirs]
    names = [path.name or str(path) for path in paths]
    if len(set(names)) < len(names):
        names = [str(path) for path in paths]
    return dict(zip(names, paths, strict=True))


def _read(workdir: pathlib.Path) -> list[dict]:
    if not (workdir / logger.METRICS_FILE).is_file():
        what = "does not exist" if not workdir.exists() else f"holds no {logger.METRICS_FILE}"
        raise FileNotFoundError(
            f"workdir {workdir} {what}: train a run there first "
            f"(python -m experiments.train --config=FILE --workdir={workdir})"
        )
    return logger.read_metrics(workdir)


def learning_curves(
    workdirs: Workdir | Sequence[Workdir] | Mapping[str, Workdir],
    *,
    metrics: Sequence[str] = ("loss",),
    title: str | None = None,
    ax: Any = None,
) -> canvas.Figure:
    """One panel per metric against step: train a line, eval markers, one colour per run.

    A panel's y axis is logarithmic when its values are positive and span more than 10x.
    Each curve is a `Line2D` labelled "<run>: train" or "<run>: eval" (a run without such
    records has no such line); the legend names the runs and the two styles.

    Args:
        workdirs: run directories holding `metrics.jsonl` (as `tfjax.training.logger` writes
            it): one path, a sequence of paths (labelled by folder name), or label -> path.
        metrics: the metric names to draw, e.g. ("loss", "bleu").
        title: the figure's title (not set on a figure given through `ax`).
        ax: the matplotlib Axes to draw into instead of a new figure, one per metric (a single
            Axes for one metric), all of one figure; the legend then goes on the last of them,
            and the function returns their figure.

    Raises:
        FileNotFoundError: a workdir without `metrics.jsonl` (named in the message).
        ValueError: no workdirs or no metrics.
        tfjax.errors.WorkdirError: a metric no run has logged (a `ValueError`; the message
            lists those logged).
    """
    runs = {label: _read(path) for label, path in _labelled(workdirs).items()}
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    _check_metrics(runs, metrics)
    colors = {label: f"C{i % 10}" for i, label in enumerate(runs)}
    if ax is not None:
        fig, axes = canvas.given_axes(ax, len(metrics))
    else:
        fig = canvas.new_figure(4.8 * len(metrics) + 2.0, 4.0)
        axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for panel, metric in zip(axes, metrics, strict=True):
        _draw_metric(panel, runs, metric, colors)
    if ax is not None:
        axes[-1].legend(handles=_legend_handles(colors), fontsize="small")
        return fig
    fig.legend(handles=_legend_handles(colors), loc="outside right upper", fontsize="small")
    if title:
        fig.suptitle(title)
    return fig


def _check_metrics(runs: Mapping[str, Sequence[Mapping]], metrics: Sequence[str]) -> None:
    if not runs or not metrics:
        raise ValueError("learning_curves needs at least one workdir and one metric")
    logged = {name for records in runs.values() for r in records for name in r}
    logged -= {"step", "kind"}
    for metric in metrics:
        if metric not in logged:
            raise errors.WorkdirError(
                f"no run logged {metric!r}; the runs logged {', '.join(sorted(logged))}"
            )


def _draw_metric(
    ax: Any, runs: Mapping[str, Sequence[Mapping]], metric: str, colors: Mapping[str, str]
) -> None:
    """One panel: each run's train and eval curves of `metric`, log y on a wide range."""
    drawn = []
    for label, records in runs.items():
        for kind, style in _STYLES.items():
            steps, values = metric_series(records, metric, kind)
            if steps:
                ax.plot(steps, values, **style, color=colors[label], label=f"{label}: {kind}")
                drawn += values
    if wide_positive_range(drawn):
        ax.set_yscale("log")
    ax.set(title=metric, xlabel="step", ylabel=metric)
    ax.locator_params(axis="x", integer=True)  # steps
    ax.grid(True, alpha=0.3)


def _legend_handles(colors: Mapping[str, str]) -> list:
    """One entry per run (its colour), then the train and eval styles in grey."""
    from matplotlib import lines

    runs = [
        lines.Line2D([], [], color=color, linewidth=4, label=label)
        for label, color in colors.items()
    ]
    styles = [lines.Line2D([], [], **style, color="0.4", label=k) for k, style in _STYLES.items()]
    return runs + styles
