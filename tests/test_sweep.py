"""Tests for experiments/sweep.py and sweep_runs.py: run expansion, printed commands, the run
loop, summaries.

`experiments.train` is never started here: the run loop runs a fake command instead.
"""

import csv
import json
import pathlib
import shlex
import subprocess
import sys
import textwrap

import pytest

from experiments import sweep, sweep_runs, sweep_summary

REPO = pathlib.Path(__file__).resolve().parents[1]

CONFIG_FILE = textwrap.dedent('''
    """A small config with sweeps, for tests."""
    import ml_collections

    SWEEPS = {
        "lr": [{"optim.learning_rate": v} for v in (0.5, 2.0)],
        "grid": [{"optim.learning_rate": lr, "model.num_layers": n}
                 for lr in (0.5, 1.0) for n in (1, 2)],
        "clash": [{"model.dims": (1, 2)}, {"data.dims": (1, 2)}],
        "bad": [{"optim.learnng_rate": 1.0}],
        "repeat": [{}, {}],
    }


    def get_config(arg=None):
        config = ml_collections.ConfigDict()
        config.model = {"num_layers": 6, "dims": (4, 8)}
        config.data = {"dims": (4,)}
        config.optim = {"learning_rate": 1.0, "warmup_steps": 100}
        if arg == "tiny":
            config.model.num_layers = 1
        return config


    def get_sweep(arg):
        return SWEEPS[arg]
''')


@pytest.fixture
def spec(tmp_path) -> str:
    path = tmp_path / "sweep_config.py"
    path.write_text(CONFIG_FILE)
    return f"{path}:tiny"


def test_a_run_command_spells_bare_and_negated_overrides_as_flags():
    command = sweep_runs.build_command("c.py", pathlib.Path("w"), ["a.b=1", "c", "!d.e"])
    assert command[-3:] == ["--config.a.b=1", "--config.c", "--noconfig.d.e"]


def test_expand_names_workdirs_and_commands(spec, tmp_path):
    runs = sweep_runs.expand(spec, "grid", ["optim.warmup_steps=10"], tmp_path / "root")
    assert [run.name for run in runs] == [
        "lr0.5-layers1",
        "lr0.5-layers2",
        "lr1.0-layers1",
        "lr1.0-layers2",
    ]
    run = runs[1]
    assert run.workdir == tmp_path / "root" / "grid" / "lr0.5-layers2"
    assert run.overrides == {"optim.learning_rate": 0.5, "model.num_layers": 2}
    assert run.command == [
        "python",
        "-m",
        "experiments.train",
        f"--config={spec}",
        f"--workdir={run.workdir}",
        "--config.optim.warmup_steps=10",
        "--config.optim.learning_rate=0.5",
        "--config.model.num_layers=2",
    ]


def test_expand_falls_back_to_unique_long_names(spec, tmp_path):
    assert [run.name for run in sweep_runs.expand(spec, "clash", [], tmp_path)] == [
        "model.dims=1,2",
        "data.dims=1,2",
    ]
    assert [run.name for run in sweep_runs.expand(spec, "repeat", [], tmp_path)] == [
        "default",
        "default-1",
    ]


def test_expand_rejects_bad_keys_before_running(spec, tmp_path):
    with pytest.raises(ValueError, match=r"did you mean 'optim\.learning_rate'"):
        sweep_runs.expand(spec, "bad", [], tmp_path)
    with pytest.raises(ValueError, match=r"unknown config key 'optim\.nope'"):
        sweep_runs.expand(spec, "lr", ["optim.nope=1"], tmp_path)
    with pytest.raises(ValueError, match="unknown sweep 'missing'"):
        sweep_runs.expand(spec, "missing", [], tmp_path)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.5, "0.5"),
        (1e-4, "0.0001"),
        (3, "3"),
        (True, "true"),
        ((1, 2), "1,2"),
        ((), "()"),
        ("adam", "adam"),
    ],
)
def test_format_value(value, text):
    assert sweep_summary.format_value(value) == text


