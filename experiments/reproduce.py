"""Rerun a row of the results: `python -m experiments.reproduce --row=ROW [--seeds=0,1,2]`.

For each seed, trains the row's recipe (`experiments.results.ROWS`) in a fresh workdir
(`--workdir_root/<row>_seed<k>`) with `--config.seed=<k>`, scores it with the row's
`experiments.evaluate` flags, and writes a record (the commands, seed, commit, versions, host
and its `jnp.dot` ceiling before and after, wall times, every score) to `<workdir>/record.json`;
`--record` also files it under docs/records/<row>/ for the results tables
(`python -m experiments.results` then regenerates them). Prints each seed's figure beside the
recorded mean ± std and a verdict: within the recorded spread (mean ± max(2 std, one unit of
the last digit shown)) or not.

A sweep row (`Row.sweep`: the PBT and grid rows) runs `experiments.sweep` with the row's flags
in the seed's workdir, picks the trial with the lowest final eval loss in its `summary.csv`
(`best_trial`), `--extract`s it and scores that trial's workdir, where the record goes too.

`--quick` runs the same recipe for 2 steps and scores 8 examples: not a result, a check that the
recipe still builds, trains, saves and evaluates (the slow tests run it for every row).
`--list` prints the rows.

Before the first seed trains, the flags (`--seeds`: integers >= 0, each once), the seeds'
workdirs (fresh: none may exist) and every record of the row (`--records_dir`,
`experiments.results.read_record`) are checked: each problem is one `error:` line naming the
flag or the file, and the exit status 2.
"""

import csv
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

from absl import flags

from experiments import cli, results
from tfjax import errors

FLAGS = flags.FLAGS
QUICK_TRAIN = (
    "train.num_train_steps=2",
    "train.eval_every_steps=1000",  # no periodic eval: the final one on 8 examples
    "train.final_eval_examples=8",
    "train.checkpoint_every_steps=2",
    "train.log_every_steps=1",
    "optim.warmup_steps=1",
)
QUICK_EVALUATE = ("--max_examples=8", "--sample_windows=8", "--batch_size=8")


def commands(
    row_name: str, seed: int, workdir: pathlib.Path, quick: bool, best: str = "{best}"
) -> list[list[str]]:
    """The train and evaluate command lines of one seed of a row; a sweep row's (`Row.sweep`)
    are the sweep, the extraction of trial `best` and its evaluation."""
    row = results.ROWS[row_name]
    if row.sweep:
        return _sweep_commands(row, seed, workdir, quick, best)
    train = [
        "python",
        "-m",
        "experiments.train",
        f"--config={row.config}",
        f"--config.seed={seed}",
        f"--workdir={workdir}",
        "--nocompilation_cache",  # the time of a first run, as the tables report it
    ]
    evaluate = ["python", "-m", "experiments.evaluate", f"--workdir={workdir}", *row.evaluate]
    if quick:
        train += [f"--config.{override}" for override in QUICK_TRAIN]
        evaluate = [a for a in evaluate if not a.startswith("--average_last")]
        evaluate += QUICK_EVALUATE
    return [train, evaluate]


def _sweep_commands(row, seed: int, workdir: pathlib.Path, quick: bool, best: str):
    sweep = [
        "python",
        "-m",
        "experiments.sweep",
        f"--config={row.config}",
        *row.sweep,
        f"--config.seed={seed}",
        f"--workdir={workdir}",
        "--nocompilation_cache",
    ]
    if quick:
        sweep += [f"--config.{override}" for override in QUICK_TRAIN]
    trial = workdir / row.sweep[0].removeprefix("--sweep=") / best
    evaluate = ["python", "-m", "experiments.evaluate", f"--workdir={trial}", *row.evaluate]
    evaluate += QUICK_EVALUATE if quick else []
    return [sweep, [*sweep, f"--extract={best}"], evaluate]


def best_trial(summary: pathlib.Path) -> str:
    """The run of a sweep's `summary.csv` with the lowest final eval loss (of those "ok")."""
    with open(summary, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] == "ok" and r["eval/loss"]]
    if not rows:
        raise cli.UsageError(f"{summary}: no trial finished with an eval loss to choose from")
    return min(rows, key=lambda r: float(r["eval/loss"]))["run"]


