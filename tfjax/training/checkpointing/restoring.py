"""Reading checkpoints back: one verified step, newest-first fallback, damaged steps, averaging.

A step is damaged when its orbax commit marker is missing, when orbax cannot read it, or when
the arrays read back disagree with the checksums written at save time (confirmed on the host).
A step whose arrays do not fit the run (`CheckpointMismatchError`) or whose checksums could not
be computed (`VerificationError`) is not damaged: either stops the restore at once, with no
fallback. For a damaged step `restore_first_good` warns and falls back to the previous step;
the damaged steps are remembered so that `Checkpointer` hides them and may later save over
their numbers, after `make_room` has renamed them to `<step>.corrupt`. Nothing here deletes or
rewrites a checkpoint.
"""

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from tfjax import errors
from tfjax.models import partitioning
from tfjax.training.checkpointing import checksums, layout

log = logging.getLogger(__name__)


class _QuietDamagedReads(logging.Filter):
    """Drops asyncio's "exception was never retrieved" records about reads of damaged steps.

    Orbax reads a checkpoint's arrays concurrently; when one read fails, the failures of the
    others are never awaited, and asyncio logs each (with a traceback) when its future is
    collected, often at interpreter exit, after the run's own one-line error. The failure is
    already reported by `restore_first_good`, so records naming a step directory found damaged
    here are dropped; every other asyncio record passes.
    """

    def __init__(self):
        super().__init__()
        self.paths: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if "never retrieved" not in record.getMessage():
            return True
        text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
        return not any(path in text for path in self.paths)


_quiet_damaged_reads = _QuietDamagedReads()


@dataclasses.dataclass
class Restored:
    """What `Checkpointer.restore` returns.

    Attributes:
        step: the step the checkpoint was saved at.
        state: the train state, with the structure and shardings of the abstract state.
        rng: the typed PRNG key given to `save`, bit-exact and with the same implementation.
        data_state: the data iterator's position (JSON dict).
        config: the resolved run config (JSON dict).
    """

    step: int
    state: Any
    rng: jax.Array
    data_state: dict
    config: dict


@dataclasses.dataclass(frozen=True)
class Conversion:
    """How the state of a checkpoint is laid out differently from the current run's.

    E.g. the parameters of a scanned model, stacked on a layer axis, against an unscanned one
    (`tfjax.nn.stacking`). Both functions are pure maps over whole train-state trees.

    Attributes:
        to_saved: current layout -> the checkpoint's; applied under `jax.eval_shape` to the
            abstract state to get the restore target.
        from_saved: the checkpoint's layout -> the current one; applied to the restored state.
    """

    to_saved: Callable[[Any], Any]
    from_saved: Callable[[Any], Any]


# Given the config a step was saved with and the key paths of its state's arrays (the keys of its
# `checksums` item, e.g. ".params['dense']['kernel']"): the `Conversion` it needs, or None.
ConvertFn = Callable[[dict, Collection[str]], Conversion | None]


class CheckpointRestoreError(errors.CheckpointError, RuntimeError):
    """Checkpoints exist but none of the ones tried could be restored.

    Damaged files or changed settings: a `CheckpointError` the user can fix, and still the
    `RuntimeError` it was before the errors had their own family.
    """


class CheckpointMismatchError(CheckpointRestoreError):
    """A step whose arrays do not fit the state restored into: other arrays, or other shapes.

    Found from the step's metadata and checksum keys before any array is read; the step is
    not damaged, and no older step is tried (they come from the same run).

    Attributes:
        step: the step.
        saved_config: the step's `config` item (a dict; None if it is not one).
        differences: one line per differing array, e.g. "state.params['embed']: saved
            (14, 32), this run (11, 32)".
        shapes: the same as {"state.params['embed']": ((14, 32), (11, 32))}: (the saved
            shape, this run's); None for the side that lacks the array (the saved shape of
            an array this run lacks is not looked up: ()).
    """

    def __init__(
        self,
        message: str,
        *,
        step: int,
        saved_config,
        differences: list[str],
        shapes: dict[str, tuple] | None = None,
    ):
        super().__init__(message)
        self.step, self.saved_config, self.differences = step, saved_config, differences
        self.shapes = {} if shapes is None else shapes


