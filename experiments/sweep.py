"""Expand a config's sweep into training runs; print their commands or run them one by one.

    python -m experiments.sweep --config=configs/base.py:cpu --sweep=lr \\
        [--workdir=runs/sweeps] [--print | --plot] [--config.train.num_train_steps=500 ...]

`get_sweep(NAME)` of the config file gives one dict of dotted-key overrides per run (docs/design.md,
"Configs"). Each run trains in `ROOT/NAME/<run name>`, the run name being short and built from its
overrides (`optim.learning_rate=0.5, model.num_layers=2` -> `lr0.5-layers2`), with the command

    python -m experiments.train --config=SPEC --workdir=ROOT/NAME/RUN --config.a.b=v ...

(overrides given to the sweep itself first, then the run's own; `experiments.sweep_runs` names and
expands the runs). Every override is checked against the config before anything starts. `--print`
prints one shell-quoted command per line for a cluster launcher. Otherwise the runs go one after
another in this process's Python; a failed run is recorded and the next one starts. After each run
`ROOT/NAME/summary.csv` and `summary.md` are rewritten with one row per run
(`experiments.sweep_summary`): its overrides, status, wall time, and the latest evaluation and train
metrics from its `metrics.jsonl`. When runs differ in `seed`, `seeds.csv` and `seeds.md` merge those
that differ only in it: each metric's mean ± sample standard deviation over the seeds and n (the
seed tables of docs/results.md come from these). `summary.md` ends with "Is the sweep done?", which
the sweep also prints at its end (`experiments.sweep_advice`): the best setting, every numeric swept
key whose best value is at the edge of its range with the next range to try, and whether the best
and the runner-up are separable (Welch's t-test, p < 0.05). `--plot` then draws loss curves and
final metrics against each swept value next to them, seeds as error bars (`experiments.plot`, which
needs the `viz` extra; checked before the first run starts). The exit status is 1 when a run failed,
2 (with one line `error: ...`) when the sweep itself cannot start (an unknown sweep, a bad override,
another sweep running in `ROOT/NAME`: the sweep holds that directory's workdir lock,
`tfjax.runs.lock`, and a second one writes nothing). Rerunning the same sweep resumes each run from
its checkpoints. A SIGTERM means what it means to `experiments.train`: the run in progress (which
gets the signal too) or the vectorised group saves and stops, no other run starts, the summary marks
them "preempted", a warning says to rerun, and the status is 0.
"""

import logging
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from absl import flags

from experiments import cli, plot, sweep_summary
from experiments.sweep_runs import Run, expand
from experiments.sweep_summary import PREEMPTED, summary_row, write_summary
from tfjax import errors

FLAGS = flags.FLAGS
DEFAULT_ROOT = "runs/sweeps"
VECTORIZED_PREFIX = "_vectorized-"  # ROOT/SWEEP/_vectorized-K: group K's checkpoints


def _local_command(command: Sequence[str]) -> list[str]:
    """Runs "python" commands with this interpreter (same virtual environment)."""
    return [sys.executable, *command[1:]] if command[0] == "python" else list(command)


class Stop:
    """A SIGTERM to the sweep while it runs (a context manager): the run in progress saves and
    stops (a sequential run's train process gets the signal too; a vectorised group catches
    it itself) and no other run starts. `requested` says whether one came."""

    def __init__(self):
        self.requested = False
        self.child: subprocess.Popen | None = None
        self._forwarded = False  # whether `child` has had its SIGTERM
        self._previous = None

    def __enter__(self) -> "Stop":
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self._forward()

    def _forward(self) -> None:
        """Sends SIGTERM on to the run in progress, if one is running and has not had it."""
        child = self.child
        if child is not None and not self._forwarded and child.poll() is None:
            self._forwarded = True
            child.send_signal(signal.SIGTERM)

    def started(self, child: subprocess.Popen) -> None:
        """`child` is now the run in progress; a SIGTERM that came while it started (before
        `child` was known here) is sent on to it now."""
        self.child, self._forwarded = child, False
        if self.requested:
            self._forward()


def _not_started(runs: Sequence[Run]) -> list[dict[str, object]]:
    return [summary_row(run, f"{PREEMPTED} (not started)") for run in runs]


