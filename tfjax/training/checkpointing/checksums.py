"""Per-array checksums of a train state: computed at save time, verified after a restore.

orbax keeps no checksums of array data, so a flipped bit in a data file would otherwise restore
silently. Each array leaf gets one uint32 sum over its raw bits; the sums are stored as the JSON
item `checksums`, a dict keyed by the leaf's `jax.tree_util.keystr` path (for example
`.params['dense']['kernel']`) with plain int values.
"""

from typing import Any

import jax
import jax.numpy as jnp


@jax.jit
def leaf_checksum(x: jax.Array) -> jax.Array:
    """sum_i bits_i * (2i + 1) mod 2**32 over the raw bits: any single flipped bit changes it.

    Args:
        x: an array of any shape and dtype (bool, or 1-, 2-, 4- or 8-byte elements).

    Returns:
        [] uint32, the same for any sharding of `x`.
    """
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    else:
        unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        bits = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
    bits = bits.ravel()  # [n]; 8-byte dtypes give two words per element
    weights = 2 * jnp.arange(bits.size, dtype=jnp.uint32) + 1
    return jnp.sum(bits * weights, dtype=jnp.uint32)  # integer sums are order-independent


@jax.jit
def _all_checksums(leaves: list) -> list:
    """`leaf_checksum` of every leaf in one program.

    With several processes, sharded leaves make each checksum a program with cross-process
    collectives; dispatched one by one, such programs run concurrently on XLA:CPU and their
    gloo collectives can interleave differently in each process and deadlock (seen with
    2 processes x 4 devices and FSDP). One program orders its collectives the same everywhere.
    """
    return [leaf_checksum(leaf) for leaf in leaves]


def checksums(tree: Any) -> dict[str, int]:
    """{key path: checksum} of every array leaf, the same for any sharding of the values."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    sums = jax.device_get(_all_checksums([leaf for _, leaf in leaves]))
    return {jax.tree_util.keystr(path): int(s) for (path, _), s in zip(leaves, sums, strict=True)}


def verify(tree: Any, saved: dict[str, int]) -> None:
    """Checks the arrays of `tree` against the checksums saved with them.

    Args:
        tree: the restored state.
        saved: the `checksums` item of the same step.

    Raises:
        ValueError: naming the leaves if the two cover different leaves, or the first array
            whose bits differ from what was saved.
    """
    actual = checksums(tree)
    if actual.keys() != saved.keys():
        raise ValueError(
            f"the state has leaves {sorted(actual)} but the checksums cover {sorted(saved)}"
        )
    for key, value in actual.items():
        if value != saved[key]:
            raise ValueError(
                f"checksum mismatch in state{key} (saved {saved[key]}, read "
                f"{value}): a data file was altered after saving"
            )
