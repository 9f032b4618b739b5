"""Search hyperparameters with Optuna, each generation's suggestions trained as one program.

    python -m experiments.search --config=configs/base.py:tiny --search=lr \\
        [--workdir=runs/searches] [--storage=postgresql://HOST/DB] [--extract] \\
        [--config.train.num_train_steps=500 ...]

`get_search(NAME)` of the config file declares the search space, the number of trials, how
many train at once (one vectorised program), the sampler (TPE, random, QMC, CMA-ES), the pruner
and the metric (`tfjax.runs.search_space`). The trials go to `ROOT/NAME/trial-NNNN` (ordinary
workdirs: config.json, metrics.jsonl, TensorBoard), the groups' checkpoints to
`ROOT/NAME/_group-NNNN`, and the study to `ROOT/NAME/study.journal`, or to the RDB of
`--storage` (several hosts running this same command share the study). Rerunning the command
goes on with the study until it holds its number of finished trials; at the end (or with
`--extract` alone on a finished study) `ROOT/NAME/summary.md` lists the trials, best first.
`--extract` writes the best trial's latest step into its workdir as an ordinary checkpoint,
which `experiments.evaluate`, `translate`, `generate` and `train` read. Needs Optuna (the
`search` extra); docs/sweeps.md, "Searches".
"""

import logging
import math
import pathlib
from collections.abc import Sequence

from absl import flags

from experiments import cli, config_utils

FLAGS = flags.FLAGS
DEFAULT_ROOT = "runs/searches"


def load_search(spec: str, name: str):
    """The checked `SearchSpec` of `get_search(name)` of the config file in `spec`."""
    from tfjax import errors
    from tfjax.runs import search_space

    module = config_utils.load_module(spec)
    path = spec.partition(":")[0]
    if not callable(getattr(module, "get_search", None)):
        raise errors.ConfigError(f"config file {path!r} defines no get_search(name)")
    try:
        raw = module.get_search(name)
    except (KeyError, ValueError) as err:
        known = ", ".join(sorted(getattr(module, "SEARCHES", {}) or {}))
        raise errors.ConfigError(
            f"unknown search {name!r} in {path!r}; choose one of: {known}"
        ) from err
    return search_space.parse(raw, f"get_search({name!r}) of {path!r}")


def make_search(spec: str, name: str, overrides: Sequence[str], root, storage=None):
    """The `tfjax.runs.search.Search` of the command line (every value checked first)."""
    from tfjax.runs import search

    parsed = load_search(spec, name)

    def make_config(values):
        config = config_utils.load_config(spec, overrides)
        config_utils.apply_updates(config, values)
        return config

    # A bad override or search key fails now, before the study is opened.
    make_config({key: _example(dist) for key, dist in parsed.space.items()})
    return search.Search(parsed, name, pathlib.Path(root) / name, make_config, storage)


def _example(dist: dict) -> object:
    kind = next(iter(dist))
    return dist[kind][0]


def summary(study, directory: pathlib.Path) -> pathlib.Path:
    """Writes `directory/summary.md`: one row per trial, the best first."""
    sign = -1 if study.direction.name == "MAXIMIZE" else 1
    trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("status")]
    trials.sort(key=lambda t: (t.value is None, sign * (t.value or 0.0), t.number))
    keys = sorted({k for t in trials for k in t.params})
    lines = [
        f"# Search {study.study_name}",
        "",
        "| trial | " + " | ".join(keys) + " | value | state | status |",
        "|---" * (len(keys) + 4) + "|",
    ]
    for t in trials:
        value = "" if t.value is None or not math.isfinite(t.value) else f"{t.value:.4g}"
        params = [
            f"{t.params[k]:.4g}" if isinstance(t.params.get(k), float) else str(t.params.get(k, ""))
            for k in keys
        ]
        lines.append(
            f"| {t.number} | {' | '.join(params)} | {value} | {t.state.name} | "
            f"{t.user_attrs['status']} |"
        )
    path = directory / "summary.md"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: Sequence[str], overrides: Sequence[str]) -> int:
    """Runs (or joins) the study; with --extract writes its best trial as a workdir."""
    from tfjax.runs import search

    cli.no_arguments(argv)
    cli.quiet_logs()
    plan = make_search(FLAGS.config, FLAGS.search, overrides, FLAGS.workdir, FLAGS.storage)
    plan.heartbeat, plan.stale_after = FLAGS.heartbeat_seconds, FLAGS.stale_after_seconds
    if FLAGS.extract:
        study = search.open_study(plan)
    else:
        study = search.run(plan)
    print(f"summary: {summary(study, plan.directory)}")
    best = search.best(study) if FLAGS.extract else _best_or_none(study)
    if best is not None:
        print(f"best: trial {best.number}, value {best.value:.6g}, {best.params}")
    if FLAGS.extract:
        workdir, step = search.extract_best(study, plan.directory)
        print(
            f"wrote step {step} of trial {best.number} to {workdir / 'checkpoints'}: "
            "an ordinary workdir"
        )
    return 0


def _best_or_none(study):
    try:
        return study.best_trial
    except ValueError:
        logging.getLogger(__name__).warning("no trial completed")
        return None


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string(
        "config", None, "Config file with optional preset, e.g. configs/base.py:tiny."
    )
    flags.DEFINE_string("search", None, "Name passed to the config file's get_search().")
    flags.DEFINE_string("workdir", DEFAULT_ROOT, "Root; trials go to ROOT/SEARCH/trial-NNNN.")
    flags.DEFINE_string(
        "storage",
        None,
        "An RDB URL (sqlite:///PATH, postgresql://USER@HOST/DB) shared by the hosts of one "
        "study; default: the journal file ROOT/SEARCH/study.journal.",
    )
    flags.DEFINE_bool(
        "extract", False, "Write the best trial as an ordinary checkpoint in its workdir."
    )
    flags.DEFINE_float("heartbeat_seconds", 10.0, "Seconds between a trial's heartbeats.")
    flags.DEFINE_float(
        "stale_after_seconds",
        60.0,
        "A running trial without a heartbeat this long is failed and queued again.",
    )
    flags.mark_flags_as_required(["config", "search"])


if __name__ == "__main__":
    _define_flags()
    cli.main(main, config_overrides=True)
