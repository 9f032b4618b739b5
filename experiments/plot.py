"""Plot a finished sweep or the learning curves of runs.

    python -m experiments.plot --sweep_dir=runs/sweeps/lr
    python -m experiments.plot --workdir=runs/a --workdir=runs/b [--out=DIR] [--metrics=loss,bleu]

`--workdir` (repeatable) reads each run's `metrics.jsonl` and writes `learning_curves.png`
(`tfjax.viz.learning_curves`: one panel per metric, train a line, eval markers, one colour per
run) into `--out`, by default the first workdir.

`--sweep_dir` reads what `experiments.sweep` leaves in `ROOT/SWEEP`: `summary.csv` (one row per
run) and each run's `ROOT/SWEEP/<run>/metrics.jsonl`, and writes PNGs next to `summary.md`:
  * `curves.png`: train loss and eval loss against step, one line per run (log y when the
    losses span more than 10x); a failed run is dashed and marked "(failed)" in the legend;
  * `final_vs_<key>.png` for each swept key whose values are numbers (but `seed`): the final
    eval loss (and BLEU / exact match when the runs report them) against the value (log x
    when the values are positive and span more than 10x). Runs that differ only in `seed` are
    one point, their mean with a ± sample std error bar (`seed_spreads`); one line per
    setting of the other swept keys. A run that failed or whose metric is NaN is a red x
    along the top of the panel, never left out;
  * `pbt.png` for a population-based training sweep: each explored hyperparameter over the
    steps, one line per run coloured by its final eval loss (`experiments.pbt_plot`).
`experiments.sweep --plot` does the same after a sweep. Either mode prints the paths written;
giving both or neither is a one-line usage error.

Collecting the numbers (`collect_runs`, `final_points`, ...) is pure and separate from drawing.
matplotlib (the `viz` extra) is imported only when drawing, with the Agg backend on each figure
(`tfjax.viz.canvas`: the process-wide backend is left alone), so importing this module does not
import it.
"""

import csv
import dataclasses
import math
import pathlib
import re
from collections.abc import Mapping, Sequence

from absl import flags

from experiments import cli, pbt_plot, seed_stats, sweep_advice
from tfjax import errors, viz
from tfjax.training import logger
from tfjax.viz import canvas, curves

FLAGS = flags.FLAGS
SUMMARY_FILE = "summary.csv"
CURVES_FILE = "curves.png"
LEARNING_CURVES_FILE = "learning_curves.png"  # the --workdir mode's picture
# Summary columns that are not swept keys; metric columns start with "eval/" or "train/".
_RUN_COLUMNS = ("run", "status", "seconds")
_NOT_SWEPT = (*_RUN_COLUMNS, sweep_advice.SEED_KEY)  # seeds are averaged, not an axis
_METRIC_PREFIXES = ("eval/", "train/")
# Final eval metrics plotted against each swept key: loss always, the others when reported.
FINAL_METRICS = ("loss", "bleu", "exact_match")


@dataclasses.dataclass(frozen=True)
class RunSeries:
    """What the plots show of one run.

    Attributes:
        name: the run's directory name.
        status: "ok" or "failed (...)", from the summary.
        values: the run's summary cells (swept keys, `eval/loss`, ...) as text.
        train: (steps, losses) of its "train" records that have a loss.
        eval: (steps, losses) of its "eval" records that have a loss, then its "final_eval"
            if that comes at a later step (a final evaluation at the step of a periodic one is
            on another number of examples, so it is not drawn as a point of the same curve).
    """

    name: str
    status: str
    values: dict[str, str]
    train: tuple[list[int], list[float]]
    eval: tuple[list[int], list[float]]

    @property
    def failed(self) -> bool:
        """Whether the run did not finish or a loss went NaN or infinite."""
        losses = [*self.train[1], *self.eval[1]]
        return self.status != "ok" or not all(math.isfinite(loss) for loss in losses)


def collect_runs(
    rows: Sequence[Mapping[str, str]], records: Mapping[str, Sequence[Mapping]]
) -> list[RunSeries]:
    """The series of each run, in summary order.

    Args:
        rows: summary rows as `csv.DictReader` gives them (every cell text).
        records: run name -> its `logger.read_metrics` records (missing: none written).
    """
    runs = []
    for row in rows:
        own = records.get(row["run"], [])
        values = {key: text for key, text in row.items() if key not in ("run", "status")}
        train = curves.metric_series(own, "loss", "train")
        evals = curves.metric_series(own, "loss", "eval")
        runs.append(RunSeries(row["run"], row["status"], values, train, evals))
    return runs


def _number(text: str | None) -> float:
    """A summary cell as a float; NaN for an empty or missing cell."""
    return float(text) if text else math.nan


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def numeric_keys(rows: Sequence[Mapping[str, str]]) -> list[str]:
    """The swept keys whose values, in every run that sets them, are finite numbers."""
    columns = dict.fromkeys(key for row in rows for key in row)
    keys = [c for c in columns if c not in _RUN_COLUMNS and not c.startswith(_METRIC_PREFIXES)]
    numeric = []
    for key in keys:
        cells = [row.get(key) for row in rows if row.get(key)]
        if cells and all(_is_number(cell) for cell in cells):
            numeric.append(key)
    return numeric