def run_all(
    runs: Sequence[Run], directory: str | pathlib.Path, stop: Stop | None = None
) -> list[dict[str, object]]:
    """Runs each command in turn, continuing past failures; rewrites the summary after each.

    After a SIGTERM (`stop`) the run in progress saves and stops and no other starts.

    Returns:
        The summary rows; `status` is "ok", "failed (...)", "preempted" (the run a SIGTERM
        stopped) or "preempted (not started)".
    """
    stop = Stop() if stop is None else stop
    rows = []
    for index, run in enumerate(runs, start=1):
        if stop.requested:
            rows += _not_started(runs[index - 1 :])
            write_summary(rows, directory)
            break
        print(f"[{index}/{len(runs)}] {run.name}: {shlex.join(run.command)}", flush=True)
        start = time.perf_counter()
        try:
            with subprocess.Popen(_local_command(run.command)) as child:
                stop.started(child)
                returncode = child.wait()
            status = "ok" if returncode == 0 else f"failed (exit {returncode})"
            if stop.requested and returncode in (0, -signal.SIGTERM):
                status = PREEMPTED if returncode == 0 else f"{PREEMPTED} (exit {returncode})"
        except OSError as err:
            status = f"failed ({err})"
        finally:
            stop.child = None
        rows.append(summary_row(run, status, time.perf_counter() - start))
        write_summary(rows, directory)
    return rows


def group_directory(directory: str | pathlib.Path, index: int) -> pathlib.Path:
    """Where vectorised group `index` (from 0) of a sweep keeps its checkpoints."""
    return pathlib.Path(directory) / f"{VECTORIZED_PREFIX}{index}"


def vectorized_groups(runs: Sequence[Run]) -> list[list]:
    """The runs as `tfjax.runs.vsweep.Trial`s, in groups that each train as one vectorised
    program (imported here: the sequential sweep never imports JAX)."""
    from tfjax.runs import vsweep

    trials = [vsweep.Trial(run.name, run.config, run.workdir) for run in runs]
    return vsweep.group_trials(trials)


def run_vectorized(
    runs: Sequence[Run], directory: str | pathlib.Path, stop: Stop | None = None
) -> list[dict[str, object]]:
    """Trains each group of `vectorized_groups` as one program, one group after another.

    A group that cannot start (a bad value) fails its runs and the next group starts. After
    a SIGTERM (`stop`, or the group's own) the group saves and stops and no other starts.
    Rows are in the sweep's order; `seconds` is the group's wall time.

    Returns:
        The summary rows; `status` is "ok", "frozen at step N (non-finite loss)", "stopped at
        step N (successive halving ...)", "failed (...)", "preempted at step N" or
        "preempted (not started)".
    """
    from tfjax.runs import vsweep

    stop = Stop() if stop is None else stop
    groups = vectorized_groups(runs)
    if len(groups) > 1:
        keys = vsweep.splitting_keys([trial for group in groups for trial in group])
        print(
            f"the runs differ in {', '.join(keys)}, which vectorised trials must share: "
            f"{len(groups)} groups, each one vectorised program, trained one after another"
        )
    by_name = {run.name: run for run in runs}
    rows: dict[str, dict[str, object]] = {}
    for index, group in enumerate(groups):
        names = [trial.name for trial in group]
        if stop.requested:
            rows.update(zip(names, _not_started([by_name[n] for n in names]), strict=True))
            continue
        print(f"[group {index + 1}/{len(groups)}] {len(group)} trials: {', '.join(names)}")
        start = time.perf_counter()
        try:
            outcomes = vsweep.train_trials(group, group_directory(directory, index))
            statuses = [o.status for o in outcomes]
        except errors.UserError as err:
            statuses = [f"failed ({err})"] * len(group)
        stop.requested |= any(s.startswith(PREEMPTED) for s in statuses)
        seconds = time.perf_counter() - start
        for name, status in zip(names, statuses, strict=True):
            rows[name] = summary_row(by_name[name], status, seconds)
        write_summary([rows[r.name] for r in runs if r.name in rows], directory)
        _add_pbt_lineage(directory, len(groups))
    if stop.requested:
        write_summary([rows[r.name] for r in runs], directory)
        _add_pbt_lineage(directory, len(groups))
    return [rows[run.name] for run in runs]