def dot_ceiling(repeats: int = 3) -> tuple[str, list[float]]:
    """The platform JAX computes on and `repeats` measurements of its float32 `jnp.dot`
    ceiling (GFLOP/s), in a child process so that this one never starts JAX."""
    code = (
        "import jax, json; from experiments.bench import mfu; print(json.dumps([jax.devices()[0]"
        f".platform, [round(mfu.matmul_ceiling() / 1e9, 1) for _ in range({repeats})]]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        return "", []
    platform_, gflops = json.loads(done.stdout.strip().splitlines()[-1])
    return platform_, gflops


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=results.ROOT)
    return done.stdout.strip() if done.returncode == 0 else ""


def environment() -> dict:
    """The versions and the host of a record (its ceiling added by the caller)."""
    import importlib.metadata as metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return ""

    cpu = ""
    if pathlib.Path("/proc/cpuinfo").is_file():
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "versions": {
            "python": platform.python_version(),
            **{name: version(name) for name in ("tfjax", "jax", "jaxlib", "flax", "optax")},
        },
        "host": {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "accelerator": ""},
    }


def workdir_of(row_name: str, seed: int, root: pathlib.Path, quick: bool) -> pathlib.Path:
    """The fresh workdir seed `seed` of a row trains in."""
    return root / f"{row_name}{'_quick' if quick else ''}_seed{seed}"


def parse_seeds(values: list[str]) -> list[int]:
    """The seeds of `--seeds` (its comma-separated items), checked.

    Raises:
        experiments.cli.UsageError: for no seed, one that is no integer >= 0, or a repeat.
    """
    given = f"--seeds={','.join(values)}"
    if not values:
        raise cli.UsageError(f"{given}: no seed given; give one or more, e.g. --seeds=0,1,2")
    seeds = []
    for value in values:
        if not re.fullmatch(r"[0-9]+", value):
            raise cli.UsageError(
                f"{given}: {value!r} is not a seed (an integer >= 0); e.g. --seeds=0,1,2"
            )
        if int(value) in seeds:
            raise cli.UsageError(f"{given}: seed {int(value)} is given twice; give each once")
        seeds.append(int(value))
    return seeds


def check_start(
    row_name: str, seeds: list[int], root: pathlib.Path, quick: bool, records: pathlib.Path
) -> list[str]:
    """What would stop a run after some seeds trained, checked before the first: a workdir
    that exists, and (unless `quick`, which reads none) the row's records in `records`.

    Returns:
        One message per record that cannot be used (`results.record_problems`).

    Raises:
        experiments.cli.UsageError: for a workdir that exists.
    """
    for seed in seeds:
        workdir = workdir_of(row_name, seed, root, quick)
        if workdir.exists():
            raise cli.UsageError(
                f"{workdir} exists: reproduce trains in fresh workdirs; move it away or pass "
                "another --workdir_root"
            )
    return [] if quick else results.record_problems(records, rows=[row_name])