class VerificationError(errors.UserError, RuntimeError):
    """A step could not be checked against its checksums for a reason outside the checkpoint:
    the compiled checksum program failed (`checksums.ProgramError`). Not called damage."""


def restore_step(
    manager: ocp.CheckpointManager,
    directory: epath.Path,
    step: int,
    abstract_state: Any,
    convert: ConvertFn | None = None,
) -> Restored:
    """Restores and verifies one step; raises if anything about it is wrong.

    The step's config and checksums are read first. With `convert`, if `convert(config,
    checksum keys)` gives a `Conversion`, the state is restored in the saved layout, verified
    against all its checksums, then converted. Before any array is read, the arrays of the
    target are compared with the step's (`_check_fits`).

    Raises:
        CheckpointMismatchError: the step's arrays do not fit `abstract_state`.
        VerificationError: the checksum program failed on arrays the host finds intact.
        Exception: anything else means the step is damaged (see `restore_first_good`).
    """
    step_dir = directory / str(step)
    if not (step_dir / layout.COMMIT_MARKER).exists():
        raise FileNotFoundError(
            f"{step_dir} has no {layout.COMMIT_MARKER}: its save never finished"
        )
    _check_json_items(step_dir)
    saved = manager.restore(step, args=layout.config_args(checksums=True))
    if not isinstance(saved.checksums, dict):
        raise TypeError(f"item 'checksums' is a {type(saved.checksums).__name__}, not a dict")
    conversion = None if convert is None else convert(saved.config, frozenset(saved.checksums))
    if conversion is not None:
        abstract_state = jax.eval_shape(conversion.to_saved, abstract_state)
    _check_fits(step_dir, step, abstract_state, saved)
    items = manager.restore(step, args=layout.restore_args(abstract_state))
    try:
        checksums.verify(items.state, items.checksums)
    except checksums.ProgramError as err:
        raise VerificationError(
            f"could not check checkpoint step {step} in {directory} against its checksums: "
            f"{err}. Its files are not known to be damaged: the compiled checksum program "
            "disagrees with the host's check, a fault of the compiled program (such as a "
            "compilation cache whose entries were altered or swapped), not damage"
        ) from err
    for name in ("data_state", "config"):
        if not isinstance(items[name], dict):
            raise TypeError(f"item {name!r} is a {type(items[name]).__name__}, not a dict")
    return Restored(
        step=step,
        state=items.state if conversion is None else conversion.from_saved(items.state),
        rng=layout.key_from_json(items.rng),
        data_state=items.data_state,
        config=items.config,
    )


def _check_fits(step_dir: epath.Path, step: int, target: Any, saved) -> None:
    """Raises CheckpointMismatchError if the arrays of `target` are not those of the step (its
    checksums' keys) or have other shapes (its metadata), before orbax reads any array: a
    read of arrays of another shape fails only after starting every read, which then fail
    again in the background."""
    leaves = jax.tree_util.tree_flatten_with_path(target)[0]
    expected = {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}
    shapes = {f"state{key}": (None, expected[key]) for key in expected.keys() - saved.checksums}
    shapes.update({f"state{key}": ((), None) for key in saved.checksums.keys() - expected})
    differences = [
        f"{key}: not in the checkpoint" if old is None else f"{key}: not in this run"
        for key, (old, _) in sorted(
            shapes.items(), key=lambda item: (item[1][0] is not None, item[0])
        )
    ]
    saved_shapes = _saved_shapes(step_dir / layout.STATE_ITEM)
    for path, leaf in leaves:
        shape = saved_shapes.get(partitioning.path_names(path))
        if shape is not None and shape != tuple(leaf.shape):
            key = f"state{jax.tree_util.keystr(path)}"
            shapes[key] = (shape, tuple(leaf.shape))
            differences.append(f"{key}: saved {shape}, this run {tuple(leaf.shape)}")
    if not differences:
        return
    shown = "; ".join(differences[:3]) + (
        f"; {len(differences) - 3} more" if len(differences) > 3 else ""
    )
    raise CheckpointMismatchError(
        f"checkpoint step {step} in {step_dir.parent} does not fit the state this run restores "
        f"({shown}). Its arrays were not read and are not damaged: they were written by a run "
        "with other model or optimizer settings, or another tokenizer; rerun with those, or "
        "pick another --workdir",
        step=step,
        saved_config=saved.config if isinstance(saved.config, dict) else None,
        differences=differences,
        shapes=shapes,
    )


