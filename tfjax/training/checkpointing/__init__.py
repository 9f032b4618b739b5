"""Checkpoints of a training run: train state, PRNG key, data-iterator position and config.

`Checkpointer` wraps an orbax `CheckpointManager` over `workdir/checkpoints`: one step directory
per saved step, the newest `max_to_keep` kept, each holding the train state as a pytree and four
JSON items: `rng`, `data_state`, `config` and `checksums`. Saves are asynchronous: `save` returns
once the arrays are in host memory; `wait` blocks until they are on disk.

Restoring places the arrays as the abstract state's shardings say, so a checkpoint written from 8
devices restores onto 1 and vice versa. A step is damaged when its orbax commit marker is missing,
when orbax cannot read it, or when the arrays read back disagree with per-array checksums written
at save time (orbax keeps none: a flipped bit in a data file otherwise restores silently; a sum
that differs is computed again on the host before the step is called damaged). `restore()` then
warns and falls back to the previous step. Two failures are not damage and stop at once: a step
whose arrays do not fit the state restored into (`CheckpointMismatchError`, found from its
metadata before any array is read: other settings or another tokenizer), and a checksum program
that fails on arrays the host finds intact (`VerificationError`: e.g. a damaged compilation
cache). Restoring never deletes or rewrites anything; a damaged step is moved aside (to
`<step>.corrupt`) only when `save` needs its number.

Submodules: `manager` (`Checkpointer`), `layout` (the items of a step and their encoding),
`checksums` (per-array checksums), `restoring` (verified reads, fallback, averaging) and
`compat` (`check_compatible`: saved vs current config). A `Conversion` passed to `restore`
reads a step written with another state layout (scanned vs unscanned layers) into the current
one. Warnings go to the logger of this package's name (and its children).
"""

from tfjax.training.checkpointing.compat import check_compatible
from tfjax.training.checkpointing.layout import CONFIG_COPY, newest_config
from tfjax.training.checkpointing.manager import Checkpointer
from tfjax.training.checkpointing.restoring import (
    CheckpointMismatchError,
    CheckpointRestoreError,
    Conversion,
    ConvertFn,
    Restored,
    VerificationError,
)

__all__ = [
    "CONFIG_COPY",
    "CheckpointMismatchError",
    "CheckpointRestoreError",
    "Checkpointer",
    "Conversion",
    "ConvertFn",
    "Restored",
    "VerificationError",
    "check_compatible",
    "newest_config",
]
