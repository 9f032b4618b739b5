"""Local (restricted) self-attention: each query sees keys within a radius, in O(L · r).

- `local_attention`: the blocked computation. Queries are cut into blocks of r positions and each
  block attends to its own and its two neighbouring key blocks, so logits are [.., L, 3r]
  instead of [.., L, L]. Segment ids (packing, padding), causality, the dot scores, probability
  dropout and position biases that are functions of the key - query offset (T5 relative, ALiBi)
  are all applied per block.
- `Window`: the restriction a model asks `MultiHeadAttention` for (radius, causal, segment ids,
  positions, offset bias); `window_attention` runs it blocked, or dense where the blocked path
  does not apply (`blocked_path_applies`), from the mask and bias of `dense_mask_and_bias`.

Source: the "restricted self-attention" of Vaswani et al. 2017, §4 and Table 1. The dense
equivalent is `core.dot_product_attention` with `masking.window_mask` (and `segment_mask`, and a
dense bias), whose [L, L] logits cost O(L^2).
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from tfjax.nn import masking
from tfjax.nn.attention import chunked, core

# Key - query position offsets [*shape] (int) -> per-head logit bias [*shape, N] (float), e.g.
# `positional.RelativePositionBias.offset_bias()` or a partial of `positional.alibi_offset_bias`.
OffsetBias = Callable[[Int[Array, "..."]], Float[Array, "..."]]
BLOCKED_SCORES = ("scaled_dot", "dot")


@dataclasses.dataclass(frozen=True)
class Window:
    """Restricted self-attention, as `MultiHeadAttention(..., window=...)` takes it.

    Query i sees key j iff |i - j| <= radius (i - radius <= j <= i when causal; indices, not
    positions), both are in the same non-zero segment when `segment_ids` is set, and the logit
    gets `offset_bias(positions[j] - positions[i])` when an offset bias is set. A radius of None
    restricts nothing: the window then only carries causality, segments and the offset bias to
    `chunked.chunked_attention`, which applies them per block (`implementation="chunked"`).

    Attributes:
      radius: r >= 1, or None for no radius.
      causal: also hide keys after the query.
      segment_ids: [B, L] int32 (0 = padding) or None (one segment, no padding).
      positions: [B, L] int32 positions for the offset bias, or None for 0..L-1.
      offset_bias: key - query offsets -> per-head bias [..., N], or None.
    """

    radius: int | None
    causal: bool = False
    segment_ids: Int[Array, "B L"] | None = None
    positions: Int[Array, "B L"] | None = None
    offset_bias: OffsetBias | None = None

    def __post_init__(self):
        if self.radius is not None and self.radius < 1:
            raise ValueError(f"Window.radius must be >= 1, got {self.radius}")


def _blocks(x: Array, block: int, num_blocks: int) -> Array:
    """[B, T, ...] -> [B, num_blocks, block, ...], zero-padded at the end."""
    pad = [(0, 0), (0, num_blocks * block - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, pad)
    return x.reshape(x.shape[0], num_blocks, block, *x.shape[2:])


def _neighbour_blocks(x: Array) -> Array:
    """[B, nb, W, ...] -> [B, nb, 3W, ...]: each block with its left and right neighbours."""
    zeros = jnp.zeros_like(x[:, :1])
    left = jnp.concatenate([zeros, x[:, :-1]], axis=1)
    right = jnp.concatenate([x[:, 1:], zeros], axis=1)
    return jnp.concatenate([left, x, right], axis=2)


def _block_mask(
    length: int, block: int, num_blocks: int, radius: int, causal: bool, segment_ids
) -> Array:
    """[B|1, nb, W, 3W] bool: query w of block c may see key s of that block's neighbourhood."""
    q_idx = jnp.arange(num_blocks)[:, None] * block + jnp.arange(block)[None]  # [nb, W]
    k_idx = jnp.arange(num_blocks)[:, None] * block + jnp.arange(-block, 2 * block)[None]
    offset = q_idx[:, :, None] - k_idx[:, None, :]  # [nb, W, 3W]
    k_valid = (k_idx >= 0) & (k_idx < length)  # [nb, 3W]
    mask = (jnp.abs(offset) <= radius) & k_valid[:, None, :]
    if causal:
        mask = mask & (offset >= 0)
    mask = mask[None]  # [1, nb, W, 3W]
    if segment_ids is not None:
        q_seg = _blocks(segment_ids, block, num_blocks)  # [B, nb, W], padding 0
        k_seg = _neighbour_blocks(q_seg)[:, :, None, :]  # [B, nb, 1, 3W]
        mask = mask & (q_seg[..., None] == k_seg) & (q_seg[..., None] != 0)  # [B, nb, W, 3W]
    return mask


