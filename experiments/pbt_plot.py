"""The picture of a population-based training sweep (`tfjax.runs.pbt`): `pbt.png`.

One panel per explored hyperparameter: each trial's value over the steps (a step line from one
"pbt" record of its `metrics.jsonl` to the next, to its last step), coloured by the trial's
final score (its "final_eval" value of the sweep's metric, the colour bar), a dot where it
copied another trial. `experiments.plot --sweep_dir` and `experiments.sweep --plot` draw it
when the sweep's runs have "pbt" records.

`schedules` and `final_scores` collect the numbers (pure); `draw_pbt` draws them.
"""

import math
import pathlib
from collections.abc import Mapping, Sequence

from tfjax.viz import canvas

PBT_FILE = "pbt.png"
_NOT_HYPER = ("step", "kind", "copied_from", "score")


def schedules(
    records: Mapping[str, Sequence[Mapping]],
) -> dict[str, dict[str, tuple[list[int], list[float], list[int]]]]:
    """{hyperparameter: {run: (steps, values, steps where it copied)}} from the "pbt" records
    (a run's last point repeats its value at its last record of any kind)."""
    out: dict[str, dict] = {}
    for run, own in records.items():
        pbt = [r for r in own if r.get("kind") == "pbt"]
        last = max((r["step"] for r in own), default=0)
        copies = [r["step"] for r in pbt if r["copied_from"] >= 0]
        for key in (k for r in pbt for k in r if k not in _NOT_HYPER):
            points = [(r["step"], float(r[key])) for r in pbt if key in r]
            if points and last > points[-1][0]:
                points.append((last, points[-1][1]))
            steps, values = [s for s, _ in points], [v for _, v in points]
            out.setdefault(key, {})[run] = (steps, values, copies)
    return out


def final_scores(records: Mapping[str, Sequence[Mapping]], metric: str) -> dict[str, float]:
    """Each run's last "final_eval" value of `metric` (NaN when it has none)."""
    scores = {}
    for run, own in records.items():
        finals = [float(r[metric]) for r in own if r.get("kind") == "final_eval" and metric in r]
        scores[run] = finals[-1] if finals else math.nan
    return scores


def draw_pbt(
    records: Mapping[str, Sequence[Mapping]], path: pathlib.Path, metric: str = "loss"
) -> pathlib.Path | None:
    """Writes the hyperparameter schedules coloured by final `metric` to `path`; None (nothing
    written) when no run has "pbt" records."""
    series = schedules(records)
    if not series:
        return None
    scores = final_scores(records, metric)
    finite = [s for s in scores.values() if math.isfinite(s)] or [0.0]
    low, high = min(finite), max(finite)
    fig = canvas.new_figure(5.0 * len(series) + 2.0, 4.0)
    axes = fig.subplots(1, len(series), squeeze=False)[0]
    colormap = _colormap()
    for ax, (key, runs) in zip(axes, series.items(), strict=True):
        for run, (steps, values, copies) in runs.items():
            score = scores[run]
            shade = 0.5 if high == low else (score - low) / (high - low)
            color = "red" if not math.isfinite(score) else colormap(shade)
            ax.step(steps, values, where="post", color=color, label=run)
            marks = [(s, v) for s, v in zip(steps, values, strict=True) if s in copies]
            ax.plot([s for s, _ in marks], [v for _, v in marks], "o", color=color)
        if all(v > 0 for _, vs, _ in runs.values() for v in vs):
            ax.set_yscale("log")
        ax.set(title=f"{key} (dot: copied a better trial)", xlabel="step", ylabel=key)
        ax.grid(True, alpha=0.3)
    mappable = _scalar_mappable(colormap, low, high)
    fig.colorbar(mappable, ax=list(axes), label=f"final eval {metric}")
    fig.savefig(path, dpi=100)
    return path


def _colormap():
    import matplotlib

    return matplotlib.colormaps["viridis"]


def _scalar_mappable(colormap, low: float, high: float):
    from matplotlib import cm, colors

    return cm.ScalarMappable(norm=colors.Normalize(low, high), cmap=colormap)
