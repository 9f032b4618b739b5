"""Train a model: `python -m experiments.train --config=configs/base.py:cpu [--workdir=DIR]`.

Any config field can be overridden with `--config.a.b=value` (unknown keys fail with the list of
valid ones). `--workdir` defaults to `runs/<config file stem>_<preset>` under the current
directory; rerunning the same command with the same workdir resumes from its latest checkpoint.
One run at a time per workdir: a second one stops with the first one's host and pid. Errors the
user can fix print one line and exit with status 2 (`experiments/cli.py`; `--debug` adds the
traceback).
"""

import logging
import pathlib

from absl import flags

from experiments import cli, config_utils

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "configs/base.py", "Config file, optionally with :preset.")
flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config>_<preset>).")
flags.DEFINE_bool(
    "tune_malloc",
    None,
    "Keep XLA's per-step buffers resident instead of page-faulting them in every step "
    "(tfjax.training.host.tune_glibc_malloc; faster CPU train steps, see docs/performance.md). "
    "Default: on "
    "where JAX computes on the CPU alone and the C library is glibc "
    "(tfjax.training.host.should_tune_malloc); --notune_malloc keeps glibc's defaults.",
)


def default_workdir(spec: str) -> pathlib.Path:
    """runs/<file stem>_<preset>, e.g. configs/base.py:cpu -> runs/base_cpu."""
    path, _, preset = spec.partition(":")
    return pathlib.Path("runs") / f"{pathlib.Path(path).stem}_{preset or 'base'}"


def main(argv, overrides):
    cli.no_arguments(argv)
    cli.quiet_logs()
    config = config_utils.load_config(FLAGS.config, overrides)
    from tfjax.runs import validation
    from tfjax.training import host  # no JAX computation yet: the tuning must come first

    validation.check_config(config)  # fails in one line before anything is logged or loaded

    if host.should_tune_malloc(FLAGS.tune_malloc) and not host.tune_glibc_malloc():
        logging.getLogger("tfjax").warning("--tune_malloc: not glibc, nothing to tune")
    logging.getLogger("tfjax").info("host malloc: %s", host.malloc_description())
    from tfjax.parallel import distributed

    if distributed.requested(config.parallel.distributed):  # before any other JAX call
        distributed.initialize(
            distributed.job_from_environ(),
            initialization_timeout_seconds=config.parallel.initialization_timeout_seconds,
            heartbeat_timeout_seconds=config.parallel.heartbeat_timeout_seconds,
        )
    import jax

    from tfjax.runs import trainer

    workdir = pathlib.Path(FLAGS.workdir) if FLAGS.workdir else default_workdir(FLAGS.config)
    if jax.process_index() == 0:
        print(f"workdir: {workdir.resolve()}  (rerun the same command to resume)", flush=True)
        print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}", flush=True)
    result = trainer.train_and_evaluate(config, workdir, checked=True)
    if jax.process_index() == 0 and result:
        print("final eval: " + "  ".join(f"{k} {v:.4f}" for k, v in sorted(result.items())))


if __name__ == "__main__":
    cli.main(main, config_overrides=True)
