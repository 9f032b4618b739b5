"""What a workdir's checkpoints were trained with, and which file disagrees when they do not fit.

Checkpoints hold arrays; what gives them their meaning sits beside them: `config.json` (the
model, hence the shapes) and the tokenizer (token ids index the embedding rows). So
`config.json` also records the SHA-256 of the workdir's tokenizer (`TOKENIZER_RECORD`, a key
beside the config groups that `tfjax.runs.build.load_config_json` leaves out of the config);
`recorded_sha256` reads it back for `tfjax.data.workdir_tokenizer.load` to check.

Workdirs written before tfjax recorded it have no record: their tokenizer is taken as found
(nothing else is known of it, and refusing would strand every such run), and the next
`experiments.train` on the workdir records the tokenizer it resumed with. A missing tokenizer is
refused either way: it is never built again behind the user's back.

When a checkpoint's arrays do not fit the state a run restores into
(`checkpointing.CheckpointMismatchError`, raised before anything is read), `explain_mismatch`
names what disagrees with the checkpoints: the config (with the keys that differ), or, when the
config agrees and the vocabulary is the tokenizer's, the tokenizer file.
"""

import json
import pathlib
from collections.abc import Collection

from tfjax import errors
from tfjax.data import workdir_tokenizer
from tfjax.training import checkpointing

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
    records none (an older workdir) or cannot be read (its readers report that)."""
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
    ignore: Collection[str] = (),
) -> errors.CheckpointError:
    """The error to show for checkpoints that do not fit the run, naming what disagrees.

    Args:
        error: what `Checkpointer.restore` raised.
        saved: the step's config, with today's fields filled in (`build.load_config_dict`);
            None if it could not be read.
        current: the run's config as JSON (`build.config_dict`).
        workdir: the run's directory.
        vocab_size: the model's vocabulary size.
        config_file: the run's config is the workdir's config.json (the decoding tools), not
            the one a training run was given.
        ignore: dotted keys that may differ (`build.LAYOUT_KEYS`).
    """
    changed = _differences(saved or {}, current, ignore)
    checkpoints = workdir / "checkpoints"
    head = f"the checkpoints in {checkpoints} do not fit this run (step {error.step}: "
    head += "; ".join(error.differences[:2]) + ")"
    intact = "they are not damaged, and nothing was read or changed"
    if changed and config_file:
        copy = checkpoints / str(error.step) / checkpointing.CONFIG_COPY
        message = (
            f"{head}: {workdir / 'config.json'} disagrees with them ({changed}); {intact}. "
            f"Restore config.json from their copy: cp {copy} {workdir / 'config.json'}"
        )
    elif changed:
        message = (
            f"{head}: this run's config disagrees with them ({changed}); {intact}. Rerun with "
            "their settings, or pick another --workdir for the new ones"
        )
    elif not current["model"]["vocab_size"]:  # the vocabulary is the tokenizer's
        tokenizer = workdir_tokenizer.path(current["data"]["tokenizer"], workdir)
        message = (
            f"{head}: {tokenizer} ({vocab_size} tokens) disagrees with them: it is not the "
            f"tokenizer they were trained with; {intact}. Put the original back, from a "
            "backup or a copy of this workdir"
        )
    else:
        return error
    return checkpointing.CheckpointMismatchError(
        message, step=error.step, saved_config=error.saved_config, differences=error.differences
    )


def _differences(saved: dict, current: dict, ignore: Collection[str]) -> str:
    """ "model.num_layers: checkpoint 2, now 1; ..." over `SECTIONS` ("" if none differ)."""
    if not saved:
        return ""
    old, new = _flatten(saved), _flatten(current)
    keys = sorted(
        key
        for key in old.keys() | new.keys()
        if key.split(".")[0] in SECTIONS and key not in ignore and old.get(key) != new.get(key)
    )
    shown = [
        f"{key}: checkpoint {json.dumps(old.get(key))}, now {json.dumps(new.get(key))}"
        for key in keys[:4]
    ]
    return "; ".join(shown) + (f"; {len(keys) - 4} more" if len(keys) > 4 else "")


def _flatten(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else key))
    return flat
