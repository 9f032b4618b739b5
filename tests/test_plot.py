"""Tests for experiments/plot.py: the series collected from a sweep, the PNGs, the two modes.

The fake sweep is written the way a real one is: metrics through `logger.MetricWriter`, the
summary through `experiments.sweep_summary.summary_row` and `write_summary`.
"""

import math
import pathlib
import subprocess
import sys
import types

import pytest

from experiments import cli, plot, sweep_runs, sweep_summary
from tfjax import errors
from tfjax.training import logger

REPO = pathlib.Path(__file__).resolve().parents[1]
KEY = "optim.learning_rate"


def _write_run(directory: pathlib.Path, lr: float, losses: list[float]) -> sweep_runs.Run:
    """A run whose train loss follows `losses` (steps 1, 2, ...), evaluated every 2 steps."""
    run = sweep_runs.Run(f"lr{lr}", directory / f"lr{lr}", {KEY: lr}, ["python"])
    with logger.MetricWriter(run.workdir) as writer:
        for step, loss in enumerate(losses, start=1):
            writer.write(step, "train", {"loss": loss, "learning_rate": lr})
            if step % 2 == 0:
                writer.write(step, "eval", {"loss": loss * 1.1, "bleu": 10.0 / loss})
        writer.write(len(losses), "final_eval", {"loss": losses[-1] * 1.1, "bleu": 10 / losses[-1]})
    return run


@pytest.fixture
def sweep_dir(tmp_path) -> pathlib.Path:
    """Three runs: two fine (losses spanning > 10x) and one whose loss went NaN."""
    directory = tmp_path / "lr"
    rows = [
        sweep_summary.summary_row(_write_run(directory, 0.01, [20.0, 8.0, 4.0, 2.0]), "ok", 3.0),
        sweep_summary.summary_row(_write_run(directory, 0.1, [20.0, 3.0, 1.5, 1.0]), "ok", 3.0),
        sweep_summary.summary_row(
            _write_run(directory, 10.0, [20.0, math.nan]), "failed (exit 2)", 1.0
        ),
    ]
    sweep_summary.write_summary(rows, directory)
    return directory