def run_seed(row_name: str, seed: int, root: pathlib.Path, quick: bool) -> dict:
    """Trains and evaluates one seed in a fresh workdir; returns (and writes) its record."""
    workdir = workdir_of(row_name, seed, root, quick)
    load = [round(os.getloadavg()[0], 2)]  # other work beside the run slows it: say how much
    platform_, before = dot_ceiling(0 if quick else 3)
    walls, scored = [], workdir  # scored: the workdir evaluated (a sweep's best trial)
    lines = commands(row_name, seed, workdir, quick)
    for index in range(len(lines)):
        if index == 1 and results.ROWS[row_name].sweep:  # the sweep ran: its best trial
            sweep_dir = workdir / results.ROWS[row_name].sweep[0].removeprefix("--sweep=")
            lines = commands(row_name, seed, workdir, quick, best_trial(sweep_dir / "summary.csv"))
            scored = pathlib.Path(lines[-1][3].removeprefix("--workdir="))
        command = lines[index]
        print("+ " + " ".join(command), flush=True)
        start = time.monotonic()
        done = subprocess.run([sys.executable, *command[1:]], cwd=results.ROOT)
        walls.append(round(time.monotonic() - start, 1))
        if done.returncode != 0:
            raise cli.UsageError(
                f"{row_name} seed {seed}: {command[2]} ended with status "
                f"{done.returncode} (its output is above)"
            )
    after = [] if quick else dot_ceiling()[1]
    evaluation = json.loads((scored / "eval.json").read_text())
    metrics = {k: v for k, v in evaluation.items() if isinstance(v, int | float)}
    env = environment()
    load.append(round(os.getloadavg()[0], 2))
    env["host"].update(accelerator=platform_, dot_gflops=before + after, loadavg=load)
    record = {
        "row": row_name,
        "provenance": "quick" if quick else "measured",
        "recipe": results.ROWS[row_name].config,
        "seed": seed,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commands": [" ".join(c) for c in lines],
        **env,
        "wall_s": {"train": walls[0], "evaluate": walls[-1]},
        "evaluation": {
            k: v
            for k, v in evaluation.items()
            if not isinstance(v, int | float)
            or k in ("step", "beam_size", "alpha", "averaged_checkpoints")
        },
        "metrics": metrics,
    }
    (workdir / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def verdicts(row_name: str, new: list[dict], recorded: list[dict]) -> list[str]:
    """One line per new record: its figure, the recorded mean ± std, within or not."""
    row = results.ROWS[row_name]
    if not recorded:
        return [
            f"seed {r['seed']}: {row.metric} {r['metrics'][row.metric]:.6g} "
            "(no recorded runs to compare with)"
            for r in new
        ]
    summary = results.summarize(row_name, recorded)
    lines = []
    for record in new:
        value = float(record["metrics"][row.metric])
        verdict = "within the recorded spread" if summary.within(value, row) else "OUTSIDE it"
        lines.append(
            f"seed {record['seed']}: {row.metric} {value:.6g}; recorded {summary.mean:.6g} ± "
            f"{summary.std:.2g} (n = {summary.n}): {verdict}"
        )
    return lines


def main(argv):
    if FLAGS.list:
        for name, row in results.ROWS.items():
            print(f"{name:30s} {row.config:45s} {row.metric}")
        return
    cli.no_arguments(argv)
    if FLAGS.row not in results.ROWS:
        raise cli.UsageError(f"--row={FLAGS.row}: choose one of {', '.join(results.ROWS)}")
    row_name = FLAGS.row
    if FLAGS.record and FLAGS.quick:
        raise cli.UsageError("--quick runs are checks, not results: drop --record")
    seeds = parse_seeds(FLAGS.seeds)
    root, records = pathlib.Path(FLAGS.workdir_root), pathlib.Path(FLAGS.records_dir)
    problems = check_start(row_name, seeds, root, FLAGS.quick, records)
    for problem in problems[:-1]:  # every one named before the exit
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        raise errors.DataError(problems[-1])
    new = [run_seed(row_name, s, root, FLAGS.quick) for s in seeds]
    if FLAGS.quick:
        metric = results.ROWS[row_name].metric
        for record in new:
            value = record["metrics"][metric]
            print(f"seed {record['seed']}: trains and evaluates ({metric} {value:.4g} at step 2)")
        return
    recorded = [
        r for r in results.load_records(row_name, records) if r.get("provenance") != "quick"
    ]
    for line in verdicts(row_name, new, recorded):
        print(line)
    if FLAGS.record:
        file_records(row_name, new, records / row_name)


def file_records(row_name: str, new: list[dict], directory: pathlib.Path) -> None:
    """Writes `new` into `directory` (the row's records), where measured records supersede
    the transcribed ones."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.json"):
        if results.read_record(old, row_name).get("provenance") == "transcribed":
            old.unlink()
    for record in new:
        path = directory / f"seed{record['seed']}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"written: {results.shown(path)}")


if __name__ == "__main__":
    flags.DEFINE_string("row", None, "The row to rerun (--list shows them).")
    flags.DEFINE_list("seeds", ["0"], "Seeds to run, e.g. 0,1,2.")
    flags.DEFINE_string("workdir_root", "runs/reproduce", "Where the fresh workdirs go.")
    flags.DEFINE_bool("quick", False, "2 steps and 8 examples: check the recipe still runs.")
    flags.DEFINE_bool("record", False, "File the records under --records_dir/<row>/.")
    flags.DEFINE_string(
        "records_dir",
        str(results.RECORDS),
        "Where the recorded runs are read (and --record files new ones).",
    )
    flags.DEFINE_bool("list", False, "Print the rows and exit.")
    cli.main(main, compilation_cache=False)