def final_metrics(rows: Sequence[Mapping[str, str]]) -> list[str]:
    """The `FINAL_METRICS` to plot: "loss" always, the others when a run reports them."""
    return [m for m in FINAL_METRICS if m == "loss" or any(row.get(f"eval/{m}") for row in rows)]


def final_points(
    runs: Sequence[RunSeries], key: str, metric: str
) -> tuple[list[tuple[float, float, str]], list[tuple[float, str]]]:
    """The final `eval/<metric>` of each run that sets `key`, split into good and failed.

    Returns:
        `(good, failed)`: good holds `(value, metric, run name)` sorted by value; failed holds
        `(value, run name)` of the runs that failed or whose metric is missing or not finite.
    """
    good, failed = [], []
    for run in runs:
        if not run.values.get(key):
            continue  # a run of a mixed sweep that keeps this key's default
        x, y = float(run.values[key]), _number(run.values.get(f"eval/{metric}"))
        if run.failed or not math.isfinite(y):
            failed.append((x, run.name))
        else:
            good.append((x, y, run.name))
    return sorted(good), sorted(failed)


def seed_spreads(
    good: Sequence[tuple[float, float, str]], runs: Sequence[RunSeries], key: str
) -> dict[str, list[tuple[float, seed_stats.Spread]]]:
    """The good points of `final_points` merged over seeds: for each setting of the other
    swept keys but `seed` (its label, "" when there is none), `(value of key, Spread of the
    metric)` per value, ascending: what the panel draws as mean ± std error bars."""
    by_name = {run.name: run for run in runs}
    groups: dict[str, dict[float, list[float]]] = {}
    for x, y, name in good:
        others = by_name[name].values
        label = ", ".join(
            f"{k}={v}"
            for k, v in others.items()
            if k not in (key, *_NOT_SWEPT) and v and not k.startswith(_METRIC_PREFIXES)
        )
        groups.setdefault(label, {}).setdefault(x, []).append(y)
    return {
        label: [(x, seed_stats.spread(ys)) for x, ys in sorted(points.items())]
        for label, points in groups.items()
    }


wide_positive_range = curves.wide_positive_range  # log scale: positive, max / min > 10


def read_rows(directory: pathlib.Path) -> list[dict[str, str]]:
    """The rows of `directory/summary.csv`; a one-line error when there is none to read."""
    run_first = (
        "run the sweep first: python -m experiments.sweep --config=FILE --sweep=NAME "
        "writes runs/sweeps/NAME/summary.csv"
    )
    if not directory.is_dir():
        raise errors.WorkdirError(f"sweep directory {directory} does not exist; {run_first}")
    path = directory / SUMMARY_FILE
    if not path.is_file():
        raise errors.WorkdirError(f"{directory} holds no {SUMMARY_FILE}; {run_first}")
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise errors.WorkdirError(f"{path} lists no runs; {run_first}")
    return rows


def require_matplotlib() -> None:
    """Raises `errors.DependencyError` now if plots could not be drawn later."""
    canvas.figure_tools()


def _new_figure(num_panels: int):
    fig = canvas.new_figure(5.0 * num_panels + 2.0, 4.0)
    return fig, fig.subplots(1, num_panels, squeeze=False)[0]


def draw_curves(runs: Sequence[RunSeries], path: pathlib.Path) -> pathlib.Path:
    """Writes train and eval loss against step, one line per run, to `path`."""
    fig, axes = _new_figure(2)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, part in zip(axes, ("train", "eval"), strict=True):
        losses = []
        for run, color in zip(runs, colors, strict=True):
            steps, values = getattr(run, part)
            label = f"{run.name} (failed)" if run.failed else run.name
            style = "--" if run.failed else "-"
            marker = "o" if len(steps) < 3 else None  # a lone eval point stays visible
            ax.plot(steps, values, style, color=color, marker=marker, label=label)
            losses += values
        ax.set(title=f"{part} loss", xlabel="step", ylabel=f"{part} loss")
        if wide_positive_range(losses):
            ax.set_yscale("log")
        ax.locator_params(axis="x", integer=True)  # steps
        ax.grid(True, alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize="small")
    fig.savefig(path, dpi=100)
    return path