def test_plot_sweep_writes_readable_pngs(sweep_dir):
    from matplotlib import image

    paths = plot.plot_sweep(sweep_dir)
    assert paths == [sweep_dir / "curves.png", sweep_dir / f"final_vs_{KEY}.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = image.imread(path)
        assert pixels.shape == (400, 1200, 4)  # 12 x 4 inches at 100 dpi, RGBA
        assert pixels.std() > 0  # something was drawn


def test_collect_runs_takes_curves_and_cells():
    rows = [
        {"run": "a", "status": "ok", KEY: "0.1", "eval/loss": "1.5", "train/loss": "2.0"},
        {"run": "b", "status": "failed (exit 1)", KEY: "1.0", "eval/loss": "", "train/loss": ""},
    ]
    records = {
        "a": [
            {"kind": "train", "step": 1, "loss": 3.0, "learning_rate": 0.1},
            {"kind": "eval", "step": 1, "loss": 2.5, "bleu": 3.0},
            {"kind": "train", "step": 2, "learning_rate": 0.1},  # no loss: skipped
            {"kind": "train", "step": 3, "loss": 2.0},
            {"kind": "final_eval", "step": 3, "loss": 1.5},
        ]
    }
    a, b = plot.collect_runs(rows, records)
    assert a == plot.RunSeries(
        "a",
        "ok",
        {KEY: "0.1", "eval/loss": "1.5", "train/loss": "2.0"},
        train=([1, 3], [3.0, 2.0]),
        eval=([1, 3], [2.5, 1.5]),
    )
    assert not a.failed
    assert b.train == ([], []) and b.eval == ([], []) and b.failed
    # a final evaluation at the step of a periodic one (other examples) is not on the curve
    records["a"].append({"kind": "eval", "step": 3, "loss": 1.7})
    records["a"].append({"kind": "final_eval", "step": 3, "loss": 1.4})
    again, _ = plot.collect_runs(rows, records)
    assert again.eval == ([1, 3], [2.5, 1.7])


def test_a_nan_loss_counts_as_failed():
    run = plot.RunSeries("a", "ok", {}, train=([1, 2], [3.0, math.nan]), eval=([], []))
    assert run.failed


def test_numeric_keys_are_swept_columns_holding_numbers():
    rows = [
        {"run": "a", "status": "ok", KEY: "0.1", "data.dims": "1,2", "model.bias": "true"},
        {"run": "b", "status": "ok", KEY: "1e-3", "model.num_layers": "2"},
        {"run": "c", "status": "ok", "seconds": "3.0", "eval/loss": "1.0", "train/step": "4"},
    ]
    assert plot.numeric_keys(rows) == [KEY, "model.num_layers"]


def test_final_metrics_adds_bleu_and_exact_match_when_reported():
    assert plot.final_metrics([{"eval/loss": "1.0"}]) == ["loss"]
    rows = [{"eval/bleu": ""}, {"eval/bleu": "30.0", "eval/exact_match": "0.5"}]
    assert plot.final_metrics(rows) == ["loss", "bleu", "exact_match"]


def _run(name: str, status: str, **values: str) -> plot.RunSeries:
    return plot.RunSeries(name, status, values, train=([], []), eval=([], []))


def test_final_points_keep_failed_and_nan_runs_apart():
    runs = [
        _run("big", "ok", **{KEY: "1.0", "eval/loss": "2.0"}),
        _run("small", "ok", **{KEY: "0.01", "eval/loss": "3.0"}),
        _run("crashed", "failed (exit 1)", **{KEY: "10.0", "eval/loss": "1.0"}),
        _run("nan", "ok", **{KEY: "5.0", "eval/loss": "nan"}),
        _run("no_eval", "ok", **{KEY: "0.5"}),
        _run("default", "ok", **{"eval/loss": "1.0"}),  # another key of a mixed sweep
    ]
    good, failed = plot.final_points(runs, KEY, "loss")
    assert good == [(0.01, 3.0, "small"), (1.0, 2.0, "big")]
    assert failed == [(0.5, "no_eval"), (5.0, "nan"), (10.0, "crashed")]


@pytest.mark.parametrize(
    "values, wide",
    [
        ([0.01, 0.1, 1.0], True),
        ([1.0, 5.0, 9.0], False),
        ([0.5, 20.0, math.nan], True),
        ([-1.0, 20.0], False),
        ([0.0, 20.0], False),
        ([math.nan], False),
        ([], False),
    ],
)
def test_wide_positive_range(values, wide):
    assert plot.wide_positive_range(values) is wide


def test_missing_directory_and_summary_are_one_line_errors(tmp_path):
    with pytest.raises(errors.WorkdirError, match=r"sweep directory .*nope does not exist"):
        plot.plot_sweep(tmp_path / "nope")
    with pytest.raises(errors.WorkdirError, match=r"holds no summary\.csv") as info:
        plot.plot_sweep(tmp_path)
    assert str(tmp_path) in str(info.value) and "python -m experiments.sweep" in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_matplotlib_says_what_to_install(sweep_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(errors.DependencyError, match=r'pip install "tfjax\[viz\]"') as info:
        plot.plot_sweep(sweep_dir)
    assert "\n" not in str(info.value)
    assert not (sweep_dir / "curves.png").exists()


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, check=False
    )


def test_main_prints_the_paths(monkeypatch, capsys):
    written = [pathlib.Path("d/curves.png"), pathlib.Path(f"d/final_vs_{KEY}.png")]
    monkeypatch.setattr(plot, "FLAGS", _flags(sweep_dir="d"))
    monkeypatch.setattr(plot, "plot_sweep", lambda directory: written if directory == "d" else [])
    plot.main(["plot"])
    assert capsys.readouterr().out.splitlines() == ["d/curves.png", f"d/final_vs_{KEY}.png"]


def _flags(**values) -> types.SimpleNamespace:
    """The flags `main` reads, unset unless given."""
    unset = {"sweep_dir": None, "workdir": None, "out": None, "metrics": None}
    return types.SimpleNamespace(**(unset | values))


def test_main_draws_the_learning_curves_of_workdirs(sweep_dir, monkeypatch, capsys):
    from matplotlib import image

    workdirs = [str(sweep_dir / "lr0.01"), str(sweep_dir / "lr0.1")]
    monkeypatch.setattr(plot, "FLAGS", _flags(workdir=workdirs, metrics=["loss", "bleu"]))
    plot.main(["plot"])
    path = sweep_dir / "lr0.01" / "learning_curves.png"  # into the first workdir
    assert capsys.readouterr().out.splitlines() == [str(path)]
    assert image.imread(path).shape == (400, 1160, 4)  # two panels: 11.6 x 4 inches at 100 dpi
    assert path.stat().st_size > 20_000  # curves, not an empty frame

    monkeypatch.setattr(plot, "FLAGS", _flags(workdir=workdirs[:1], out=str(sweep_dir / "pics")))
    plot.main(["plot"])
    path = sweep_dir / "pics" / "learning_curves.png"
    assert capsys.readouterr().out.splitlines() == [str(path)]
    assert image.imread(path).shape == (400, 680, 4)  # one panel


@pytest.mark.parametrize(
    "values, message",
    [
        ({}, r"nothing to plot: give --sweep_dir=ROOT/SWEEP .* or --workdir=DIR, repeatable"),
        ({"sweep_dir": "d", "workdir": ["w"]}, "--sweep_dir and --workdir are two modes"),
        ({"sweep_dir": "d", "out": "o"}, "--out and --metrics go with --workdir"),
    ],
)
def test_main_wants_exactly_one_mode(values, message, monkeypatch):
    monkeypatch.setattr(plot, "FLAGS", _flags(**values))
    monkeypatch.setattr(plot, "plot_sweep", lambda directory: pytest.fail("plotted"))
    with pytest.raises(cli.UsageError, match=message):
        plot.main(["plot"])


def test_importing_needs_no_matplotlib():
    check = (
        "import sys, experiments.plot, experiments.sweep; assert 'matplotlib' not in sys.modules"
    )
    result = _python("-c", check)
    assert result.returncode == 0, result.stderr


def test_cli_missing_directory_is_one_line(tmp_path):
    result = _python("-m", "experiments.plot", f"--sweep_dir={tmp_path / 'nope'}")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: sweep directory {tmp_path / 'nope'} does not exist; run the sweep first: "
        "python -m experiments.sweep --config=FILE --sweep=NAME writes "
        "runs/sweeps/NAME/summary.csv"
    ]