def _block_bias(
    offset_bias: OffsetBias, positions, block: int, num_blocks: int, num_kv: int
) -> Array:
    """Offset bias of every (query, key) pair of the blocks, [B|1, K, G, nb|1, W, 3W] float32.

    Without positions the key - query offset of a pair does not depend on the block, so one
    block's [W, 3W] offsets are evaluated (O(r^2)); with positions, [B, nb, W, 3W] (O(L · r)).
    """
    if positions is None:
        relative = jnp.arange(-block, 2 * block)[None] - jnp.arange(block)[:, None]  # [W, 3W]
        relative = relative[None, None]  # [1, 1, W, 3W]
    else:
        q_pos = _blocks(positions, block, num_blocks)  # [B, nb, W]
        relative = _neighbour_blocks(q_pos)[:, :, None, :] - q_pos[..., None]  # [B, nb, W, 3W]
    bias = offset_bias(relative).astype(jnp.float32)  # [B|1, nb|1, W, 3W, N]
    bias = bias.reshape(*bias.shape[:4], num_kv, -1)  # [B|1, nb|1, W, 3W, K, G]
    return jnp.moveaxis(bias, (4, 5), (1, 2))  # [B|1, K, G, nb|1, W, 3W]


def _check_local_args(radius: int, score: str, length: int, segment_ids, positions) -> None:
    if radius < 1:
        raise ValueError(f"radius must be >= 1, got {radius}")
    if score not in BLOCKED_SCORES:
        raise ValueError(
            f"local_attention runs the scores {BLOCKED_SCORES}, got score={score!r}: use "
            f"dot_product_attention with dense_mask_and_bias (window_attention does)"
        )
    for name, ids in (("segment_ids", segment_ids), ("positions", positions)):
        if ids is not None and (ids.ndim != 2 or ids.shape[1] != length):
            raise ValueError(f"{name} must be [B, L={length}], got shape {tuple(ids.shape)}")


def local_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B L K H"],
    v: Float[Array, "B L K H"],
    *,
    radius: int,
    causal: bool = False,
    segment_ids: Int[Array, "B L"] | None = None,
    positions: Int[Array, "B L"] | None = None,
    offset_bias: OffsetBias | None = None,
    score: str = "scaled_dot",
    dropout_rate: float | Array = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
) -> Float[Array, "B L N H"]:
    """Self-attention restricted to |i - j| <= radius in O(L * radius) time and memory.

    The "restricted self-attention" of Vaswani et al. 2017 (§4, Table 1): queries are cut into
    blocks of W = min(radius, L) positions; a query block attends only to its own and its two
    neighbouring key blocks (3W keys), which hold every key within the radius. Equals
    `dot_product_attention` with the mask `window_mask(L, radius, causal=causal)` AND
    `segment_mask(segment_ids)` and the bias `offset_bias(kv_positions - q_positions)`, whose
    dense [L, L] logits cost O(L^2). As there, a query that sees no key (padding, segment id 0)
    returns zeros.

    Args:
      q: queries [B, L, N, H]; k, v: keys and values [B, L, K, H], K divides N.
      radius: r >= 1; query i sees keys j with |i - j| <= r (i - r <= j <= i when causal).
      causal: also hide keys after the query.
      segment_ids: [B, L] int, 0 = padding; queries see only keys of their own non-zero segment.
      positions: [B, L] int positions the offset bias reads (default 0..L-1).
      offset_bias: int key - query offsets [...] -> float bias [..., N] added to the logits.
      score: "scaled_dot" (q·k / sqrt(H)) or "dot" (q·k), as in `core.attention_logits`.
      dropout_rate, dropout_rng, deterministic: dropout on the probabilities, as in
        `core.dot_product_attention` (same keep probability, not the same random mask).

    Returns:
      [B, L, N, H] in the dtype of `v`.
    """
    core.check_qkv(q, k, v)
    b, length, n, h = q.shape
    _check_local_args(radius, score, length, segment_ids, positions)
    num_kv, block = k.shape[2], min(radius, length)
    nb = -(-length // block)
    qb = _blocks(q, block, nb).reshape(b, nb, block, num_kv, n // num_kv, h)
    kb = _neighbour_blocks(_blocks(k, block, nb))  # [B, nb, 3W, K, H]
    vb = _neighbour_blocks(_blocks(v, block, nb))
    logits = jnp.einsum("BCWKGH,BCSKH->BKGCWS", qb, kb).astype(jnp.float32)
    if score == "scaled_dot":
        logits = logits * h**-0.5
    if offset_bias is not None:
        logits = logits + _block_bias(offset_bias, positions, block, nb, num_kv)
    mask = _block_mask(length, block, nb, radius, causal, segment_ids)[:, None, None]
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)  # [B, K, G, nb, W, 3W]
    probs = jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0)  # fully masked rows: zeros
    if core.dropout_active(dropout_rate, deterministic):
        probs = core.probability_dropout(probs, dropout_rate, dropout_rng)
    out = jnp.einsum("BKGCWS,BCSKH->BCWKGH", probs.astype(v.dtype), vb)
    return out.reshape(b, nb * block, n, v.shape[-1])[:, :length]  # [B, L, N, H]


