"""Chunked attention: queries and keys in blocks with an online softmax, memory linear in length.

`chunked_attention` computes `core.dot_product_attention`'s result without the [L, S] logits.
Queries are cut into chunks of `query_chunk` rows; each query chunk runs over the keys in chunks
of `key_chunk`, keeping a running maximum m, a running normaliser `norm` and an unnormalised output
acc per query (the online softmax): a new key chunk with scores s rescales norm and acc by
exp(m - m') and adds exp(s - m') and exp(s - m') · v, with m' = max(m, max s). At the end
out = acc / norm. Masks and biases are sliced per block: dense ones (broadcastable to [B, N, L, S])
block by block, structural ones (causal, a window radius, segment ids, a bias of key - query
offsets such as T5's relative buckets or ALiBi) computed per block from indices, so they never
exist as [L, S]. Key chunks that no query of the chunk may see are skipped (`lax.cond`), which
halves the work of causal attention and makes a window O(L · (r + chunk)).

Memory in the backward pass: each query chunk and each key step is under `jax.checkpoint`, so
autodiff keeps only the inputs of a query chunk and the running (m, norm, acc) of each key step and
recomputes the block's probabilities when it needs them: temporaries grow linearly with L (and
S), not as L · S. The price is two extra forward computations in the backward pass.

Every score of `primitives.SCORES` runs per block (the additive score's [B, N, Cq, Ck, A]
hidden layer is per block too). Probability dropout draws each block's mask from
fold_in(fold_in(rng, query chunk), key chunk): deterministic for one rng and chunking, with the
reference path's keep probability but not its random mask.

Sources: Rabe & Staats 2021, "Self-attention Does Not Need O(n^2) Memory", §2-3 (chunks, the
online softmax, checkpointing); Dao et al. 2022, "FlashAttention", Algorithm 1 (the running
max and normaliser per query block, and skipping masked blocks).
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from tfjax.nn.attention import primitives

QUERY_CHUNK = 256
KEY_CHUNK = 512
_NEG = float(jnp.finfo(jnp.float32).min)


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    """What every block needs besides its own arrays (closed over by the scan bodies)."""

    length: int  # L
    kv_length: int  # S
    query_chunk: int  # Cq
    key_chunk: int  # Ck
    causal: bool
    radius: int | None
    score: str
    score_params: dict | None
    offset_bias: Callable | None
    dropout_rate: float | Array
    dropout_rng: Array | None  # None: no dropout

    def indices(self, qi: Array, kj: Array) -> tuple[Array, Array]:
        """Key positions [Cq] the queries of chunk qi align with (i + S - L, as in
        `masking.causal_mask`), and the key positions [Ck] of chunk kj."""
        q_idx = qi * self.query_chunk + jnp.arange(self.query_chunk) + self.kv_length - self.length
        return q_idx, kj * self.key_chunk + jnp.arange(self.key_chunk)


def _block_mask(plan: _Plan, q_x: dict, k_x: dict) -> Bool[Array, "#B #N Cq Ck"] | None:
    """Which (query, key) pairs of the block may attend, or None when all may."""
    q_idx, k_idx = plan.indices(q_x["index"], k_x["index"])
    offset = q_idx[:, None] - k_idx[None, :]  # [Cq, Ck] how far the key lies before the query
    masks = [k_x["mask"]]
    if plan.kv_length % plan.key_chunk:
        masks.append((k_idx < plan.kv_length)[None, None, None, :])  # padded keys
    if plan.causal:
        masks.append((offset >= 0)[None, None])
    if plan.radius is not None:
        masks.append((jnp.abs(offset) <= plan.radius)[None, None])
    if q_x["segment_ids"] is not None:
        q_seg, k_seg = q_x["segment_ids"][:, :, None], k_x["segment_ids"][:, None, :]
        masks.append(((q_seg == k_seg) & (q_seg != 0))[:, None])  # [B, 1, Cq, Ck]
    masks = [m for m in masks if m is not None]
    return functools.reduce(jnp.logical_and, masks) if masks else None


def _block_bias(plan: _Plan, q_x: dict, k_x: dict) -> Float[Array, "#B #N #Cq #Ck"] | None:
    """The logit bias of the block in float32: its tile of the dense bias plus the offset bias."""
    bias = None if k_x["bias"] is None else k_x["bias"].astype(jnp.float32)
    if plan.offset_bias is None:
        return bias
    if q_x["positions"] is None:
        q_idx, k_idx = plan.indices(q_x["index"], k_x["index"])
        relative = (k_idx[None, :] - q_idx[:, None])[None]  # [1, Cq, Ck] key - query
    else:
        relative = k_x["positions"][:, None, :] - q_x["positions"][:, :, None]  # [B, Cq, Ck]
    offset = jnp.moveaxis(plan.offset_bias(relative).astype(jnp.float32), -1, 1)  # [B|1, N, ..]
    return offset if bias is None else bias + offset


def _kv_step(plan: _Plan, q_x: dict, carry: tuple, k_x: dict) -> tuple[tuple, None]:
    """One key chunk of the online softmax: (m, norm, acc) [B, N, Cq], [B, N, Cq], [B, N, Cq, H]."""
    mask = _block_mask(plan, q_x, k_x)

    def update(carry):
        m, norm, acc = carry
        logits = primitives.attention_logits(
            q_x["q"], k_x["k"], score=plan.score, score_params=plan.score_params
        )  # [B, N, Cq, Ck] float32
        bias = _block_bias(plan, q_x, k_x)
        if bias is not None:
            logits = logits + bias
        if mask is not None:
            logits = jnp.where(mask, logits, _NEG)
        # The output does not depend on m, so its gradient is zero: stop it (exact, and cheaper).
        m_new = lax.stop_gradient(jnp.maximum(m, jnp.max(logits, axis=-1)))
        probs = jnp.exp(logits - m_new[..., None])  # [B, N, Cq, Ck], <= 1
        if mask is not None:
            probs = jnp.where(mask, probs, 0.0)  # rows with no key so far keep norm = 0
        rescale = jnp.exp(m - m_new)  # [B, N, Cq]
        norm = norm * rescale + jnp.sum(probs, axis=-1)
        if plan.dropout_rng is not None:
            rng = jax.random.fold_in(
                jax.random.fold_in(plan.dropout_rng, q_x["index"]), k_x["index"]
            )
            probs = primitives.probability_dropout(probs, plan.dropout_rate, rng)
        return m_new, norm, acc * rescale[..., None] + _probs_times_values(probs, k_x["v"])

    if mask is None:
        return update(carry), None
    return lax.cond(jnp.any(mask), update, lambda c: c, carry), None


def _probs_times_values(
    probs: Float[Array, "B N Cq Ck"], v: Float[Array, "B Ck K H"]
) -> Float[Array, "B N Cq H"]:
    """probs · v in float32 (query head n reads kv head n // G)."""
    b, n, cq, ck = probs.shape
    num_kv = v.shape[2]
    probs = probs.reshape(b, num_kv, n // num_kv, cq, ck).astype(v.dtype)  # [B, K, G, Cq, Ck]
    out = jnp.einsum("BKGLS,BSKH->BKGLH", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(b, n, cq, v.shape[-1])  # [B, N, Cq, H]


def _query_chunk(plan: _Plan, k_xs: dict, q_x: dict) -> Float[Array, "B Cq N H"]:
    """Attention of one query chunk over all key chunks; float32 [B, Cq, N, H]."""
    b, cq, n, _ = q_x["q"].shape
    h = k_xs["v"].shape[-1]
    carry = (
        jnp.full((b, n, cq), _NEG, jnp.float32),  # m: running max
        jnp.zeros((b, n, cq), jnp.float32),  # norm: running sum of exp(s - m)
        jnp.zeros((b, n, cq, h), jnp.float32),  # acc: running sum of exp(s - m) · v
    )
    k_xs = {**k_xs, "mask": q_x["mask"], "bias": q_x["bias"]}  # this chunk's row of tiles
    q_x = {key: x for key, x in q_x.items() if key not in ("mask", "bias")}
    step = jax.checkpoint(functools.partial(_kv_step, plan, q_x), prevent_cse=False)
    (_, norm, acc), _ = lax.scan(step, carry, k_xs)
    out = acc / jnp.where(norm > 0, norm, 1.0)[..., None]  # rows that saw no key: zeros
    return jnp.swapaxes(out, 1, 2)  # [B, Cq, N, H]


def _chunks(x: Array | None, chunk: int, num: int, axis: int = 1, fill=0) -> Array | None:
    """x with `axis` (of size <= num · chunk) padded with `fill` and split into [num, chunk],
    the chunk index moved to the front: [B, T, ...] -> [num, B, chunk, ...] by default."""
    if x is None:
        return None
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, num * chunk - x.shape[axis])
    x = jnp.pad(x, pad, constant_values=fill)
    x = x.reshape(*x.shape[:axis], num, chunk, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def _tiles(x: Array | None, full: tuple[int, ...], plan: _Plan, nq: int, nk: int, fill):
    """A dense mask or bias broadcastable to `full` = [B, N, L, S], cut into blocks:
    [nq, nk, B|1, N|1, Cq|1, Ck|1] (an axis of size 1 stays 1 inside the block)."""
    if x is None:
        return None
    x = jnp.asarray(x)
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)  # [B|1, N|1, L|1, S|1]
    if x.ndim != 4 or any(d not in (1, f) for d, f in zip(x.shape, full, strict=True)):
        raise ValueError(f"mask and bias must broadcast to [B, N, L, S] = {full}, got {x.shape}")
    rows = plan.query_chunk if x.shape[2] > 1 else 1
    x = _chunks(x, rows, nq if rows > 1 else 1, axis=2, fill=fill)
    cols = plan.key_chunk if x.shape[4] > 1 else 1
    x = _chunks(x, cols, nk if cols > 1 else 1, axis=4, fill=fill)
    # [nk|1, nq|1, B|1, N|1, Cq|1, Ck|1]
    return jnp.broadcast_to(jnp.swapaxes(x, 0, 1), (nq, nk, *x.shape[2:]))


def _check_structure(q: Array, k: Array, segment_ids, positions) -> None:
    """ValueError unless segment ids and positions are [B, L] of self-attention (S = L)."""
    for name, ids in (("segment_ids", segment_ids), ("positions", positions)):
        if ids is None:
            continue
        if k.shape[1] != q.shape[1]:
            raise ValueError(f"{name} describe self-attention: L={q.shape[1]} != S={k.shape[1]}")
        if ids.shape != q.shape[:2]:
            raise ValueError(f"{name} must be [B, L] = {q.shape[:2]}, got {tuple(ids.shape)}")


def chunked_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B S K H"],
    v: Float[Array, "B S K H"],
    *,
    mask: Bool[Array, "#B #N #L #S"] | None = None,
    bias: Float[Array, "#B #N #L #S"] | None = None,
    causal: bool = False,
    radius: int | None = None,
    segment_ids: Int[Array, "B L"] | None = None,
    positions: Int[Array, "B L"] | None = None,
    offset_bias: Callable[[Array], Array] | None = None,
    score: str = "scaled_dot",
    score_params: dict[str, Array] | None = None,
    dropout_rate: float | Array = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    query_chunk: int = QUERY_CHUNK,
    key_chunk: int = KEY_CHUNK,
) -> Float[Array, "B L N H"]:
    """`core.dot_product_attention` in chunks, with memory linear in L and S (see the module).

    The allowed pairs are those of `mask` AND the structural restrictions; the logit bias is
    `bias` plus `offset_bias`. Query i sits at key position i + S - L (the last query aligned
    with the last key, as in `masking.causal_mask`).

    Args:
      q, k, v, mask, bias, score, score_params, dropout_rate, dropout_rng, deterministic: as in
        `core.dot_product_attention`; a dense `mask` or `bias` is read block by block.
      causal: hide keys after the query.
      radius: hide keys further than `radius` positions from the query (None: no window).
      segment_ids: [B, L] int (self-attention, S = L): queries see keys of their own non-zero
        segment only, as `masking.segment_mask`.
      positions: [B, L] int positions read by `offset_bias` (default: the indices).
      offset_bias: int key - query offsets [...] -> float bias [..., N] (T5 relative buckets,
        ALiBi), evaluated per block.
      query_chunk, key_chunk: Cq and Ck, the block sizes (capped at L and S); chunks that do
        not divide the length are padded, and the padding masked.

    Returns:
      [B, L, N, H] in the dtype of `v`; rows that may see no key are zeros.

    Raises:
      ValueError: for mismatched shapes, or dropout without `dropout_rng`.
    """
    primitives.check_qkv(q, k, v)
    primitives.check_score(score)
    _check_structure(q, k, segment_ids, positions)
    dropout = primitives.dropout_active(dropout_rate, deterministic)
    if dropout and dropout_rng is None:
        raise ValueError("dropout_rng is required when dropout_rate > 0 and not deterministic")
    b, length, n, _ = q.shape
    kv_length = k.shape[1]
    cq, ck = min(query_chunk, length), min(key_chunk, kv_length)
    nq, nk = -(-length // cq), -(-kv_length // ck)
    plan = _Plan(
        length, kv_length, cq, ck, causal, radius, score, score_params, offset_bias,
        dropout_rate, dropout_rng if dropout else None,
    )  # fmt: skip
    full = (b, n, length, kv_length)
    q_xs = {
        "q": _chunks(q, cq, nq),  # [nq, B, Cq, N, H]
        "index": jnp.arange(nq),
        "segment_ids": _chunks(segment_ids, cq, nq),  # [nq, B, Cq]
        "positions": _chunks(positions, cq, nq),
        "mask": _tiles(mask, full, plan, nq, nk, fill=False),  # [nq, nk, B|1, N|1, Cq|1, Ck|1]
        "bias": _tiles(bias, full, plan, nq, nk, fill=0),
    }
    k_xs = {
        "k": _chunks(k, ck, nk),  # [nk, B, Ck, K, H]
        "v": _chunks(v, ck, nk),
        "index": jnp.arange(nk),
        "segment_ids": _chunks(segment_ids, ck, nk),  # [nk, B, Ck]
        "positions": _chunks(positions, ck, nk),
    }
    chunk = jax.checkpoint(functools.partial(_query_chunk, plan), prevent_cse=False)
    out = lax.map(lambda q_x: chunk(k_xs, q_x), q_xs)  # [nq, B, Cq, N, H]
    out = jnp.moveaxis(out, 0, 1).reshape(b, nq * cq, n, v.shape[-1])[:, :length]  # [B, L, N, H]
    return out.astype(v.dtype)
