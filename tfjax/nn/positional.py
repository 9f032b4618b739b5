"""Position encodings: absolute tables, relative biases, rotary embeddings and ALiBi.

Pure functions compute every value; the two Flax modules only own the learned tables. Positions
are int32 [B, L] (packed sequences restart at 0 in each segment); angles and biases are float32.

Components and sources:
- `sinusoidal_table`, `sinusoidal_embedding`: Vaswani et al. 2017, "Attention Is All You Need",
  §3.5: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)). The
  "halves" layout (all sines, then all cosines) is the tensor2tensor variant.
- `LearnedPositionalEmbedding`: Vaswani et al. 2017, §3.5 and Table 3 row (E) (learned
  positional embeddings, "nearly identical results").
- `combine_embeddings`: Vaswani et al. 2017, §3.5 (positions are summed with the embeddings);
  concatenation is offered as a variant.
- `relative_position_bucket`, `relative_offset_bias`, `RelativePositionBias`: Raffel et al.
  2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer"
  (T5), §2.1: a learned scalar per head and per logarithmically sized bucket of key - query
  offsets.
- `apply_rope`: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
  §3.2-3.4, with dimension i paired with i + H/2 (the GPT-NeoX / Llama layout).
- `alibi_slopes`, `alibi_offset_bias`, `alibi_bias`: Press et al. 2022, "Train Short, Test
  Long: Attention with Linear Biases Enables Input Length Extrapolation" (ALiBi), §3.
"""

import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Float, Int

SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
COMBINE_MODES = ("add", "concat")

# ---------------------------------------------------------------------------------------------
# Sinusoidal encodings (Vaswani et al. 2017, §3.5).


def _sinusoids(positions: Array, dim: int, base: float, layout: str) -> Array:
    """[...] positions -> [..., dim] float32 encodings; validates dim, base and layout."""
    if layout not in SINUSOIDAL_LAYOUTS:
        raise ValueError(f"layout must be one of {SINUSOIDAL_LAYOUTS}, got {layout!r}")
    if dim < 0 or dim % 2:
        raise ValueError(f"dim must be an even int >= 0, got {dim}")
    if base <= 0:
        raise ValueError(f"base must be > 0, got {base}")
    two_i = jnp.arange(0, dim, 2, dtype=jnp.float32)  # [D/2]: the exponent numerators 2i
    inv_freq = base ** (-two_i / dim)  # [D/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., D/2]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    if layout == "interleaved":
        return jnp.stack([sin, cos], axis=-1).reshape(*angles.shape[:-1], dim)  # [..., D]
    return jnp.concatenate([sin, cos], axis=-1)  # [..., D]


def default_positions(x: Array) -> Int[Array, "B L"]:
    """Positions 0..L-1 for every row of an array whose first two axes are [B, L, ...]."""
    b, length = x.shape[:2]
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))  # [B, L]


def sinusoidal_table(
    length: int,
    dim: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: DTypeLike = jnp.float32,
) -> Float[Array, "L D"]:
    """Fixed sinusoidal encodings for positions 0 .. length - 1 (Vaswani et al. 2017, §3.5).

    Args:
        length: L, number of positions (>= 0).
        dim: D, encoding width; must be even.
        base: wavelength base (10000 in the paper).
        layout: "interleaved" (paper: sin on even dims, cos on odd) or "halves" (D/2 sines for
            i = 0 .. D/2 - 1, then the D/2 matching cosines).
        dtype: output dtype; values are computed in float32 first.

    Returns:
        [L, D] array of `dtype`.

    Raises:
        ValueError: for a negative length, odd or negative dim, base <= 0 or unknown layout.
    """
    if length < 0:
        raise ValueError(f"length must be an int >= 0, got {length}")
    positions = jnp.arange(length, dtype=jnp.int32)  # [L]
    return _sinusoids(positions, dim, base, layout).astype(dtype)