def _add_pbt_lineage(directory: str | pathlib.Path, num_groups: int) -> None:
    """Appends each population-based training group's lineage table (its `pbt.md`, who
    copied whom at which step, the final hyperparameters) to `summary.md`."""
    from tfjax.runs import pbt

    for index in range(num_groups):
        lineage = group_directory(directory, index) / pbt.LINEAGE_FILE
        if lineage.exists():
            with open(pathlib.Path(directory) / "summary.md", "a") as summary:
                summary.write(
                    f"\n## Population-based training, group {index + 1}\n\n{lineage.read_text()}"
                )


def extract(runs: Sequence[Run], directory: str | pathlib.Path, name: str) -> int:
    """Writes run `name` of a vectorised sweep as an ordinary checkpoint in its workdir;
    returns the step (`tfjax.runs.vsweep_state.extract`)."""
    from tfjax.runs import vsweep_state

    for index, group in enumerate(vectorized_groups(runs)):
        for trial in group:
            if trial.name == name:
                return vsweep_state.extract(group_directory(directory, index), trial.workdir)
    names = ", ".join(run.name for run in runs)
    raise errors.ConfigError(
        f"--extract={name}: the sweep has no run of that name; its runs: {names}"
    )


def run_sweep(runs: Sequence[Run], directory: pathlib.Path, vectorize: bool) -> list[dict]:
    """Runs the sweep (vectorised or one run after another) holding the lock of its
    directory, so that a second sweep there stops before writing anything.

    Raises:
        tfjax.errors.WorkdirLockedError: while another sweep runs in `directory`.
    """
    from tfjax.runs import lock

    directory.mkdir(parents=True, exist_ok=True)
    with lock.WorkdirLock(directory), Stop() as stop:
        return (run_vectorized if vectorize else run_all)(runs, directory, stop)


def main(argv: Sequence[str], overrides: Sequence[str]) -> int:
    """Prints, runs (one by one or vectorised) or extracts the sweep; 1 when a run failed
    (not when a SIGTERM stopped it: 0, as `experiments.train`)."""
    cli.no_arguments(argv)
    if FLAGS.plot:
        if FLAGS.print:
            raise cli.UsageError("--plot needs the runs' metrics: drop --print or --plot")
        plot.require_matplotlib()  # fail now, not after the last run
    runs = expand(FLAGS.config, FLAGS.sweep, overrides, FLAGS.workdir)
    if FLAGS.print:
        for run in runs:
            print(shlex.join(run.command))
        return 0
    directory = pathlib.Path(FLAGS.workdir) / FLAGS.sweep
    if FLAGS.extract:
        step = extract(runs, directory, FLAGS.extract)
        workdir = next(run.workdir for run in runs if run.name == FLAGS.extract)
        print(
            f"wrote step {step} of {FLAGS.extract} to {workdir / 'checkpoints'}: "
            "an ordinary workdir"
        )
        return 0
    config = runs[0].config if runs else None
    # A config file without a `sweep` group (one written by hand) is not vectorised.
    vectorize = FLAGS.vectorize or bool(config and "sweep" in config and config.sweep.vectorize)
    rows = run_sweep(runs, directory, vectorize)
    print("\n".join(sweep_summary.closing_lines(rows, directory)))
    if sweep_summary.preempted(rows):
        logging.getLogger(__name__).warning(
            "the sweep was stopped by SIGTERM; rerun the same command to resume it"
        )
    elif FLAGS.plot:
        for path in plot.plot_sweep(directory):
            print(f"plot: {path}")
    return 1 if sweep_summary.failed(rows) else 0


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string(
        "config",
        None,
        "Config file with optional preset, e.g. "
        "configs/base.py:cpu. Override fields with --config.a.b=value.",
    )
    flags.DEFINE_string("sweep", None, "Name passed to the config file's get_sweep().")
    flags.DEFINE_string("workdir", DEFAULT_ROOT, "Root; runs go to ROOT/SWEEP/RUN.")
    flags.DEFINE_bool("print", False, "Print one command per run and exit.")
    flags.DEFINE_bool(
        "vectorize",
        False,
        "Train the runs that share a model shape as one vmapped program (sweep.vectorize).",
    )
    flags.DEFINE_string(
        "extract",
        None,
        "Write run NAME of a vectorised sweep as an ordinary checkpoint in its workdir.",
    )
    flags.DEFINE_bool(
        "plot", False, "After the runs, draw curves and final metrics (experiments.plot)."
    )
    flags.mark_flags_as_required(["config", "sweep"])


if __name__ == "__main__":
    _define_flags()
    cli.main(main, config_overrides=True)
