"""A sweep's summaries: one row per run (`summary.csv`, `summary.md`) and the runs that differ
only in their seed merged (`seeds.csv`, `seeds.md`), written by `experiments.sweep`.

A row holds the run's name, status, overrides, wall time, and the latest evaluation and train
metrics of its `metrics.jsonl`; `format_value` writes a config value as the sweep's run names,
commands and summaries show it.
"""

import csv
import math
import pathlib
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tfjax.training import logger

# The latest of either kind is the run's final evaluation (the trainer ends with "final_eval").
_EVAL_KINDS = ("eval", "final_eval")
SEED_KEY = "seed"  # runs that differ only in it are averaged in seeds.md
_NOT_SETTINGS = ("run", "status", "seconds", SEED_KEY)
_METRIC_PREFIXES = ("eval/", "train/")


def format_value(value: object) -> str:
    """A config value as `--config.a.b=` text that `config_utils.load_config` parses back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(format_value(v) for v in value) if value else "()"
    return repr(value) if isinstance(value, float) else str(value)


def summary_row(run: Any, status: str, seconds: float | None = None) -> dict[str, object]:
    """A summary row of `run` (an `experiments.sweep.Run`): run name, status, overrides, wall
    time, latest eval and train metrics.

    Metric columns are `eval/<name>` (latest "eval" or "final_eval" record, whichever comes
    last) and `train/<name>` (latest "train" record), each with its `/step`.
    """
    row: dict[str, object] = {"run": run.name, "status": status}
    row.update({key: format_value(value) for key, value in run.overrides.items()})
    row["seconds"] = None if seconds is None else round(seconds, 1)
    records = logger.read_metrics(run.workdir)
    for prefix, kinds in (("eval", _EVAL_KINDS), ("train", ("train",))):
        latest = next((r for r in reversed(records) if r.get("kind") in kinds), None)
        if latest is not None:
            row.update({f"{prefix}/{k}": v for k, v in latest.items() if k != "kind"})
    return row


def _columns(rows: Sequence[Mapping[str, object]]) -> list[str]:
    return list(dict.fromkeys(key for row in rows for key in row))


def _markdown_cell(value: object) -> str:
    if value is None:
        return ""
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|")


def _write_csv(
    path: pathlib.Path, rows: Sequence[Mapping[str, object]], columns: Sequence[str]
) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)


def write_summary(
    rows: Sequence[Mapping[str, object]], directory: str | pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes `summary.csv` (full precision) and `summary.md` (4 significant digits).

    Args:
        rows: one mapping per run; columns are the union of keys in first-seen order and
            missing cells stay empty.
        directory: created if missing.

    Returns:
        The paths of the CSV and markdown files.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    columns = _columns(rows)
    csv_path, md_path = directory / "summary.csv", directory / "summary.md"
    _write_csv(csv_path, rows, columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_markdown_cell(row.get(c)) for c in columns) + " |")
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if any(SEED_KEY in row for row in rows):
        write_seed_summary(rows, directory)
    return csv_path, md_path


def _is_metric(column: str) -> bool:
    return column.startswith(("eval/", "train/")) and not column.endswith("/step")


def _float(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def seed_summary(rows: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Rows that differ only in `seed` merged: their count and each metric's mean and sample
    standard deviation (n - 1; empty for one seed), over the runs with status "ok".

    A row per setting of the other overrides, in first-seen order: those overrides, `seeds`
    (the seeds averaged, e.g. "0,1,2"), and `<metric>/mean`, `<metric>/std` for every
    `eval/...` and `train/...` metric.
    """
    columns = _columns(rows)
    metrics = [c for c in columns if _is_metric(c)]
    settings = [c for c in columns if c not in _NOT_SETTINGS and not c.startswith(_METRIC_PREFIXES)]
    groups: dict[tuple, list[Mapping[str, object]]] = {}
    for row in rows:
        if row.get("status") == "ok":
            groups.setdefault(tuple(row.get(c) for c in settings), []).append(row)
    merged = []
    for key, members in groups.items():
        out: dict[str, object] = {c: v for c, v in zip(settings, key, strict=True) if v is not None}
        out["seeds"] = ",".join(str(m.get(SEED_KEY, "")) for m in members)
        for metric in metrics:
            values = [v for v in (_float(m.get(metric)) for m in members) if v is not None]
            if values:
                out[f"{metric}/mean"] = statistics.fmean(values)
                out[f"{metric}/std"] = statistics.stdev(values) if len(values) > 1 else None
        merged.append(out)
    return merged


def write_seed_summary(
    rows: Sequence[Mapping[str, object]], directory: str | pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes `seeds.csv` and `seeds.md` (`seed_summary`); the markdown gives each metric as
    "mean ± std" to 4 significant digits."""
    directory = pathlib.Path(directory)
    merged = seed_summary(rows)
    columns = _columns(merged)
    csv_path, md_path = directory / "seeds.csv", directory / "seeds.md"
    _write_csv(csv_path, merged, columns)
    shown = [c for c in columns if not c.endswith(("/mean", "/std"))]
    metrics = [c[: -len("/mean")] for c in columns if c.endswith("/mean")]
    lines = [
        "| " + " | ".join([*shown, *metrics]) + " |",
        "|" + "---|" * (len(shown) + len(metrics)),
    ]
    for row in merged:
        cells = [_markdown_cell(row.get(c)) for c in shown]
        for metric in metrics:
            mean, std = row.get(f"{metric}/mean"), row.get(f"{metric}/std")
            if mean is None:
                cells.append("")
            else:
                cells.append(_markdown_cell(mean) + ("" if std is None else f" ± {std:.2g}"))
        lines.append("| " + " | ".join(cells) + " |")
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return csv_path, md_path
