"""Boolean attention masks: True = query may attend to key, broadcastable to [B, N, L, S].

Every builder returns a bool array (usually [B, 1, L, S] or [1, 1, L, S]); `combine_masks` ANDs
them. Masks are applied once, inside the attention function. Padding and packing are read from
int32 segment ids ([B, L], 0 = padding, 1, 2, ... = packed sequences), never from token ids.

Components and sources:
- `padding_mask`, `lengths_to_segment_ids`: padded positions are neither queries nor keys. The
  paper is silent on padding; this follows its reference code (tensor2tensor) and Flax `wmt`.
- `causal_mask`: decoder self-attention sees only earlier positions ("Attention Is All You Need",
  Vaswani et al. 2017, §3.2.3: masking out illegal connections; here with a finite large
  negative in the attention function rather than -inf).
- `segment_mask`, `cross_attention_mask`: packed sequences ("packing", Raffel et al. 2020, T5,
  §3.1.2 / mesh-tensorflow `*_segmentation` features): tokens attend only within their segment.
- `window_mask`: restricted self-attention over a neighbourhood of size r (Vaswani et al. 2017,
  §4 and Table 1).
- `cached_causal_mask`: autoregressive decoding with a key/value cache (Vaswani et al. 2017,
  §3.2.3, applied one step at a time, or a chunk of steps).
"""

import functools

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

# ---------------------------------------------------------------------------------------------
# Validation helpers.


def _check_nonnegative(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value}")


def _check_segment_ids(name: str, segment_ids: Array) -> None:
    if segment_ids.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D [B, L] int segment ids, got shape {tuple(segment_ids.shape)}"
        )


def _check_same_batch(q_segment_ids: Array, kv_segment_ids: Array) -> None:
    _check_segment_ids("q_segment_ids", q_segment_ids)
    _check_segment_ids("kv_segment_ids", kv_segment_ids)
    if q_segment_ids.shape[0] != kv_segment_ids.shape[0]:
        raise ValueError(
            "kv_segment_ids must have the batch size of q_segment_ids: expected "
            f"{q_segment_ids.shape[0]}, got {kv_segment_ids.shape[0]} "
            f"(shapes {tuple(q_segment_ids.shape)} and {tuple(kv_segment_ids.shape)})"
        )


def _query_key_offsets(length: int, kv_length: int | None) -> Int[Array, "L S"]:
    """(i + S - L) - j for query i and key j: how far key j lies before query i.

    The last query is aligned with the last key, as when new queries extend a prefix of keys.
    """
    _check_nonnegative("length", length)
    kv_length = length if kv_length is None else kv_length
    _check_nonnegative("kv_length", kv_length)
    q_pos = jnp.arange(length, dtype=jnp.int32) + (kv_length - length)  # [L]
    kv_pos = jnp.arange(kv_length, dtype=jnp.int32)  # [S]
    return q_pos[:, None] - kv_pos[None, :]  # [L, S]


# ---------------------------------------------------------------------------------------------
# Padding and packing.


def lengths_to_segment_ids(lengths: Int[Array, " B"], length: int) -> Int[Array, "B L"]:
    """Segment ids for unpacked, right-padded sequences.

    Args:
        lengths: [B] int, number of real tokens per row. Values above `length` fill the row;
            values <= 0 give an all-padding row.
        length: L, the padded sequence length (>= 0).

    Returns:
        [B, L] int32: 1 where position < lengths[b], else 0 (padding).

    Raises:
        ValueError: if `lengths` is not 1-D or `length` < 0.
    """
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D [B], got shape {tuple(lengths.shape)}")
    _check_nonnegative("length", length)
    positions = jnp.arange(length, dtype=jnp.int32)  # [L]
    return (positions[None, :] < lengths[:, None]).astype(jnp.int32)  # [B, L]


def padding_mask(
    q_segment_ids: Int[Array, "B L"], kv_segment_ids: Int[Array, "B S"] | None = None
) -> Bool[Array, "B 1 L S"]:
    """True where both the query and the key are real tokens (segment id != 0).

    Ignores which segment a token belongs to; use `segment_mask` for packed batches.

    Args:
        q_segment_ids: [B, L] int, query segment ids (0 = padding).
        kv_segment_ids: [B, S] int, key segment ids; defaults to `q_segment_ids` (self-attention).

    Returns:
        [B, 1, L, S] bool.

    Raises:
        ValueError: if the ids are not 2-D or their batch sizes differ.
    """
    kv_segment_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
    _check_same_batch(q_segment_ids, kv_segment_ids)
    q_valid = (q_segment_ids != 0)[:, None, :, None]  # [B, 1, L, 1]
    kv_valid = (kv_segment_ids != 0)[:, None, None, :]  # [B, 1, 1, S]
    return q_valid & kv_valid


def _same_segment(q_segment_ids: Array, kv_segment_ids: Array) -> Array:
    _check_same_batch(q_segment_ids, kv_segment_ids)
    q_ids = q_segment_ids[:, None, :, None]  # [B, 1, L, 1]
    kv_ids = kv_segment_ids[:, None, None, :]  # [B, 1, 1, S]
    return (q_ids == kv_ids) & (q_ids != 0)  # [B, 1, L, S]


def segment_mask(
    q_segment_ids: Int[Array, "B L"], kv_segment_ids: Int[Array, "B S"] | None = None
) -> Bool[Array, "B 1 L S"]:
    """True iff query and key share a non-zero segment id (packed sequences).

    Subsumes `padding_mask`: padding (id 0) attends nothing and is attended by nothing. For an
    unpacked batch (ids 1 and 0 only) it equals `padding_mask`.

    Args:
        q_segment_ids: [B, L] int, query segment ids (0 = padding, 1, 2, ... = packed sequences).
        kv_segment_ids: [B, S] int, key segment ids; defaults to `q_segment_ids`.

    Returns:
        [B, 1, L, S] bool.

    Raises:
        ValueError: if the ids are not 2-D or their batch sizes differ.
    """
    kv_segment_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
    return _same_segment(q_segment_ids, kv_segment_ids)