def test_cli_modes_and_missing_workdirs_are_one_line(sweep_dir, tmp_path):
    result = _python("-m", "experiments.plot")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: nothing to plot: give --sweep_dir=ROOT/SWEEP (a sweep's plots) or "
        "--workdir=DIR, repeatable (runs' learning curves)"
    ]
    missing = tmp_path / "nope"
    result = _python(
        "-m", "experiments.plot", f"--workdir={sweep_dir / 'lr0.1'}", f"--workdir={missing}"
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: workdir {missing} does not exist: train a run there first "
        f"(python -m experiments.train --config=FILE --workdir={missing})"
    ]


def test_seeds_are_merged_into_mean_and_std_per_value():
    runs = [
        _run("a0", "ok", **{KEY: "0.1", "seed": "0", "eval/loss": "2.0"}),
        _run("a1", "ok", **{KEY: "0.1", "seed": "1", "eval/loss": "3.0"}),
        _run("b0", "ok", **{KEY: "1.0", "seed": "0", "eval/loss": "1.0"}),
        _run("c0", "ok", **{KEY: "1.0", "seed": "0", "model.num_layers": "2", "eval/loss": "5.0"}),
    ]
    good, _ = plot.final_points(runs, KEY, "loss")
    spreads = plot.seed_spreads(good, runs, KEY)
    assert list(spreads) == ["", "model.num_layers=2"]
    (x0, first), (x1, second) = spreads[""]
    # 0.1: mean (2 + 3) / 2 = 2.5, sample std sqrt(((-0.5)^2 + 0.5^2) / 1) = 0.7071, n 2.
    assert (x0, first.mean, first.n) == (0.1, 2.5, 2)
    assert first.std == pytest.approx(math.sqrt(0.5))
    assert (x1, second.mean, second.std, second.n) == (1.0, 1.0, 0.0, 1)
    assert [(x, s.mean) for x, s in spreads["model.num_layers=2"]] == [(1.0, 5.0)]


def test_a_seed_axis_draws_error_bars_and_no_panel_of_its_own(tmp_path, monkeypatch):
    from matplotlib import axes

    directory, rows = tmp_path / "lr", []
    for lr in (0.01, 0.1):
        for seed in (0, 1):
            name = f"lr{lr}-seed{seed}"
            with logger.MetricWriter(directory / name) as writer:
                writer.write(2, "final_eval", {"loss": 1.0 + lr + seed})
            run = sweep_runs.Run(name, directory / name, {KEY: lr, "seed": seed}, ["python"])
            rows.append(sweep_summary.summary_row(run, "ok", 1.0))
    sweep_summary.write_summary(rows, directory)
    bars = []
    original = axes.Axes.errorbar
    monkeypatch.setattr(
        axes.Axes,
        "errorbar",
        lambda self, x, y, **kw: bars.append((x, y, kw["yerr"])) or original(self, x, y, **kw),
    )
    paths = plot.plot_sweep(directory)
    assert paths == [directory / "curves.png", directory / f"final_vs_{KEY}.png"]  # no seed
    # Each learning rate: losses 1 + lr and 2 + lr: mean 1.5 + lr, std sqrt(0.5).
    ((xs, means, stds),) = bars
    assert xs == [0.01, 0.1] and means == pytest.approx([1.51, 1.6])
    assert stds == pytest.approx([math.sqrt(0.5)] * 2)
