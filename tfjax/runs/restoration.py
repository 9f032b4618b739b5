"""A trained run restored from its workdir, and what to say when its checkpoints do not fit.

`restore(config, workdir)` builds the run of `config` (`tfjax.runs.build`) on one device and
restores its checkpoint (a step, the latest good one, or the average of the last N), converting
the other `model.scan_layers` layout as it reads (`workdir_format.layout_conversion`). The
decoding tools and `evaluate_workdir` start here. `explain_mismatch` turns checkpoints that do
not fit a run into the error that names the config keys or the tokenizer file that disagree.
"""

import copy
import functools
import pathlib

import jax
import ml_collections

from tfjax import errors, models
from tfjax.runs import build, provenance, run_data, workdir_format
from tfjax.training import checkpointing


class NoCheckpointError(FileNotFoundError):
    """`restore` found no checkpoint in the workdir (other missing files raise their own errors)."""


def restore(
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    step: int | None = None,
    *,
    average_last: int = 1,
) -> tuple[build.Run, checkpointing.Restored]:
    """The run built from `config` and its checkpoint `step` (default: the latest good one).

    `average_last=N > 1` instead averages the parameters of the last N saved checkpoints
    (`Checkpointer.restore_average`); `step` must then be None. The state goes to the first
    local device, whatever `parallel` settings trained it (8-way FSDP restores on 1 device).

    Raises:
      NoCheckpointError: if `workdir` has no checkpoint (a `FileNotFoundError`).
      FileNotFoundError: for a missing data file or directory that building the run reads.
      tfjax.errors.WorkdirError: for checkpoints of another workdir format.
      ValueError: for `average_last` with a `step`, or more checkpoints than are saved.
    """
    workdir = pathlib.Path(workdir)
    if average_last > 1 and step is not None:
        raise ValueError("average the last checkpoints or restore one step, not both")
    if not workdir_format.saved_steps(workdir):  # before the build: no tokenizer to read
        raise _no_checkpoint(workdir)
    workdir_format.newest_checkpoint_config(workdir / "checkpoints")  # of this format?
    config = copy.deepcopy(config)
    config.parallel.mode, config.parallel.fsdp = "pmap", 1  # the run's strategy goes unused
    config.parallel.tensor = 1
    run = build.build(config, workdir)
    convert = workdir_format.layout_conversion(run.model_config)
    try:
        with checkpointing.Checkpointer(workdir / "checkpoints") as checkpointer:
            if average_last > 1 and checkpointer.all_steps():
                restored = checkpointer.restore_average(
                    run.abstract_state, last=average_last, convert=convert
                )
            else:
                restored = checkpointer.restore(run.abstract_state, step=step, convert=convert)
    except checkpointing.CheckpointMismatchError as err:
        raise explain_mismatch(err, run, workdir, config_file=True) from err
    if restored is None:
        raise _no_checkpoint(workdir)
    return run, restored


def _no_checkpoint(workdir: pathlib.Path) -> NoCheckpointError:
    return NoCheckpointError(
        f"no checkpoint in {workdir / 'checkpoints'}: train first with "
        f"python -m experiments.train --workdir={workdir}"
    )


def explain_mismatch(
    error: checkpointing.CheckpointMismatchError,
    run: build.Run,
    workdir: pathlib.Path,
    *,
    config_file: bool,
) -> errors.CheckpointError:
    """`provenance.explain_mismatch` for `run`: names the config keys or the tokenizer file
    that disagree with the checkpoints (`config_file`: the run's config is config.json).

    It stays here, not in `provenance`, which `build` imports: the arrays a config gives
    (`_state_shapes`) are built by `build`'s functions, and imports may not cycle."""
    try:
        saved = workdir_format.config_dict(workdir_format.load_config_dict(error.saved_config))
    except Exception:  # not a run's config (None, or another layout): compare nothing
        saved = None
    return provenance.explain_mismatch(
        error,
        saved=saved,
        current=workdir_format.config_dict(run.config),
        workdir=workdir,
        vocab_size=run.model_config.vocab_size,
        config_file=config_file,
        shapes=functools.partial(_state_shapes, vocab_size=run.model_config.vocab_size),
        ignore=workdir_format.LAYOUT_KEYS,
    )


def _state_shapes(tree: dict, vocab_size: int) -> dict[str, tuple[int, ...]] | None:
    """{key path: shape} of the abstract train state of the config `tree` (JSON), with
    `vocab_size` where it leaves the size to the tokenizer; None if it builds no state."""
    try:
        config = workdir_format.load_config_dict(copy.deepcopy(tree))
        model_config = build.make_model_config(config, vocab_size)
        optimizer, _ = build.make_optimizer(config, model_config)
        model = models.create_model(model_config)
        sample = run_data.sample_batch(config)
        state = build.abstract_train_state(model, optimizer, sample, model_config.kind)
    except Exception:  # an invalid combination of settings: other arrays than `tree`'s
        return None
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}