def cross_attention_mask(
    q_segment_ids: Int[Array, "B L"], kv_segment_ids: Int[Array, "B S"]
) -> Bool[Array, "B 1 L S"]:
    """Mask for encoder-decoder attention: decoder queries against encoder keys.

    Packed pairs are numbered alike on both sides: decoder segment k holds the target of the
    source in encoder segment k, so a decoder token attends exactly the encoder tokens of its own
    segment; padding (id 0) on either side is excluded. Without packing (ids 1 and 0 only) this is
    "every real target token sees every real source token". The rule is `segment_mask`'s; this
    name exists so that call sites say which attention they build.

    Args:
        q_segment_ids: [B, L] int, decoder (target) segment ids.
        kv_segment_ids: [B, S] int, encoder (source) segment ids.

    Returns:
        [B, 1, L, S] bool.

    Raises:
        ValueError: if the ids are not 2-D or their batch sizes differ.
    """
    return _same_segment(q_segment_ids, kv_segment_ids)


# ---------------------------------------------------------------------------------------------
# Position-based masks.


def causal_mask(length: int, kv_length: int | None = None) -> Bool[Array, "1 1 L S"]:
    """Query i may see key j iff j <= i + (S - L).

    The last query is aligned with the last key, so S > L models L new queries after S - L cached
    keys; with S < L the first L - S queries see no key at all.

    Args:
        length: L, number of queries (>= 0).
        kv_length: S, number of keys (>= 0); defaults to `length`.

    Returns:
        [1, 1, L, S] bool, lower-triangular when S == L.

    Raises:
        ValueError: if a length is negative.
    """
    offsets = _query_key_offsets(length, kv_length)  # [L, S]
    return (offsets >= 0)[None, None]


def window_mask(
    length: int, radius: int, kv_length: int | None = None, causal: bool = False
) -> Bool[Array, "1 1 L S"]:
    """Restricted self-attention: each query sees keys within `radius` positions.

    Vaswani et al. 2017, Table 1 ("self-attention (restricted)", neighbourhood of size r).
    Query i sits at key position p = i + S - L (aligned as in `causal_mask`) and sees key j iff
    |p - j| <= radius; with `causal=True` only keys p - radius <= j <= p.

    Args:
        length: L, number of queries (>= 0).
        radius: r >= 0; radius 0 lets each query see only its own position.
        kv_length: S, number of keys (>= 0); defaults to `length`.
        causal: also hide keys after the query.

    Returns:
        [1, 1, L, S] bool, banded.

    Raises:
        ValueError: if `radius` or a length is negative.
    """
    _check_nonnegative("radius", radius)
    offsets = _query_key_offsets(length, kv_length)  # [L, S]
    if causal:
        mask = (offsets >= 0) & (offsets <= radius)
    else:
        mask = jnp.abs(offsets) <= radius
    return mask[None, None]


def cached_causal_mask(
    positions: Int[Array, "B L"], kv_length: int, *, window_radius: int = 0
) -> Bool[Array, "B 1 L S"]:
    """Causal mask of L new queries against a key/value cache whose slot j holds position j.

    Query (b, i) at position p = positions[b, i] sees slot j iff j <= p, and with a window
    radius r > 0 also p - j <= r (causal restricted self-attention, Vaswani et al. 2017,
    Table 1). Slots after p (not written yet) are hidden.

    Args:
        positions: [B, L] int positions of the new queries (may be traced).
        kv_length: S, number of cache slots (>= 1).
        window_radius: r >= 0; 0 = no window.

    Returns:
        [B, 1, L, S] bool.

    Raises:
        ValueError: if `positions` is not 2-D, `kv_length` < 1 or `window_radius` < 0.
    """
    if positions.ndim != 2:
        raise ValueError(f"positions must be 2-D [B, L], got shape {tuple(positions.shape)}")
    if kv_length < 1:
        raise ValueError(f"kv_length must be an int >= 1, got {kv_length}")
    _check_nonnegative("window_radius", window_radius)
    offsets = positions[:, None, :, None] - jnp.arange(kv_length, dtype=jnp.int32)  # [B, 1, L, S]
    mask = offsets >= 0
    if window_radius:
        mask = mask & (offsets <= window_radius)
    return mask


# ---------------------------------------------------------------------------------------------
# Combination.


def combine_masks(*masks: Bool[Array, "..."] | None) -> Bool[Array, "..."] | None:
    """Logical AND of boolean masks with broadcasting, skipping None.

    Args:
        *masks: bool arrays broadcastable to one shape (e.g. [B, 1, L, S] and [1, 1, L, S]),
            or None.

    Returns:
        bool array of the broadcast shape, or None when every mask is None.

    Raises:
        ValueError: if a mask is not bool or the shapes do not broadcast.
    """
    present = [mask for mask in masks if mask is not None]
    if not present:
        return None
    for i, mask in enumerate(present):
        if mask.dtype != jnp.bool_:
            raise ValueError(f"masks must be bool, got dtype {mask.dtype} for mask {i}")
    try:
        jnp.broadcast_shapes(*(mask.shape for mask in present))
    except ValueError as error:
        shapes = [tuple(mask.shape) for mask in present]
        raise ValueError(f"masks must broadcast to one shape, got shapes {shapes}") from error
    return functools.reduce(jnp.logical_and, present)