def _draw_final_panel(ax, runs: Sequence[RunSeries], key: str, metric: str) -> None:
    good, failed = final_points(runs, key, metric)
    for label, points in seed_spreads(good, runs, key).items():
        xs, spreads = [x for x, _ in points], [s for _, s in points]
        ax.errorbar(
            xs,
            [s.mean for s in spreads],
            yerr=[s.std for s in spreads],  # 0 for one seed: no bar
            fmt="o-",
            capsize=4,
            label=(label or "final eval")
            + (" (mean ± std over seeds)" if any(s.n > 1 for s in spreads) else ""),
        )
    if failed:
        # Along the top edge (x in data, y in axes coordinates): there is no value to show.
        top = [0.95] * len(failed)
        transform = ax.get_xaxis_transform()
        label = f"failed / NaN ({len(failed)})"
        xs = [x for x, _ in failed]
        ax.plot(xs, top, "x", color="red", markersize=10, transform=transform, label=label)
    if wide_positive_range([x for x, _, _ in good] + [x for x, _ in failed]):
        ax.set_xscale("log")
    if metric == "loss" and wide_positive_range([y for _, y, _ in good]):
        ax.set_yscale("log")
    ax.set(title=f"final eval {metric}", xlabel=key, ylabel=f"eval {metric}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def draw_final(
    runs: Sequence[RunSeries], key: str, metrics: Sequence[str], path: pathlib.Path
) -> pathlib.Path:
    """Writes one panel per final eval metric against the swept `key` to `path`."""
    fig, axes = _new_figure(len(metrics))
    for ax, metric in zip(axes, metrics, strict=True):
        _draw_final_panel(ax, runs, key, metric)
    fig.savefig(path, dpi=100)
    return path


def _file_name(key: str) -> str:
    return "final_vs_" + re.sub(r"[^A-Za-z0-9._-]+", "_", key) + ".png"


def plot_sweep(directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Writes `curves.png` and `final_vs_<key>.png` into a sweep directory.

    Args:
        directory: `ROOT/SWEEP` as written by `experiments.sweep` (holding `summary.csv` and
            one workdir per run).

    Returns:
        The paths written: `curves.png` first, then one per numeric swept key.

    Raises:
        tfjax.errors.WorkdirError: no such directory, or it holds no `summary.csv`.
        tfjax.errors.DependencyError: matplotlib is not installed.
    """
    directory = pathlib.Path(directory)
    rows = read_rows(directory)
    require_matplotlib()
    records = {row["run"]: logger.read_metrics(directory / row["run"]) for row in rows}
    runs = collect_runs(rows, records)
    paths = [draw_curves(runs, directory / CURVES_FILE)]
    metrics = final_metrics(rows)
    for key in numeric_keys(rows):
        if key == sweep_advice.SEED_KEY:
            continue  # averaged into error bars on the other keys' panels
        paths.append(draw_final(runs, key, metrics, directory / _file_name(key)))
    lineage = pbt_plot.draw_pbt(records, directory / pbt_plot.PBT_FILE)  # a PBT sweep's
    return paths if lineage is None else [*paths, lineage]


def plot_workdirs(
    workdirs: Sequence[str | pathlib.Path],
    out: str | pathlib.Path | None = None,
    metrics: Sequence[str] = ("loss",),
) -> pathlib.Path:
    """Writes `learning_curves.png` of the runs in `workdirs` into `out`.

    Args:
        workdirs: run directories holding `metrics.jsonl`; each is labelled by its folder name.
        out: the folder to write into (created if missing); default the first workdir.
        metrics: the metrics to draw, one panel each.

    Returns:
        The path written.

    Raises:
        FileNotFoundError: a workdir without `metrics.jsonl`.
        ValueError: a metric no run has logged.
        tfjax.errors.DependencyError: matplotlib is not installed.
    """
    fig = viz.learning_curves(workdirs, metrics=metrics)
    folder = pathlib.Path(workdirs[0] if out is None else out)
    return canvas.save(fig, folder / LEARNING_CURVES_FILE)


def _check_mode() -> None:
    """Exactly one of --sweep_dir and --workdir; --out and --metrics only with --workdir."""
    if FLAGS.sweep_dir and FLAGS.workdir:
        raise cli.UsageError("--sweep_dir and --workdir are two modes: give one of them")
    if not (FLAGS.sweep_dir or FLAGS.workdir):
        raise cli.UsageError(
            "nothing to plot: give --sweep_dir=ROOT/SWEEP (a sweep's plots) or --workdir=DIR, "
            "repeatable (runs' learning curves)"
        )
    if FLAGS.sweep_dir and (FLAGS.out or FLAGS.metrics):
        raise cli.UsageError("--out and --metrics go with --workdir; --sweep_dir writes beside it")


def main(argv: Sequence[str]) -> None:
    """Plots `--sweep_dir` or the `--workdir`s and prints the paths written."""
    cli.no_arguments(argv)
    _check_mode()
    if FLAGS.sweep_dir:
        paths = plot_sweep(FLAGS.sweep_dir)
    else:
        paths = [plot_workdirs(FLAGS.workdir, FLAGS.out, FLAGS.metrics or ("loss",))]
    for path in paths:
        print(path)


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string(
        "sweep_dir", None, "Sweep directory ROOT/SWEEP holding summary.csv, e.g. runs/sweeps/lr."
    )
    flags.DEFINE_multi_string(
        "workdir", None, "A run's workdir holding metrics.jsonl; repeat it to compare runs."
    )
    flags.DEFINE_string(
        "out", None, f"With --workdir: folder for {LEARNING_CURVES_FILE} (default the first one)."
    )
    flags.DEFINE_list("metrics", None, "With --workdir: metrics to draw, e.g. loss,bleu (loss).")


if __name__ == "__main__":
    _define_flags()
    cli.main(main)