def _saved_shapes(state_dir: epath.Path) -> dict[tuple[str, ...], tuple[int, ...]]:
    """{key names: shape} of the arrays a step's state item holds, from its metadata alone;
    {} if the metadata cannot be read (the restore then reports the damage)."""
    handler = ocp.StandardCheckpointHandler()
    try:
        metadata = handler.metadata(state_dir)
        leaves = jax.tree_util.tree_flatten_with_path(metadata)[0]
    except Exception:  # a damaged step: the restore names what is wrong with it
        return {}
    finally:
        handler.close()
    return {
        partitioning.path_names(path): tuple(leaf.shape)
        for path, leaf in leaves
        if hasattr(leaf, "shape")
    }


def _check_json_items(step_dir: epath.Path) -> None:
    """Raises ValueError naming the first JSON item file of the step that does not parse
    (orbax's own error names neither the item nor the file); missing ones are orbax's to report."""
    for name in layout.JSON_ITEMS:
        path = step_dir / name / layout.JSON_FILE
        if not path.exists():
            continue
        try:
            json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(f"file {path} is damaged or cut short (not JSON: {err})") from err


def restore_first_good(
    manager: ocp.CheckpointManager,
    directory: epath.Path,
    abstract_state: Any,
    candidates: Iterable[int],
    *,
    damaged: set[int],
    fallback: bool,
    convert: ConvertFn | None = None,
) -> Restored | None:
    """Restores the first of `candidates` that is not damaged.

    Args:
        manager: the orbax manager over `directory`.
        directory: where the step directories live; named in messages.
        abstract_state: see `Checkpointer.restore`.
        candidates: steps to try in order (newest first for a fallback).
        damaged: each step that fails is added to it.
        fallback: whether failures are expected: each is then logged as a warning.
        convert: see `restore_step`.

    Returns:
        The first step that restores, or None if `candidates` is empty.

    Raises:
        CheckpointRestoreError: if every candidate failed; the message lists each with its reason.
    """
    failures = []
    for candidate in candidates:
        try:
            return restore_step(manager, directory, candidate, abstract_state, convert)
        except (CheckpointMismatchError, VerificationError):
            raise  # not damage: every step would fail alike
        except Exception as e:  # orbax and tensorstore raise many types; any means unusable
            failures.append(f"step {candidate}: {_reason(e)}")
            damaged.add(candidate)
            _quiet_damaged_reads.paths.add(os.path.join(str(directory), str(candidate), ""))
            asyncio_log = logging.getLogger("asyncio")
            if _quiet_damaged_reads not in asyncio_log.filters:
                asyncio_log.addFilter(_quiet_damaged_reads)
            if fallback:
                log.warning(
                    "%s: damaged checkpoint %s; trying the previous one", directory, failures[-1]
                )
    if failures:
        raise _restore_error(directory, failures)
    return None


def average_params(restore: Callable[[int], Restored], steps: Sequence[int]) -> Restored:
    """The newest of `steps` with its parameters replaced by their mean over all `steps`.

    The steps are restored one at a time and summed, so memory holds two states, not all.

    Args:
        restore: reads one step, e.g. `lambda s: checkpointer.restore(abstract, step=s)`.
        steps: the steps to average, oldest first; at least one.
    """
    newest, total = None, None
    for step in steps:
        newest = restore(step)
        params = newest.state.params
        total = params if total is None else jax.tree.map(jnp.add, total, params)
    averaged = jax.tree.map(lambda x: (x / len(steps)).astype(x.dtype), total)
    return dataclasses.replace(newest, state=newest.state.replace(params=averaged))


