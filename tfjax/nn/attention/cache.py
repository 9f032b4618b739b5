"""The key/value cache of decoding: its layout, its reads and writes, and attention over it.

Decoding keeps a flax "cache" collection per attention module. Self-attention holds
"cached_key", "cached_value" [B, K, max_len, H] and "cache_index" (int32 scalar): keys and
values are written one step at a time. Cross-attention holds "cached_cross_key",
"cached_cross_value" [B, K, S, H]: the encoder keys and values, projected once per source
(Vaswani et al. 2017, §3.2.3). The cache is head-major ([B, K, S, H], not [B, S, K, H]) so that
`cached_attention` reads it in place at every step.

Under a scanned stack every cache array has a leading layer axis ([num_layers, B, K, S, H],
"cache_index" [num_layers]); `batch_axis` says where the rows are in either layout.

The array work is pure (`append`, `grow`, `cached_attention`, `attend_over_cache`); the three
functions that take the attention module itself (`self_attention_kv`, `cross_attention_kv`,
`decode_positions`) only move arrays in and out of its "cache" collection and must be called
from its compact `__call__`.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from tfjax.nn import positional
from tfjax.nn.attention import core


def head_major(x: Float[Array, "B S K H"]) -> Float[Array, "B K S H"]:
    """[B, S, K, H] -> the cache layout [B, K, S, H]."""
    return jnp.swapaxes(x, 1, 2)


def seq_major(x: Float[Array, "B K S H"]) -> Float[Array, "B S K H"]:
    """The cache layout [B, K, S, H] -> [B, S, K, H]."""
    return jnp.swapaxes(x, 1, 2)


def batch_axis(name: str, x: Array) -> int | None:
    """The batch axis of the cache array called `name`, or None for "cache_index".

    Keys and values are [B, K, S, H] per layer; a scanned stack (`ModelConfig.scan_layers`)
    holds all layers' in one [num_layers, B, K, S, H] array, so the batch axis is ndim - 4.
    Code that tiles or reorders a cache's rows (beam search) finds them here.
    """
    return None if name == "cache_index" else x.ndim - 4


def variable_name(path: tuple) -> str:
    """The variable name at the end of a pytree path into a "cache" collection ("" for a bare
    leaf): "cached_key", "cache_index", ..."""
    return str(getattr(path[-1], "key", path[-1])) if path else ""


def slots(cache: Any) -> int | None:
    """T, the self-attention slots of a decoding "cache" collection (its first "cached_key"
    array's [..., T, H] axis), or None when it holds no self-attention cache."""
    found = []

    def visit(path, x):
        if not found and variable_name(path) == "cached_key":
            found.append(x.shape[-2])

    jax.tree_util.tree_map_with_path(visit, cache)
    return found[0] if found else None


def grow(cache: Any, length: int) -> Any:
    """The "cache" collection with `length` self-attention slots: every "cached_key" and
    "cached_value" array [..., T, H] padded with zeros to [..., length, H]; the written slots,
    the cross-attention keys and values and "cache_index" are unchanged.

    Slot j holds position j whatever T is (the decoding masks and position biases are built
    for the cache's own T), so a decode can start with a short cache and grow it when it fills
    (`decoding.cache_phases`): each step then reads, and beam search copies, only the slots a
    position can have reached, not max_length of them.

    Raises:
      ValueError: when `length` is shorter than the cache.
    """

    def pad(path, x):
        if variable_name(path) not in ("cached_key", "cached_value"):
            return x
        if length < x.shape[-2]:
            raise ValueError(f"cannot grow a cache of {x.shape[-2]} slots to {length}")
        widths = [(0, 0)] * x.ndim
        widths[-2] = (0, length - x.shape[-2])
        return jnp.pad(x, widths)

    return jax.tree_util.tree_map_with_path(pad, cache)


def _seq_major_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[2], shape[1], shape[3])


