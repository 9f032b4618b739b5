"""Whether a sweep is done: the best setting, swept keys whose best value is at the edge of
their range (with the next range to try), and whether the best and the runner-up are separable.

Input are the sweep's summary rows (`experiments.sweep_summary.summary_row`: the run, its
status, its overrides as text, its latest metrics). The runs with status "ok" that differ only
in `seed` form one setting; each metric of a setting is its mean ± sample std over the seeds, n
(`experiments.seed_stats`). Settings are ranked by the mean of one metric (`chosen_metric`:
`eval/loss` when the runs report it, lower is better).

Edge: for each swept key whose values are numbers (two distinct ones or more), the best
setting's value is "at the edge" when it is the lowest or the highest value swept: the optimum
may lie beyond, and `next_range` suggests the edge value and two more beyond it, at the grid's
own spacing: its mean ratio (v_max / v_min)^(1 / (m - 1)) when the values are positive and
closer to evenly spaced in log than in value (`geometric`), else its mean step
(v_max - v_min) / (m - 1). Integers stay integers; a key swept only at values >= 0 (>= 1 for
integers) is not suggested values below that.

Separable: the best and the runner-up setting by Welch's t-test at p < 0.05 (formulas in
`experiments.seed_stats`); with one seed on either side it says it cannot tell.
"""

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence

from experiments import seed_stats

SEED_KEY = "seed"  # runs that differ only in it form one setting
NOT_SETTINGS = ("run", "status", "seconds", SEED_KEY)
METRIC_PREFIXES = ("eval/", "train/")
# Metric name (after "eval/" or "train/") -> True when lower is better.
LOWER_IS_BETTER = {
    "loss": True,
    "nll": True,
    "perplexity": True,
    "accuracy": False,
    "exact_match": False,
    "bleu": False,
}
_INTEGER = re.compile(r"[+-]?\d+")


@dataclasses.dataclass(frozen=True)
class Setting:
    """The runs of a sweep that differ only in their seed.

    Attributes:
        overrides: each swept key but the seed -> its value as the summary shows it.
        seeds: the seeds of its "ok" runs, as text, in summary order.
        metrics: each metric its runs report (finite values only) -> its `Spread` over them.
    """

    overrides: dict[str, str]
    seeds: tuple[str, ...]
    metrics: dict[str, seed_stats.Spread]

    @property
    def label(self) -> str:
        """`a.b=v, c.d=w`, or "(defaults)" for a setting that overrides nothing."""
        return ", ".join(f"{k}={v}" for k, v in self.overrides.items()) or "(defaults)"


