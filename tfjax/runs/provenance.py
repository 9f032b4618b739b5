"""What a workdir's checkpoints were trained with, and which file disagrees when they do not fit.

Checkpoints hold arrays; what gives them their meaning sits beside them: `config.json` (the
model, hence the shapes) and the tokenizer (token ids index the embedding rows). So
`config.json` also records the SHA-256 of the workdir's tokenizer (`TOKENIZER_RECORD`, a key
beside the config groups that `tfjax.runs.workdir_format` writes with `with_record` and leaves
out of the config it reads); `recorded_sha256` reads it back for
`tfjax.data.workdir_tokenizer.load` to check.

A config.json without the record (workdirs of older tfjax versions are refused whole by their
format, `tfjax.runs.workdir_format`; this is one edited by hand) has its tokenizer taken as
found (nothing else is known of it), and the next `experiments.train` on the workdir records
the tokenizer it resumed with. A missing tokenizer is
refused either way: it is never built again behind the user's back.

When a checkpoint's arrays do not fit the state a run restores into
(`checkpointing.CheckpointMismatchError`, raised before anything is read), `explain_mismatch`
names what disagrees with the checkpoints: the config (with the keys that differ and change the
arrays' shapes), or, when no such key differs and only the vocabulary-sized arrays differ, the
tokenizer file.
"""

import json
import pathlib
from collections.abc import Callable, Collection

from tfjax import errors
from tfjax.data import workdir_tokenizer
from tfjax.training import checkpointing
from tfjax.training.checkpointing import compat

# config.json's record of the workdir's tokenizer: {file name: SHA-256 (hex)}.
TOKENIZER_RECORD = "tokenizer_sha256"
# The config groups that decide the arrays of a train state (besides the tokenizer's size).
SECTIONS = ("model", "optim")


def with_record(tree: dict, kind: str, workdir: pathlib.Path) -> dict:
    """`tree` (a config as JSON) with the SHA-256 of the workdir's tokenizer of `kind`, if any."""
    digest = workdir_tokenizer.sha256(workdir_tokenizer.path(kind, workdir))
    if digest is None:
        return tree
    return {**tree, TOKENIZER_RECORD: {workdir_tokenizer.name(kind): digest}}


def recorded_sha256(workdir: pathlib.Path, kind: str) -> str | None:
    """The SHA-256 that `workdir/config.json` records for its tokenizer of `kind`; None when it
    records none (a hand-edited file) or cannot be read (its readers report that)."""
    try:
        tree = json.loads((workdir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    record = tree.get(TOKENIZER_RECORD) if isinstance(tree, dict) else None
    digest = record.get(workdir_tokenizer.name(kind)) if isinstance(record, dict) else None
    return digest if isinstance(digest, str) else None


def explain_mismatch(
    error: checkpointing.CheckpointMismatchError,
    *,
    saved: dict | None,
    current: dict,
    workdir: pathlib.Path,
    vocab_size: int,
    config_file: bool,
    shapes: Callable[[dict], dict | None],
    ignore: Collection[str] = (),
) -> errors.CheckpointError:
    """The error to show for checkpoints that do not fit the run, naming what disagrees.

    A differing config key is named only if it changes the arrays: if `current` with the
    key's saved value gives other `shapes`. The tokenizer is named only if no key is and
    every differing array differs in this run's vocabulary size alone. Otherwise `error`
    stands as it is (it says the checkpoints are not damaged).

    Args:
        error: what `Checkpointer.restore` raised.
        saved: the step's config groups (`workdir_format.load_config_dict`); None if it
            could not be read.
        current: the run's config as JSON (`workdir_format.config_dict`).
        workdir: the run's directory.
        vocab_size: the model's vocabulary size.
        config_file: the run's config is the workdir's config.json (the decoding tools), not
            the one a training run was given.
        shapes: a config as JSON -> {key path: shape} of the train state it gives with this
            run's tokenizer; None if that config cannot build one.
        ignore: dotted keys that may differ (`workdir_format.LAYOUT_KEYS`).
    """
    changed = _culprits(saved, current, shapes, ignore)
    checkpoints = workdir / "checkpoints"
    head = f"the checkpoints in {checkpoints} do not fit this run (step {error.step}: "
    head += "; ".join(error.differences[:2]) + ")"
    intact = "they are not damaged, and nothing was read or changed"
    if changed and config_file:
        newest = checkpointing.newest_config(checkpoints)
        copy = newest[0] if newest else checkpoints / str(error.step) / checkpointing.CONFIG_COPY
        message = (
            f"{head}: {workdir / 'config.json'} disagrees with them ({changed}); {intact}. "
            f"Restore config.json from their copy: cp {copy} {workdir / 'config.json'}"
        )
    elif changed:
        message = (
            f"{head}: this run's config disagrees with them ({changed}); {intact}. Rerun with "
            "their settings, or pick another --workdir for the new ones"
        )
    elif not current["model"]["vocab_size"] and _vocabulary_sized(error.shapes, vocab_size):
        tokenizer = workdir_tokenizer.path(current["data"]["tokenizer"], workdir)
        message = (
            f"{head}: {tokenizer} ({vocab_size} tokens) disagrees with them: it is not the "
            f"tokenizer they were trained with; {intact}. Put the original back, from a "
            "backup or a copy of this workdir"
        )
    else:
        return error
    return checkpointing.CheckpointMismatchError(
        message,
        step=error.step,
        saved_config=error.saved_config,
        differences=error.differences,
        shapes=error.shapes,
    )


def _culprits(saved: dict | None, current: dict, shapes, ignore: Collection[str]) -> str:
    """ "model.num_layers: checkpoint 2, now 1; ..." for the keys of `SECTIONS` whose saved
    value changes the train state's shapes ("" if none does)."""
    diffs = compat.differences(saved or {}, current, sections=SECTIONS, ignore=ignore)
    diffs = [(key, old, new) for key, old, new in diffs if compat.ABSENT not in (old, new)]
    if not diffs:
        return ""
    now = shapes(current)
    keys = [(k, old, new) for k, old, new in diffs if shapes(_replaced(current, k, old)) != now]
    shown = [
        f"{key}: checkpoint {compat.show(old)}, now {compat.show(new)}" for key, old, new in keys
    ]
    return "; ".join(shown[:4]) + (f"; {len(shown) - 4} more" if len(shown) > 4 else "")


def _replaced(tree: dict, key: str, value) -> dict:
    """A copy of the nested dict `tree` with the dotted `key` set to `value`."""
    head, _, rest = key.partition(".")
    return {**tree, head: _replaced(tree[head], rest, value) if rest else value}


def _vocabulary_sized(shapes: dict[str, tuple], vocab_size: int) -> bool:
    """Whether every differing array is in both the checkpoint and this run and differs only
    in axes of this run's vocabulary size (the embedding, the output layer, their moments)."""
    return bool(shapes) and all(
        old is not None
        and new is not None
        and len(old) == len(new)
        and all(a == b or b == vocab_size for a, b in zip(old, new, strict=True))
        for old, new in shapes.values()
    )