def cached_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B K S H"],
    v: Float[Array, "B K S H"],
    *,
    mask: Bool[Array, "#B #N #L #S"] | None = None,
    bias: Float[Array, "#B #N #L #S"] | None = None,
    scale: float = 1.0,
) -> Float[Array, "B L N H"]:
    """Dot-product attention over a head-major key/value cache, as decoding keeps it.

    The same result as `dot_product_attention` with k and v transposed to [B, S, K, H], but
    both contractions read the cache where it lies: batch and kv-head axes lead, so XLA needs
    no copy of the cache at every step (on CPU, transposing the caches of beam search took
    44% of its op time). `scale` multiplies the logits (H^-0.5 for the scaled score).
    """
    b, length, n, h = q.shape
    num_kv, s = k.shape[1], k.shape[2]
    qg = q.reshape(b, length, num_kv, n // num_kv, h)  # [B, L, K, G, H]
    logits = jnp.einsum("BLKGH,BKSH->BKGLS", qg, k.astype(q.dtype))
    logits = logits.reshape(b, n, length, s).astype(jnp.float32) * scale  # [B, N, L, S]
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    probs = core.masked_softmax(logits, mask)  # [B, N, L, S] float32
    probs = probs.reshape(b, num_kv, n // num_kv, length, s).astype(v.dtype)  # [B, K, G, L, S]
    # Head-major out, then one small transpose: asked for [B, L, K, G, H] directly, XLA:CPU
    # lowers the product to a naive loop instead of a library matmul when G * L > 1.
    out = jnp.einsum("BKGLS,BKSH->BKGLH", probs, v)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, length, n, v.shape[-1])  # [B, L, N, H]


def attend_over_cache(
    q: Float[Array, "B L N H"],
    k: Float[Array, "R K S H"],
    v: Float[Array, "R K S H"],
    *,
    mask: Bool[Array, "#B #N #L #S"] | None = None,
    bias: Float[Array, "#B #N #L #S"] | None = None,
    score: str = "scaled_dot",
    score_params: dict[str, Array] | None = None,
    dropout_rate: float | Array = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    implementation: str = "auto",
) -> Float[Array, "B L N H"]:
    """`core.dot_product_attention` with head-major keys and values [R, K, S, H], R = B or B / W.

    Where `dot_product_attention` would take its fast path (dot scores, no probability
    dropout) this is `cached_attention`, which reads the cache in place; otherwise k and v are
    transposed to [B, S, K, H] for the reference path. Arguments as `dot_product_attention`.

    The queries may have W times the cache's rows (query row b * W + i reads cache row b):
    beam search keeps one cross-attention cache per source for its W beams. The fast path then
    attends the W beams of a source as W · L query positions of one row, so each cached
    key and value is read once per source, not once per beam; the other paths repeat the rows.
    """
    rows = shared_rows(q, k)
    dropout = core.dropout_active(dropout_rate, deterministic)
    if core.use_fast_path(score, implementation, dropout):
        scale = q.shape[-1] ** -0.5 if score == "scaled_dot" else 1.0
        if rows == 1:
            return cached_attention(q, k, v, mask=mask, bias=bias, scale=scale)
        b, length = q.shape[:2]
        out = cached_attention(
            q.reshape(k.shape[0], rows * length, *q.shape[2:]),
            k,
            v,
            mask=_fold_rows(mask, rows, length),
            bias=_fold_rows(bias, rows, length),
            scale=scale,
        )  # [B / W, W * L, N, H]
        return out.reshape(b, length, *out.shape[2:])
    if rows > 1:
        k, v = jnp.repeat(k, rows, axis=0), jnp.repeat(v, rows, axis=0)
    return core.dot_product_attention(
        q,
        seq_major(k),
        seq_major(v),
        mask=mask,
        bias=bias,
        score=score,
        score_params=score_params,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
        deterministic=deterministic,
        implementation=implementation,
    )  # [B, L, N, H]


def shared_rows(q: Array, k: Array) -> int:
    """How many query rows read each cached row: q.shape[0] // k.shape[0] (1 but for a cache
    shared by the W beams of a source). ValueError when k's rows do not divide q's."""
    if q.shape[0] == k.shape[0]:
        return 1
    if k.shape[0] == 0 or q.shape[0] % k.shape[0]:
        raise ValueError(
            f"queries of {q.shape[0]} rows cannot read a cache of {k.shape[0]} rows: the "
            "query rows must be the cache's, or a multiple of them (beams sharing a source's row)"
        )
    return q.shape[0] // k.shape[0]


def _fold_rows(x: Array | None, rows: int, length: int) -> Array | None:
    """A mask or bias broadcastable to [B * W, N, L, S] as one broadcastable to
    [B, N, W * L, S]: query row b * W + i, position l becomes row b, position i * L + l."""
    if x is None:
        return None
    x = jnp.asarray(x)
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    if x.shape[0] == 1:  # the same for every row
        return x if x.shape[2] == 1 else jnp.tile(x, (1, 1, rows, 1))
    n, s = x.shape[1], x.shape[3]
    x = jnp.broadcast_to(x, (x.shape[0], n, length, s))
    x = x.reshape(-1, rows, n, length, s).swapaxes(1, 2)  # [B, N, W, L, S]
    return x.reshape(-1, n, rows * length, s)


def append(
    cached_k: Float[Array, "B K T H"],
    cached_v: Float[Array, "B K T H"],
    index: Int[Array, ""],
    k: Float[Array, "B K L H"],
    v: Float[Array, "B K L H"],
) -> tuple[Float[Array, "B K T H"], Float[Array, "B K T H"], Int[Array, ""]]:
    """Writes L new head-major keys/values at slot `index` of caches of T = max_len slots.

    Returns:
      (keys, values) [B, K, T, H] in the caches' dtype, and the next free slot index + L.

    Raises:
      ValueError: when k [B, K, L, H] does not fit the cache.
    """
    b, num_kv, max_len, h = cached_k.shape
    if k.shape[:2] != (b, num_kv) or k.shape[3] != h or k.shape[2] > max_len:
        raise ValueError(
            f"new keys {_seq_major_shape(k.shape)} [B, L, K, H] do not fit the cache "
            f"[B, K, max_len, H] = {cached_k.shape}"
        )
    start = (0, 0, index, 0)
    update = jax.lax.dynamic_update_slice
    cached_k = update(cached_k, k.astype(cached_k.dtype), start)
    cached_v = update(cached_v, v.astype(cached_v.dtype), start)
    return cached_k, cached_v, index + k.shape[2]


def self_attention_kv(
    module: nn.Module, k: Float[Array, "B L K H"], v: Float[Array, "B L K H"]
) -> tuple[Float[Array, "B K T H"], Float[Array, "B K T H"]]:
    """Appends the new keys/values to `module`'s cache; returns the whole head-major cache.

    When the cache does not exist yet (`model.init` with decode=True on full-length inputs),
    it is created with zeros of the inputs' shape, head-major, and k, v pass through.

    Args:
      module: the attention module, inside its compact `__call__`.
      k, v: new keys and values [B, L, K, H].

    Returns:
      keys and values [B, K, max_len, H] (or [B, K, L, H] when the cache was just created).
    """
    k, v = head_major(k), head_major(v)  # [B, K, L, H]
    exists = module.has_variable("cache", "cached_key")
    cached_k = module.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = module.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    index = module.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    if not exists:
        return k, v
    cached_k.value, cached_v.value, index.value = append(
        cached_k.value, cached_v.value, index.value, k, v
    )
    return cached_k.value, cached_v.value


def cross_attention_kv(
    module: nn.Module, kv: tuple[Array, Array] | None
) -> tuple[Float[Array, "B K S H"], Float[Array, "B K S H"]]:
    """The encoder keys/values, head-major [B, K, S, H], kept in `module`'s cache.

    Args:
      module: the cross-attention module, inside its compact `__call__`.
      kv: freshly projected encoder keys and values [B, S, K, H], stored and returned; or None
        to read back the stored ones.

    Raises:
      ValueError: when `kv` is None and nothing is stored.
    """
    if kv is not None:
        k, v = map(head_major, kv)  # [B, K, S, H]
        module.put_variable("cache", "cached_cross_key", k)
        module.put_variable("cache", "cached_cross_value", v)
        return k, v
    if not module.has_variable("cache", "cached_cross_key"):
        raise ValueError(
            "cross-attention with decode=True and inputs_kv=None reads the cached encoder "
            "keys, but the cache has none: pass the encoder output once first"
        )
    return (
        module.get_variable("cache", "cached_cross_key"),
        module.get_variable("cache", "cached_cross_value"),
    )


def decode_positions(module: nn.Module, q: Float[Array, "B L N H"]) -> Int[Array, "B L"]:
    """Default RoPE positions while decoding: cache_index, cache_index + 1, ... [B, L]."""
    start = 0
    if module.has_variable("cache", "cached_key"):
        start = module.get_variable("cache", "cache_index")
    return positional.default_positions(q) + start