def blocked_path_applies(score: str, implementation: str) -> bool:
    """Whether `window_attention` runs `local_attention` (else the dense masked path).

    The blocked path runs the dot scores. The "general" and "additive" scores have parameters
    that `core.attention_logits` applies, and "cudnn" asks for cuDNN's fused kernel by name:
    those keep the dense path, O(L^2) in memory.
    """
    return score in BLOCKED_SCORES and implementation != "cudnn"


def dense_mask_and_bias(
    window: Window, length: int
) -> tuple[Bool[Array, "#B 1 L L"] | None, Float[Array, "#B N L L"] | None]:
    """The window as a dense mask [B|1, 1, L, L] (or None) and bias [B|1, N, L, L] (or None),
    O(L^2)."""
    if window.radius is not None:
        restrict = masking.window_mask(length, window.radius, causal=window.causal)
    else:
        restrict = masking.causal_mask(length) if window.causal else None
    mask = masking.combine_masks(
        restrict,
        None if window.segment_ids is None else masking.segment_mask(window.segment_ids),
    )
    if window.offset_bias is None:
        return mask, None
    positions = window.positions
    if positions is None:
        positions = jnp.arange(length, dtype=jnp.int32)[None]  # [1, L]
    relative = positions[:, None, :] - positions[:, :, None]  # [B|1, L, S] key - query
    return mask, jnp.moveaxis(window.offset_bias(relative), -1, 1)  # [B|1, N, L, S]


def window_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B L K H"],
    v: Float[Array, "B L K H"],
    window: Window,
    *,
    score: str = "scaled_dot",
    score_params: dict[str, Array] | None = None,
    dropout_rate: float | Array = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    implementation: str = "auto",
) -> Float[Array, "B L N H"]:
    """Self-attention restricted by `window`: chunked when asked (implementation="chunked",
    every score, memory linear in L), else blocked, O(L · r), where it applies, else dense.

    Args: as `core.dot_product_attention`, with `window` instead of a mask and a bias.

    Returns:
      [B, L, N, H] in the dtype of `v`.
    """
    dropout = dict(dropout_rate=dropout_rate, dropout_rng=dropout_rng, deterministic=deterministic)
    if implementation == "chunked":
        return chunked.chunked_attention(
            q,
            k,
            v,
            causal=window.causal,
            radius=window.radius,
            segment_ids=window.segment_ids,
            positions=window.positions,
            offset_bias=window.offset_bias,
            score=score,
            score_params=score_params,
            **dropout,
        )
    if window.radius is not None and blocked_path_applies(score, implementation):
        return local_attention(
            q,
            k,
            v,
            radius=window.radius,
            causal=window.causal,
            segment_ids=window.segment_ids,
            positions=window.positions,
            offset_bias=window.offset_bias,
            score=score,
            **dropout,
        )
    mask, bias = dense_mask_and_bias(window, q.shape[1])
    return core.dot_product_attention(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        score=score,
        score_params=score_params,
        implementation=implementation,
        **dropout,
    )