def columns(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """Every key of `rows`, in first-seen order."""
    return list(dict.fromkeys(key for row in rows for key in row))


def is_metric(column: str) -> bool:
    """A metric column: `eval/...` or `train/...`, not a `.../step`."""
    return column.startswith(METRIC_PREFIXES) and not column.endswith("/step")


def number(value: object) -> float | None:
    """`value` as a finite float, else None."""
    try:
        result = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


def settings(rows: Sequence[Mapping[str, object]]) -> list[Setting]:
    """The "ok" rows merged by every swept key but `seed`, in first-seen order."""
    all_columns = columns(rows)
    keys = [c for c in all_columns if c not in NOT_SETTINGS and not c.startswith(METRIC_PREFIXES)]
    metrics = [c for c in all_columns if is_metric(c)]
    groups: dict[tuple, list[Mapping[str, object]]] = {}
    for row in rows:
        if row.get("status") == "ok":
            groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    merged = []
    for key, members in groups.items():
        spreads = {}
        for metric in metrics:
            values = [v for v in (number(m.get(metric)) for m in members) if v is not None]
            if values:
                spreads[metric] = seed_stats.spread(values)
        overrides = {k: str(v) for k, v in zip(keys, key, strict=True) if v not in (None, "")}
        seeds = tuple(str(m.get(SEED_KEY, "")) for m in members)
        merged.append(Setting(overrides, seeds, spreads))
    return merged


def chosen_metric(found: Sequence[Setting]) -> tuple[str, bool] | None:
    """(metric, lower is better) to rank by: `eval/loss`, else the first eval metric of known
    direction, else `train/loss`; None when the settings report none of them."""
    reported = list(dict.fromkeys(m for s in found for m in s.metrics))
    evals = [m for m in reported if m.startswith("eval/") and m[5:] in LOWER_IS_BETTER]
    for metric in ["eval/loss", *evals, "train/loss"]:
        if metric in reported:
            return metric, LOWER_IS_BETTER[metric.split("/", 1)[1]]
    return None


def ranked(found: Sequence[Setting], metric: str, lower_is_better: bool) -> list[Setting]:
    """The settings that report `metric`, best mean first (ties keep the sweep's order)."""
    have = [s for s in found if metric in s.metrics]
    sign = 1.0 if lower_is_better else -1.0
    return sorted(have, key=lambda s: sign * s.metrics[metric].mean)


@dataclasses.dataclass(frozen=True)
class Edge:
    """Where the best setting's value of one numeric swept key lies.

    Attributes:
        key: the swept key.
        best: the best setting's value (as the summary shows it).
        values: the distinct values swept, ascending, as numbers.
        side: "lowest" or "highest" when the best is at that edge; None inside the range.
        integer: whether every value swept is written as an integer.
        next_values: at an edge: the edge value and up to two beyond it (`next_range`).
    """

    key: str
    best: str
    values: tuple[float, ...]
    side: str | None
    integer: bool = False
    next_values: tuple[float, ...] = ()

    @property
    def open(self) -> bool:
        """At an edge with a value beyond it to try (not at 0, or 1 for integers, from above)."""
        return self.side is not None and len(self.next_values) > 1


def edges(found: Sequence[Setting], best: Setting) -> list[Edge]:
    """An `Edge` for every swept key with numeric values (two distinct or more) that the best
    setting sets."""
    keys = list(dict.fromkeys(k for s in found for k in s.overrides))
    out = []
    for key in keys:
        texts = [s.overrides[key] for s in found if key in s.overrides]
        numbers = [number(t) for t in texts]
        if key not in best.overrides or None in numbers or len(set(numbers)) < 2:
            continue
        values = tuple(sorted(set(numbers)))
        value = number(best.overrides[key])
        side = "lowest" if value == values[0] else "highest" if value == values[-1] else None
        integer = all(_INTEGER.fullmatch(t.strip()) for t in texts)
        suggested = next_range(values, side, integer) if side else ()
        out.append(Edge(key, best.overrides[key], values, side, integer, suggested))
    return out


def geometric(values: Sequence[float]) -> bool:
    """Whether ascending distinct `values` are positive and closer to evenly spaced in log
    than in value: the relative spread (max - min) / mean of their log ratios is at most that
    of their differences (two positive values: geometric)."""
    if values[0] <= 0.0:
        return False
    steps = [b - a for a, b in itertools.pairwise(values)]
    logs = [math.log(b / a) for a, b in itertools.pairwise(values)]
    return _relative_spread(logs) <= _relative_spread(steps)


def _relative_spread(gaps: Sequence[float]) -> float:
    return (max(gaps) - min(gaps)) / (sum(gaps) / len(gaps))


def next_range(values: Sequence[float], side: str, integer: bool) -> tuple[float, ...]:
    """The edge value and two beyond it at the grid's mean ratio or step (module docstring),
    ascending; floats to 3 significant digits, integers rounded (and deduplicated); values
    below 0 (below 1 for integers) dropped when every swept value is at least that."""
    m = len(values)
    low, high = values[0], values[-1]
    if geometric(values):
        ratio = (high / low) ** (1.0 / (m - 1))
        beyond = (
            [high * ratio, high * ratio**2] if side == "highest" else [low / ratio**2, low / ratio]
        )
    else:
        step = (high - low) / (m - 1)
        beyond = (
            [high + step, high + 2 * step] if side == "highest" else [low - 2 * step, low - step]
        )
    edge = high if side == "highest" else low
    floor = (1.0 if integer else 0.0) if low >= (1.0 if integer else 0.0) else -math.inf
    tiny = 1e-9 * max(abs(low), abs(high))  # an arithmetic step's rounding error about 0
    rounded = [float(round(v)) if integer else float(f"{v:.3g}") * (abs(v) > tiny) for v in beyond]
    kept = sorted({v for v in rounded if v >= floor and v != edge} | {edge})
    return tuple(kept)


def _number_text(value: float, integer: bool) -> str:
    return str(int(value)) if integer else f"{value:.4g}"


def _spread_text(spread: seed_stats.Spread) -> str:
    if spread.n == 1:
        return f"{spread.mean:.4g} (n = 1)"
    return f"{spread.mean:.4g} ± {spread.std:.2g} (n = {spread.n})"


def edge_line(edge: Edge) -> str:
    """One line on where the best value of `edge.key` lies, with the next range at an edge."""
    shown = ", ".join(_number_text(v, edge.integer) for v in edge.values)
    if edge.side is None:
        return f"`{edge.key}`: the best value, {edge.best}, lies inside the range swept ({shown})."
    direction = "below" if edge.side == "lowest" else "above"
    if not edge.open:
        return (
            f"`{edge.key}`: the best value, {edge.best}, is the {edge.side} swept ({shown}), "
            "and the lowest such a key takes: nothing below it to try."
        )
    suggested = ", ".join(_number_text(v, edge.integer) for v in edge.next_values)
    return (
        f"`{edge.key}`: the best value, {edge.best}, is the {edge.side} swept ({shown}): "
        f"the optimum may lie {direction} it; next range: {suggested}."
    )


def separability_line(best: seed_stats.Spread, runner_up: seed_stats.Spread) -> str:
    """Whether the best and the runner-up differ by Welch's t-test at p < `seed_stats.ALPHA`."""
    test = f"Welch's t-test, two-sided p < {seed_stats.ALPHA:g}"
    result = seed_stats.welch(best, runner_up)
    if result is None:
        return (
            f"Separable ({test}): cannot tell with one run per setting; add a `{SEED_KEY}` "
            "axis to the sweep (two seeds or more per setting)."
        )
    figures = f"t = {result.t:.3g}, df = {result.df:.3g}, p = {result.p:.2g}"
    if result.separable:
        return f"Separable ({test}): yes ({figures})."
    return f"Separable ({test}): no ({figures}): more seeds, or treat them as equal."


def report(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """The lines of the "Is the sweep done?" section of `summary.md` (markdown; the sweep
    prints them at its end); none when no run reports a metric to rank by."""
    found = settings(rows)
    chosen = chosen_metric(found)
    if chosen is None:
        return []
    metric, lower = chosen
    order = ranked(found, metric, lower)
    best = order[0]
    lines = [
        "## Is the sweep done?",
        "",
        f"Ranked by `{metric}` ({'lower' if lower else 'higher'} is better); a setting is the "
        f'runs with status "ok" that differ only in `{SEED_KEY}` (mean ± std over them, n).',
        "",
        f"- Best: {best.label}: {_spread_text(best.metrics[metric])}.",
    ]
    separable = None
    if len(order) > 1:
        lines.append(f"- Runner-up: {order[1].label}: {_spread_text(order[1].metrics[metric])}.")
        lines.append("- " + separability_line(best.metrics[metric], order[1].metrics[metric]))
        result = seed_stats.welch(best.metrics[metric], order[1].metrics[metric])
        separable = None if result is None else result.separable
    found_edges = edges(found, best)
    lines += ["- " + edge_line(edge) for edge in found_edges]
    if len(order) > 1:
        lines.append("- " + _verdict([e for e in found_edges if e.open], separable))
    return lines


def _verdict(at_edge: Sequence[Edge], separable: bool | None) -> str:
    reasons = []
    if at_edge:
        keys = ", ".join(f"`{e.key}`" for e in at_edge)
        reasons.append(f"the best lies at the edge of {keys}: sweep the next range")
    if separable is False:
        reasons.append("the best is not separable from the runner-up: add seeds")
    if reasons:
        return "Not done: " + "; ".join(reasons) + "."
    if separable is None:
        return (
            "Done as far as the ranges go: the best lies inside every numeric range swept "
            "(seeds would tell whether it beats the runner-up)."
        )
    return "Done: the best lies inside every numeric range swept and beats the runner-up."
