"""Per-array checksums of a train state: computed at save time, verified after a restore.

orbax keeps no checksums of array data, so a flipped bit in a data file would otherwise restore
silently. Each array leaf gets one uint32 sum over its raw bits; the sums are stored as the JSON
item `checksums`, a dict keyed by the leaf's `jax.tree_util.keystr` path (for example
`.params['dense']['kernel']`) with plain int values.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


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


class ProgramError(RuntimeError):
    """The compiled checksum program failed, or disagrees with the host while the arrays match
    their saved checksums computed on the host: the program is at fault (e.g. a damaged
    compilation cache), not the checkpoint. (Sums the program gave for arrays the host cannot
    check are trusted: a difference there is damage.)"""


def host_checksum(x: Any) -> int:
    """`leaf_checksum` computed with numpy on the host, from the array's bytes alone (no
    compiled program): how a mismatch is confirmed before a checkpoint is called damaged."""
    x = np.ascontiguousarray(jax.device_get(x)).reshape(-1)  # [n]
    if x.dtype == np.bool_:
        bits = x.astype(np.uint32)
    else:  # 8-byte dtypes: two words per element, low word first (as XLA's bitcast)
        unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[x.dtype.itemsize]
        bits = x.view(unsigned).astype(np.uint32)
    weights = (2 * np.arange(bits.size, dtype=np.uint64) + 1).astype(np.uint32)
    return int(np.sum(bits * weights, dtype=np.uint32))  # wraps modulo 2**32, as on device


def verify(tree: Any, saved: dict[str, int]) -> None:
    """Checks the arrays of `tree` against the checksums saved with them.

    A checksum that differs, or a compiled program that fails, is checked again on the host
    (`host_checksum`): only a difference there means the data changed. Arrays this process
    does not hold whole (sharded across processes) cannot be checked there: a sum the program
    computed for one that differs is damage; a program that failed is a `ProgramError`.

    Args:
        tree: the restored state.
        saved: the `checksums` item of the same step.

    Raises:
        ValueError: naming the leaves if the two cover different leaves, or the first array
            whose bits differ from what was saved.
        ProgramError: if the compiled checksum program failed, or gave other sums than the
            host for arrays that the host finds intact.
    """
    leaves = {
        jax.tree_util.keystr(path): x for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    if leaves.keys() != saved.keys():
        raise ValueError(
            f"the state has leaves {sorted(leaves)} but the checksums cover {sorted(saved)}"
        )
    try:
        actual, failure = checksums(tree), None
    except Exception as err:  # XLA and JAX raise many types from a broken executable
        actual, failure = None, err
    wrong = [key for key in saved if actual is None or actual[key] != saved[key]]
    checkable = [key for key in wrong if _on_this_host(leaves[key])]
    for key in checkable:
        value = host_checksum(leaves[key])
        if value != saved[key]:
            raise ValueError(
                f"checksum mismatch in state{key} (saved {saved[key]}, read "
                f"{value}): a data file was altered after saving"
            )
    if not wrong:
        return
    if failure is None and len(checkable) < len(wrong):
        # The program ran; only arrays this host cannot check alone (sharded across
        # processes) are left: trust its sums, as before the host check existed.
        key = next(key for key in wrong if key not in checkable)
        raise ValueError(
            f"checksum mismatch in state{key} (saved {saved[key]}, read {actual[key]}): a data "
            "file was altered after saving"
        )
    first = str(failure).strip().splitlines()[0][:200] if str(failure).strip() else ""
    program = f"failed ({type(failure).__name__}: {first})" if failure else "gave other sums"
    checked = (
        "the arrays match their saved checksums computed on the host"
        if len(checkable) == len(wrong)
        else "the arrays could not all be checked on this host"
    )
    raise ProgramError(f"the compiled checksum program {program}, but {checked}")


def _on_this_host(x: Any) -> bool:
    """Whether this process holds every shard of `x`, so `host_checksum` can check it."""
    return getattr(x, "is_fully_addressable", True)