def read_configs(manager: ocp.CheckpointManager, steps: Iterable[int]) -> list[dict]:
    """The `config` items of `steps` that can be read, in the order of `steps`; others skipped."""
    configs = []
    for step in steps:
        try:
            items = manager.restore(step, args=layout.config_args())
        except Exception:
            continue
        if isinstance(items.config, dict):
            configs.append(items.config)
    return configs


def make_room(
    manager: ocp.CheckpointManager, directory: epath.Path, step: int, *, damaged: set[int]
) -> None:
    """Moves a damaged checkpoint for `step` aside before it is saved again.

    Args:
        manager: the orbax manager over `directory`, with no save pending.
        directory: where the step directories live.
        step: the step about to be saved.
        damaged: the steps found damaged; `step` is removed from it once moved.

    Raises:
        ValueError: if a checkpoint for `step` exists and was not found damaged.
    """
    if step not in manager.all_steps():
        return
    if step not in damaged:
        raise ValueError(
            f"a checkpoint for step {step} already exists in {directory}; checkpoints "
            "are never overwritten. Resume from it with restore(), or use another directory."
        )
    _move_aside(directory, step)
    damaged.discard(step)
    manager.reload()


def _move_aside(directory: epath.Path, step: int) -> None:
    """Renames the damaged step directory to `<step>.corrupt` (or `.corrupt1`, ...), keeping it."""
    path = directory / str(step)
    aside = directory / f"{step}.corrupt"
    suffix = 1
    while aside.exists():
        aside, suffix = directory / f"{step}.corrupt{suffix}", suffix + 1
    if jax.process_index() == 0:
        log.warning(
            "moving damaged checkpoint %s to %s before saving step %d again", path, aside, step
        )
        path.rename(aside)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"tfjax_checkpointing_make_room_{step}")


def _restore_error(directory: epath.Path, failures: list[str]) -> CheckpointRestoreError:
    return CheckpointRestoreError(
        f"no checkpoint in {directory} could be restored (tried {'; '.join(failures)}): their "
        "files are damaged or incomplete; move them away to start afresh."
    )


# What tensorstore and orbax append to a failed read: the whole spec of the store, or the repr
# of a bound method ("See full TensorStore details: <bound method ...spec of TensorStore({...")).
_SPEC_DUMP = re.compile(r"\s*(See full TensorStore details:|\[tensorstore_spec).*", re.DOTALL)
_LOCAL_FILE = re.compile(r'local file "([^"]+)"')
_ARRAY = re.compile(r'Error reading "([^"/]+)')  # "params.dense.kernel/0.0": array, chunk
_STATUS = re.compile(r"[A-Z_]+(?=: )")  # DATA_LOSS, OUT_OF_RANGE, ...


def _reason(error: BaseException) -> str:
    """Why a step could not be restored, on one line and without the spec dumps.

    For a file tensorstore could not read (`error` or an error it was raised from): the array,
    the file (the innermost one named) and tensorstore's cause; else the error's first line.
    """
    for cause in _chain(error):
        text = _SPEC_DUMP.sub("", str(cause)).strip()
        files = _LOCAL_FILE.findall(text)
        if files:
            return _unreadable(text, files[-1])
    return _first_line(error)


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the errors it was raised from or while handling, outermost first."""
    chain = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _unreadable(text: str, path: str) -> str:
    """E.g. "array params.dense.kernel: a file under .../2/state/ is damaged or cut short
    (OUT_OF_RANGE: Requested byte range [0, 15151) is not valid for value of size 7876)"."""
    array, status = _ARRAY.search(text), _STATUS.match(text)
    cause = text.rpartition(f'local file "{path}"')[2].lstrip(": ")[:200] or text[:200]
    if status:
        cause = f"{status.group(0)}: {cause}"
    where = f"a file under {path}" if path.endswith("/") else f"file {path}"
    what = f"array {array.group(1)}: " if array else ""
    return f"{what}{where} is damaged or cut short ({cause})"


def _first_line(error: BaseException) -> str:
    text = _SPEC_DUMP.sub("", str(error)).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