def sinusoidal_embedding(
    positions: Int[Array, "B L"],
    dim: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: DTypeLike = jnp.float32,
) -> Float[Array, "B L D"]:
    """Sinusoidal encodings of explicit positions, e.g. restarting at 0 in each packed segment.

    Row `positions[b, l] = p` equals `sinusoidal_table(...)[p]`.

    Args:
        positions: [B, L] int positions.
        dim: D, encoding width; must be even.
        base: wavelength base (10000 in the paper).
        layout: one of `SINUSOIDAL_LAYOUTS`, as in `sinusoidal_table`.
        dtype: output dtype; values are computed in float32 first.

    Returns:
        [B, L, D] array of `dtype`.

    Raises:
        ValueError: for odd or negative dim, base <= 0 or unknown layout.
    """
    return _sinusoids(positions, dim, base, layout).astype(dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A learned table of absolute position vectors (Vaswani et al. 2017, §3.5, Table 3 (E)).

    Out-of-range positions (< 0 or >= max_len) are never silently wrong when detectable: with
    concrete (untraced) positions the call raises ValueError. Under `jit` they cannot be
    inspected and are clipped to [0, max_len - 1] (`jnp.take(..., mode="clip")`), so a
    position >= max_len reuses row max_len - 1; keep `max_len` >= the longest sequence.

    Attributes:
        max_len: number of rows, i.e. positions 0 .. max_len - 1.
        features: D, width of each position vector.
        dtype: computation / output dtype.
        param_dtype: dtype of the "embedding" parameter [max_len, D].
        embedding_init: initializer of the table (normal, stddev 0.02, by default).
    """

    max_len: int
    features: int
    dtype: DTypeLike = jnp.float32
    param_dtype: DTypeLike = jnp.float32
    embedding_init: nn.initializers.Initializer = nn.initializers.normal(stddev=0.02)

    @nn.compact
    def __call__(self, positions: Int[Array, "B L"]) -> Float[Array, "B L D"]:
        """Looks up [B, L] int positions; returns [B, L, D] in `dtype`."""
        if positions.size:
            try:  # concrete positions only: under a trace (jit, vmap, eval_shape) they are not
                low, high = int(positions.min()), int(positions.max())
            except jax.errors.ConcretizationTypeError:
                low, high = 0, 0
            if low < 0 or high >= self.max_len:
                raise ValueError(
                    f"positions must lie in [0, max_len={self.max_len}), got range [{low}, {high}]"
                )
        table = self.param(
            "embedding", self.embedding_init, (self.max_len, self.features), self.param_dtype
        )  # [max_len, D]
        return jnp.take(table, positions, axis=0, mode="clip").astype(self.dtype)  # [B, L, D]


def combine_embeddings(
    token_embeddings: Float[Array, "B L E"],
    position_embeddings: Float[Array, "#B L P"],
    mode: str = "add",
) -> Float[Array, "B L D"]:
    """Joins token and position embeddings: summed (paper, §3.5) or concatenated.

    Args:
        token_embeddings: [B, L, E] float.
        position_embeddings: [B, L, P] or [1, L, P] float; cast to the token embeddings' dtype.
        mode: "add" (needs P == E; D = E) or "concat" (D = E + P).

    Returns:
        [B, L, D] in the dtype of `token_embeddings`.

    Raises:
        ValueError: for an unknown mode or, with "add", when P != E.
    """
    if mode not in COMBINE_MODES:
        raise ValueError(f"mode must be one of {COMBINE_MODES}, got {mode!r}")
    position_embeddings = position_embeddings.astype(token_embeddings.dtype)
    if mode == "add":
        if position_embeddings.shape[-1] != token_embeddings.shape[-1]:
            width, got = token_embeddings.shape[-1], position_embeddings.shape[-1]
            raise ValueError(f"mode='add' needs position_embeddings of width {width}, got {got}")
        return token_embeddings + position_embeddings  # [B, L, E]
    position_embeddings = jnp.broadcast_to(
        position_embeddings, (*token_embeddings.shape[:2], position_embeddings.shape[-1])
    )  # [B, L, P]
    return jnp.concatenate([token_embeddings, position_embeddings], axis=-1)  # [B, L, E + P]


# ---------------------------------------------------------------------------------------------
# Relative position buckets and bias (Raffel et al. 2020, T5, §2.1).


def _check_bucket_args(bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Validates the bucket hyperparameters; returns the number of exact buckets per side."""
    if bidirectional and num_buckets % 2:
        raise ValueError(f"num_buckets must be even when bidirectional, got {num_buckets}")
    side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = side // 2
    if max_exact < 1:
        minimum = 4 if bidirectional else 2
        raise ValueError(f"num_buckets must be >= {minimum}, got {num_buckets}")
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must exceed the {max_exact} exact buckets per side, got {max_distance}"
        )
    return max_exact


