"""A sweep's reporting: one row per run (`summary.csv`, `summary.md`), the runs that differ
only in their seed merged (`seeds.csv`, `seeds.md`), and the lines the sweep prints at its end;
written by `experiments.sweep`, which only expands and runs.

A row holds the run's name, status, overrides, wall time, and the latest evaluation and train
metrics of its `metrics.jsonl`; `format_value` writes a config value as the sweep's run names,
commands and summaries show it. `summary.md` ends with "Is the sweep done?"
(`experiments.sweep_advice`: the best setting, edges of the ranges swept, the next range,
whether best and runner-up are separable); the statistics are `experiments.seed_stats`.
"""

import csv
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from experiments import sweep_advice
from tfjax.training import logger

# The latest of either kind is the run's final evaluation (the trainer ends with "final_eval").
_EVAL_KINDS = ("eval", "final_eval")
SEED_KEY = sweep_advice.SEED_KEY  # runs that differ only in it are averaged in seeds.md
PREEMPTED = "preempted"  # a row's status after a SIGTERM (as tfjax.runs.vsweep.PREEMPTED)


def format_value(value: object) -> str:
    """A config value as `--config.a.b=` text that `config_utils.load_config` parses back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(format_value(v) for v in value) if value else "()"
    return repr(value) if isinstance(value, float) else str(value)


def summary_row(run: Any, status: str, seconds: float | None = None) -> dict[str, object]:
    """A summary row of `run` (an `experiments.sweep_runs.Run`): run name, status, overrides, wall
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
    columns = sweep_advice.columns(rows)
    csv_path, md_path = directory / "summary.csv", directory / "summary.md"
    _write_csv(csv_path, rows, columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_markdown_cell(row.get(c)) for c in columns) + " |")
    advice = sweep_advice.report(rows)
    lines += ["", *advice] if advice else []
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if any(SEED_KEY in row for row in rows):
        write_seed_summary(rows, directory)
    return csv_path, md_path


def seed_summary(rows: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Rows that differ only in `seed` merged (`sweep_advice.settings`, runs with status "ok"):
    their seeds, their count and each metric's mean and sample standard deviation (n - 1;
    empty for one seed).

    A row per setting of the other overrides, in first-seen order: those overrides, `seeds`
    (the seeds averaged, e.g. "0,1,2"), `n` (how many), and `<metric>/mean`, `<metric>/std`
    for every `eval/...` and `train/...` metric.
    """
    merged = []
    for setting in sweep_advice.settings(rows):
        out: dict[str, object] = dict(setting.overrides)
        out["seeds"] = ",".join(setting.seeds)
        out["n"] = len(setting.seeds)
        for metric, spread in setting.metrics.items():
            out[f"{metric}/mean"] = spread.mean
            out[f"{metric}/std"] = spread.std if spread.n > 1 else None
        merged.append(out)
    return merged


def write_seed_summary(
    rows: Sequence[Mapping[str, object]], directory: str | pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes `seeds.csv` and `seeds.md` (`seed_summary`); the markdown gives each metric as
    "mean ± std" to 4 significant digits."""
    directory = pathlib.Path(directory)
    merged = seed_summary(rows)
    columns = sweep_advice.columns(merged)
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


def failed(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """Runs that failed or went non-finite (a trial stopped by halving or a run stopped by a
    SIGTERM did not fail)."""
    return [
        str(r["run"])
        for r in rows
        if r["status"] != "ok" and not str(r["status"]).startswith(("stopped", PREEMPTED))
    ]


def preempted(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """Runs that a SIGTERM stopped or kept from starting."""
    return [str(r["run"]) for r in rows if str(r["status"]).startswith(PREEMPTED)]


def closing_lines(rows: Sequence[Mapping[str, object]], directory: pathlib.Path) -> list[str]:
    """What the sweep prints at its end: where the summary is with the counts of runs ok,
    failed (named) and preempted, then the summary's "Is the sweep done?" section
    (`sweep_advice.report`)."""
    bad, stopped = failed(rows), preempted(rows)
    counts = (
        f"{len(rows) - len(bad) - len(stopped)} ok, {len(bad)} failed"
        + (": " + ", ".join(bad) if bad else "")
        + (f", {len(stopped)} preempted" if stopped else "")
    )
    return [f"summary: {directory / 'summary.md'} ({counts})", *sweep_advice.report(rows)]