def test_print_cli_prints_quoted_commands(spec, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.sweep",
            f"--config={spec}",
            "--sweep=lr",
            f"--workdir={tmp_path}",
            "--print",
            "--config.optim.warmup_steps",
            "5",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    argv = shlex.split(lines[1])
    assert argv[:3] == ["python", "-m", "experiments.train"]
    assert argv[3:] == [
        f"--config={spec}",
        f"--workdir={tmp_path / 'lr' / 'lr2.0'}",
        "--config.optim.warmup_steps=5",
        "--config.optim.learning_rate=2.0",
    ]
    assert not (tmp_path / "lr").exists()


def test_help_works():
    # absl's --help exits with status 1 after printing the flags.
    result = subprocess.run(
        [sys.executable, "-m", "experiments.sweep", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "--sweep" in result.stdout and "--print" in result.stdout
    assert "Traceback" not in result.stderr


def _write_metrics(workdir: pathlib.Path, records: list[dict]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(record) for record in records]
    (workdir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_summary_rows_use_latest_eval_and_train(spec, tmp_path):
    run = sweep_runs.expand(spec, "lr", [], tmp_path)[0]
    _write_metrics(
        run.workdir,
        [
            {"step": 2, "kind": "train", "loss": 3.0},
            {"step": 4, "kind": "eval", "loss": 2.5, "accuracy": 0.1},
            {"step": 4, "kind": "train", "loss": 2.0},
            {"step": 6, "kind": "final_eval", "loss": 1.5, "accuracy": 0.4},
        ],
    )
    row = sweep_summary.summary_row(run, "ok", 12.34)
    assert row == {
        "run": "lr0.5",
        "status": "ok",
        "optim.learning_rate": "0.5",
        "seconds": 12.3,
        "eval/step": 6,
        "eval/loss": 1.5,
        "eval/accuracy": 0.4,
        "train/step": 4,
        "train/loss": 2.0,
    }


def test_write_summary_csv_and_markdown(tmp_path):
    rows = [
        {"run": "lr0.5", "status": "ok", "eval/loss": 1.234567, "train/step": 6},
        {"run": "lr2.0", "status": "failed (exit 1)", "note": "a|b"},
    ]
    csv_path, md_path = sweep_summary.write_summary(rows, tmp_path / "out")
    with csv_path.open() as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == ["run", "status", "eval/loss", "train/step", "note"]
    assert table[0]["eval/loss"] == "1.234567" and table[1]["eval/loss"] == ""
    lines = md_path.read_text().splitlines()
    assert lines[:4] == [
        "| run | status | eval/loss | train/step | note |",
        "|---|---|---|---|---|",
        "| lr0.5 | ok | 1.235 | 6 |  |",
        "| lr2.0 | failed (exit 1) |  |  | a\\|b |",
    ]
    assert lines[4:6] == ["", "## Is the sweep done?"]  # experiments.sweep_advice.report


def test_seed_summary_averages_runs_that_differ_only_in_the_seed(tmp_path):
    def row(pe, seed, match, status="ok"):
        return {
            "run": f"{pe}-{seed}",
            "status": status,
            "model.positional": pe,
            "seed": seed,
            "seconds": 60.0 + seed,
            "eval/exact_match": match,
            "eval/step": 100,
        }

    rows = [
        row("rotary", 0, 0.5),
        row("rotary", 1, 0.7),
        row("rotary", 2, 0.9),
        row("alibi", 0, 0.25),
        row("alibi", 1, 0.0, "failed (exit 1)"),
    ]
    merged = sweep_summary.seed_summary(rows)
    assert [m["model.positional"] for m in merged] == ["rotary", "alibi"]
    rotary, alibi = merged
    assert rotary["seeds"] == "0,1,2" and alibi["seeds"] == "0"  # the failed run left out
    assert (rotary["n"], alibi["n"]) == (3, 1)
    # mean (0.5 + 0.7 + 0.9) / 3; sample std sqrt(((-0.2)^2 + 0 + 0.2^2) / (3 - 1)) = 0.2
    assert rotary["eval/exact_match/mean"] == pytest.approx(0.7)
    assert rotary["eval/exact_match/std"] == pytest.approx(0.2)
    assert alibi["eval/exact_match/mean"] == 0.25 and alibi["eval/exact_match/std"] is None
    assert not any(key.startswith(("eval/step", "seconds")) for key in rotary)

    sweep_summary.write_summary(rows, tmp_path)  # a "seed" column: seeds.md beside summary.md
    assert (tmp_path / "seeds.md").read_text().splitlines() == [
        "| model.positional | seeds | n | eval/exact_match |",
        "|---|---|---|---|",
        "| rotary | 0,1,2 | 3 | 0.7 ± 0.2 |",
        "| alibi | 0 | 1 | 0.25 |",
    ]
    with (tmp_path / "seeds.csv").open() as handle:
        assert float(next(iter(csv.DictReader(handle)))["eval/exact_match/std"]) == pytest.approx(
            0.2
        )


def test_no_seed_summary_without_a_seed_column(tmp_path):
    sweep_summary.write_summary([{"run": "a", "status": "ok", "eval/loss": 1.0}], tmp_path)
    assert not (tmp_path / "seeds.md").exists()


# Writes metrics like the trainer would; fails for learning rate 2.0.
FAKE_TRAIN = textwrap.dedent("""
    import json, pathlib, sys
    workdir, overrides = pathlib.Path(sys.argv[1]), sys.argv[2:]
    workdir.mkdir(parents=True, exist_ok=True)
    lr = float(overrides[-1].split("=")[1])
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "kind": "train", "loss": 1.0 / lr}) + "\\n")
        if lr == 2.0:
            sys.exit(3)
        f.write(json.dumps({"step": 4, "kind": "eval", "accuracy": lr / 2}) + "\\n")
""")


def test_run_all_continues_past_failures(spec, tmp_path, monkeypatch, capsys):
    def fake_command(spec, workdir, overrides):
        return [sys.executable, "-c", FAKE_TRAIN, str(workdir), *overrides]

    monkeypatch.setattr(sweep_runs, "build_command", fake_command)
    runs = sweep_runs.expand(spec, "lr", [], tmp_path)
    rows = sweep.run_all(runs, tmp_path / "lr")
    assert [(row["run"], row["status"]) for row in rows] == [
        ("lr0.5", "ok"),
        ("lr2.0", "failed (exit 3)"),
    ]
    assert rows[0]["eval/accuracy"] == 0.25 and rows[0]["train/loss"] == 2.0
    assert rows[1]["train/loss"] == 0.5 and "eval/accuracy" not in rows[1]
    with (tmp_path / "lr" / "summary.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [row["status"] for row in table] == ["ok", "failed (exit 3)"]
    assert "[2/2] lr2.0" in capsys.readouterr().out


def test_a_sigterm_while_the_run_starts_reaches_the_run(spec, tmp_path, monkeypatch):
    """The signal comes after the sweep checked for one but before it knows the child process
    (Popen is still starting it): the child gets it as soon as it is known, and stops."""
    import signal

    def fake_command(spec, workdir, overrides):
        return [sys.executable, "-c", "import sys, time; time.sleep(20); sys.exit(4)"]

    stop = sweep.Stop()
    real_popen = subprocess.Popen

    class SignalledWhileStarting(real_popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            stop._handle(signal.SIGTERM, None)  # stop.child is not this process yet

    monkeypatch.setattr(sweep_runs, "build_command", fake_command)
    monkeypatch.setattr(subprocess, "Popen", SignalledWhileStarting)
    rows = sweep.run_all(sweep_runs.expand(spec, "lr", [], tmp_path), tmp_path / "lr", stop)
    assert [(row["run"], row["status"]) for row in rows] == [
        ("lr0.5", f"preempted (exit {-signal.SIGTERM})"),
        ("lr2.0", "preempted (not started)"),
    ]
    assert rows[0]["seconds"] < 15  # stopped by the signal, not by running to its end


# Runs a sweep in which FAKE_TRAIN (argv[1]) replaces experiments.train; argv[2:] are its flags.
SWEEP_WITH_FAKE_TRAIN = textwrap.dedent("""
    import sys
    from experiments import cli, sweep, sweep_runs
    def fake_command(spec, workdir, overrides):
        return [sys.executable, "-c", sys.argv[1], str(workdir), *overrides]
    sweep_runs.build_command = fake_command
    sweep._define_flags()
    cli.main(sweep.main, config_overrides=True, argv=["sweep", *sys.argv[2:]])
""")


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)


def test_plot_flag_draws_the_sweep_after_the_runs(spec, tmp_path):
    flags = [f"--config={spec}", "--sweep=lr", f"--workdir={tmp_path}", "--plot"]
    result = _run([sys.executable, "-c", SWEEP_WITH_FAKE_TRAIN, FAKE_TRAIN, *flags])
    assert result.returncode == 1, result.stderr  # lr2.0 fails
    plots = [line for line in result.stdout.splitlines() if line.startswith("plot: ")]
    names = ["curves.png", "final_vs_optim.learning_rate.png"]
    assert plots == [f"plot: {tmp_path / 'lr' / name}" for name in names]
    assert all((tmp_path / "lr" / name).stat().st_size > 0 for name in names)
    # The end of the sweep: the summary's verdict, ranked by eval accuracy (no eval loss).
    out = result.stdout.splitlines()
    verdict = out.index("## Is the sweep done?")
    assert out[verdict - 1].startswith(f"summary: {tmp_path / 'lr' / 'summary.md'} (1 ok, 1 failed")
    assert "- Best: optim.learning_rate=0.5: 0.25 (n = 1)." in out[verdict:]
    assert (tmp_path / "lr" / "summary.md").read_text().count("## Is the sweep done?") == 1


def test_plot_and_print_exclude_each_other(spec, tmp_path):
    result = _run(
        [
            sys.executable,
            "-m",
            "experiments.sweep",
            f"--config={spec}",
            "--sweep=lr",
            "--print",
            "--plot",
        ]
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: --plot needs the runs' metrics: drop --print or --plot"
    ]


def test_a_second_sweep_on_a_running_sweeps_root_is_refused_and_writes_nothing(spec, tmp_path):
    from tfjax.runs import lock

    root = tmp_path / "lr"
    root.mkdir()
    (root / "summary.md").write_text("the running sweep's summary\n")
    flags = [f"--config={spec}", "--sweep=lr", f"--workdir={tmp_path}"]
    with lock.WorkdirLock(root):  # the first sweep, running
        result = _run([sys.executable, "-c", SWEEP_WITH_FAKE_TRAIN, FAKE_TRAIN, *flags])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: workdir {root} is in use by another")
    assert not any(p.is_dir() for p in root.iterdir())  # no run started
    assert not (root / "summary.csv").exists()
    assert (root / "summary.md").read_text() == "the running sweep's summary\n"


# A train command that takes SIGTERM as experiments.train does: saves (here: notes it) and
# exits 0. It says when it is running and then waits for the signal.
FAKE_PREEMPTED_TRAIN = textwrap.dedent("""
    import pathlib, signal, sys, time
    workdir = pathlib.Path(sys.argv[1])
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: (workdir.joinpath("saved").touch(), sys.exit(0)))
    workdir.joinpath("running").touch()
    time.sleep(60)
    sys.exit(4)
""")


def test_sigterm_stops_the_run_in_progress_and_the_sweep_with_status_0(spec, tmp_path):
    """SIGTERM means what it means to experiments.train: the run saves and stops, no other run
    starts, the summary says so and the status is 0; rerunning resumes."""
    import signal
    import time

    flags = [f"--config={spec}", "--sweep=lr", f"--workdir={tmp_path}"]
    process = subprocess.Popen(
        [sys.executable, "-c", SWEEP_WITH_FAKE_TRAIN, FAKE_PREEMPTED_TRAIN, *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "lr" / "lr0.5" / "running").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert (tmp_path / "lr" / "lr0.5" / "saved").exists()  # the run got the signal
    assert not (tmp_path / "lr" / "lr2.0").exists()  # the next run did not start
    with (tmp_path / "lr" / "summary.csv").open() as handle:
        statuses = [(row["run"], row["status"]) for row in csv.DictReader(handle)]
    assert statuses == [("lr0.5", "preempted"), ("lr2.0", "preempted (not started)")]
    assert "(0 ok, 0 failed, 2 preempted)" in stdout
    assert stderr.splitlines() == [
        "warning: the sweep was stopped by SIGTERM; rerun the same command to resume it"
    ]


def test_preempted_runs_are_not_failures():
    rows = [
        {"run": "a", "status": "preempted at step 4"},
        {"run": "b", "status": "preempted (not started)"},
        {"run": "c", "status": "stopped at step 2 (successive halving, eval loss 1)"},
        {"run": "d", "status": "failed (exit 2)"},
    ]
    assert sweep_summary.failed(rows) == ["d"]