def relative_position_bucket(
    relative_position: Int[Array, "*shape"],
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Int[Array, "*shape"]:
    """Maps key - query offsets to T5 buckets (Raffel et al. 2020, §2.1).

    With distance d = |offset| on one side of `side` buckets: d < side/2 gets its own bucket d;
    larger d gets side/2 + floor(log(d / (side/2)) / log(max_distance / (side/2)) * side/2),
    capped at side - 1 (all d >= max_distance share it). Bidirectional: side = num_buckets/2,
    past and present keys (offset <= 0) use buckets [0, side), future keys [side, num_buckets).
    Causal: side = num_buckets for the past; future keys all map to bucket 0 (with offset 0).

    Args:
        relative_position: int array of any shape, key_position - query_position.
        bidirectional: whether future keys get their own buckets.
        num_buckets: total number of buckets (even when bidirectional).
        max_distance: distances at or beyond this share the last bucket of their side.

    Returns:
        int32 array of the input's shape with values in [0, num_buckets).

    Raises:
        ValueError: if the bucket hyperparameters leave no exact or log-spaced buckets.
    """
    max_exact = _check_bucket_args(bidirectional, num_buckets, max_distance)
    distance = -relative_position.astype(jnp.int32)  # > 0 for keys in the past
    if bidirectional:
        side = num_buckets // 2
        bucket = jnp.where(distance < 0, side, 0)
        distance = jnp.abs(distance)
    else:
        side = num_buckets
        bucket = jnp.zeros_like(distance)
        distance = jnp.maximum(distance, 0)
    # max(distance, 1) keeps log finite; those entries take the exact branch anyway.
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
    scale = (side - max_exact) / math.log(max_distance / max_exact)
    log_bucket = max_exact + (log_ratio * scale).astype(jnp.int32)
    log_bucket = jnp.minimum(log_bucket, side - 1)
    return bucket + jnp.where(distance < max_exact, distance, log_bucket)


def relative_offset_bias(
    relative_position: Int[Array, "*shape"],
    table: Float[Array, "num_buckets N"],
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Float[Array, "*shape N"]:
    """T5 bias of key - query offsets: the row of `table` for each offset's bucket (§2.1).

    The bias depends on the offset alone, so it can be evaluated on any set of offsets (a dense
    [B, L, S] grid, or the blocks of `attention.local_attention`).

    Args:
        relative_position: int array of any shape, key_position - query_position.
        table: [num_buckets, N] per-bucket, per-head bias.
        bidirectional, num_buckets, max_distance: as in `relative_position_bucket`.

    Returns:
        [*shape, N] in the dtype of `table`.
    """
    buckets = relative_position_bucket(
        relative_position,
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )  # [*shape]
    return jnp.take(table, buckets, axis=0)  # [*shape, N]


class RelativePositionBias(nn.Module):
    """T5 relative attention bias: one learned scalar per (bucket, head) (Raffel et al. 2020, §2.1).

    `__call__` gives the dense [B, N, L, S] bias of two position arrays; `offset_bias` gives the
    same bias as a pure function of key - query offsets, for attention that never builds the
    [L, S] grid (`attention.local_attention`). Both read the one "rel_embedding" parameter.

    Attributes:
        num_heads: N.
        num_buckets: buckets of key - query offsets, see `relative_position_bucket`.
        max_distance: offsets at or beyond this share the last bucket.
        bidirectional: False for causal (decoder) self-attention.
        dtype: dtype of the returned bias; float32 (the attention logits' dtype) by default.
        param_dtype: dtype of the "rel_embedding" parameter [num_buckets, N].
        embedding_init: initializer of that parameter (normal, stddev 0.02, by default).
    """

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True
    dtype: DTypeLike = jnp.float32
    param_dtype: DTypeLike = jnp.float32
    embedding_init: nn.initializers.Initializer = nn.initializers.normal(stddev=0.02)

    def setup(self):
        shape = (self.num_buckets, self.num_heads)  # [num_buckets, N]
        self.table = self.param("rel_embedding", self.embedding_init, shape, self.param_dtype)

    def offset_bias(self) -> Callable[[Array], Array]:
        """The bias as a pure function: int key - query offsets [*shape] -> [*shape, N], `dtype`."""
        return functools.partial(
            relative_offset_bias,
            table=jnp.asarray(self.table, self.dtype),
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def __call__(
        self, q_positions: Int[Array, "B L"], kv_positions: Int[Array, "B S"]
    ) -> Float[Array, "B N L S"]:
        """[B, L] query and [B, S] key positions (int) -> [B, N, L, S] bias in `dtype`."""
        _check_position_pair(q_positions, kv_positions)
        relative = kv_positions[:, None, :] - q_positions[:, :, None]  # [B, L, S]
        bias = self.offset_bias()(relative)  # [B, L, S, N]
        return jnp.transpose(bias, (0, 3, 1, 2))  # [B, N, L, S]


def _check_position_pair(q_positions: Array, kv_positions: Array) -> None:
    if q_positions.ndim != 2 or kv_positions.ndim != 2:
        raise ValueError(
            "q_positions and kv_positions must be 2-D [B, L] and [B, S], got shapes "
            f"{tuple(q_positions.shape)} and {tuple(kv_positions.shape)}"
        )
    if q_positions.shape[0] != kv_positions.shape[0]:
        expected, got = q_positions.shape[0], kv_positions.shape[0]
        raise ValueError(f"kv_positions batch size: expected {expected} (q_positions'), got {got}")


# ---------------------------------------------------------------------------------------------
# Rotary embeddings (Su et al. 2021, RoFormer).


def apply_rope(
    x: Float[Array, "B T M H"], positions: Int[Array, "B T"], *, base: float = 10000.0
) -> Float[Array, "B T M H"]:
    """Rotates feature pairs (i, i + H/2) by angle position * base^(-2i/H) (RoFormer §3.4).

    Works for queries [B, L, N, H] and keys [B, S, K, H]: q·k after rotation depends on the
    positions only through their difference (RoFormer §3.2, eq. 16).

    Args:
        x: [B, T, M, H] float (T = L or S, M = N or K); H must be even.
        positions: [B, T] int positions of the rows of `x`.
        base: angle base (10000 in RoFormer).

    Returns:
        [B, T, M, H] in the dtype of `x`; angles and rotation are computed in float32.

    Raises:
        ValueError: if H is odd or `positions` does not match x's [B, T].
    """
    head_dim = x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"apply_rope needs an even head_dim H, got {head_dim}")
    if positions.shape != x.shape[:2]:
        raise ValueError(
            f"positions must have shape {tuple(x.shape[:2])} (x's [B, T]), "
            f"got {tuple(positions.shape)}"
        )
    half = head_dim // 2
    inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2 / head_dim)  # [H/2]
    angles = positions.astype(jnp.float32)[:, :, None, None] * inv_freq  # [B, T, 1, H/2]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    x32 = x.astype(jnp.float32)
    first, second = x32[..., :half], x32[..., half:]  # [B, T, M, H/2] each
    rotated = jnp.concatenate(
        [first * cos - second * sin, second * cos + first * sin], axis=-1
    )  # [B, T, M, H]
    return rotated.astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# ALiBi (Press et al. 2022, §3).


def _geometric_slopes(num_heads: int) -> list[float]:
    """2^(-8/n), 2^(-16/n), ..., 2^(-8) for n heads (n a power of two)."""
    start = 2.0 ** (-8.0 / num_heads)
    return [start ** (k + 1) for k in range(num_heads)]


def alibi_slopes(num_heads: int) -> Float[Array, " N"]:
    """Per-head ALiBi slopes (Press et al. 2022, §3).

    For n a power of two: the geometric sequence starting at 2^(-8/n) with ratio 2^(-8/n). For
    other n: the slopes of the closest power of two below n, followed by every other slope
    (the 1st, 3rd, ...) of twice that power, up to n in total.

    Args:
        num_heads: N >= 1.

    Returns:
        [N] float32.

    Raises:
        ValueError: if `num_heads` < 1.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be an int >= 1, got {num_heads}")
    lower = 2 ** math.floor(math.log2(num_heads))
    slopes = _geometric_slopes(lower)
    slopes += _geometric_slopes(2 * lower)[0::2][: num_heads - lower]
    return jnp.asarray(slopes, dtype=jnp.float32)


def alibi_offset_bias(
    relative_position: Int[Array, "*shape"], slopes: Float[Array, " N"]
) -> Float[Array, "*shape N"]:
    """ALiBi bias of key - query offsets, -slope * |offset| (Press et al. 2022, §3).

    `alibi_bias` on a dense grid of offsets; here on any set of them (e.g. the blocks of
    `attention.local_attention`).

    Args:
        relative_position: int array of any shape, key_position - query_position.
        slopes: [N] float per-head slopes, e.g. `alibi_slopes(N)`.

    Returns:
        [*shape, N] float32.
    """
    distance = jnp.abs(relative_position).astype(jnp.float32)[..., None]  # [*shape, 1]
    return -slopes.astype(jnp.float32) * distance  # [*shape, N]


def alibi_bias(
    q_positions: Int[Array, "B L"], kv_positions: Int[Array, "B S"], slopes: Float[Array, " N"]
) -> Float[Array, "B N L S"]:
    """ALiBi bias -slope * |q_pos - k_pos| (Press et al. 2022, §3).

    Symmetric in the distance; with a causal mask the visible part (k_pos <= q_pos) equals the
    paper's slope * (j - i).

    Args:
        q_positions: [B, L] int query positions.
        kv_positions: [B, S] int key positions.
        slopes: [N] float per-head slopes, e.g. `alibi_slopes(N)`.

    Returns:
        [B, N, L, S] float32.

    Raises:
        ValueError: if the positions are not 2-D with equal batch sizes.
    """
    _check_position_pair(q_positions, kv_positions)
    relative = kv_positions[:, None, :] - q_positions[:, :, None]  # [B, L, S]
    return jnp.transpose(alibi_offset_bias(relative, slopes), (0, 3, 1, 2))  # [B, N, L, S]
