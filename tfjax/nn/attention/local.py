"""Local (restricted) self-attention: each query sees keys within a radius, in O(L · r).

Source: the "restricted self-attention" of Vaswani et al. 2017, §4 and Table 1. The dense
equivalent is `core.dot_product_attention` with `masking.window_mask`, whose [L, L] logits
cost O(L^2); here queries and keys are cut into blocks of r positions instead.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from tfjax.nn.attention import core


def _blocks(x: Array, block: int, num_blocks: int) -> Array:
    """[B, T, M, H] -> [B, num_blocks, block, M, H], zero-padded at the end."""
    pad = num_blocks * block - x.shape[1]
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return x.reshape(x.shape[0], num_blocks, block, *x.shape[2:])


def _neighbour_blocks(x: Array) -> Array:
    """[B, nb, W, M, H] -> [B, nb, 3W, M, H]: each block with its left and right neighbours."""
    zeros = jnp.zeros_like(x[:, :1])
    left = jnp.concatenate([zeros, x[:, :-1]], axis=1)
    right = jnp.concatenate([x[:, 1:], zeros], axis=1)
    return jnp.concatenate([left, x, right], axis=2)


def local_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B L K H"],
    v: Float[Array, "B L K H"],
    *,
    radius: int,
    causal: bool = False,
) -> Float[Array, "B L N H"]:
    """Self-attention restricted to |i - j| <= radius in O(L * radius) time and memory.

    The "restricted self-attention" of Vaswani et al. 2017 (§4, Table 1): queries are cut into
    blocks of `radius` positions; a query block attends only to its own and its two neighbouring
    key blocks (3 * radius keys), which hold every key within the radius. Equals
    `dot_product_attention` with `masking.window_mask(L, radius, causal=causal)`, whose dense
    [L, L] logits cost O(L^2).

    Args:
      q: queries [B, L, N, H]; k, v: keys and values [B, L, K, H], K divides N.
      radius: r >= 1; query i sees keys j with |i - j| <= r (i - r <= j <= i when causal).
      causal: also hide keys after the query.

    Returns:
      [B, L, N, H] in the dtype of `v`.
    """
    core.check_qkv(q, k, v)
    if radius < 1:
        raise ValueError(f"radius must be >= 1, got {radius}")
    b, length, n, h = q.shape
    num_kv, nb = k.shape[2], -(-length // radius)
    qb = _blocks(q, radius, nb).reshape(b, nb, radius, num_kv, n // num_kv, h)
    kb = _neighbour_blocks(_blocks(k, radius, nb))  # [B, nb, 3W, K, H]
    vb = _neighbour_blocks(_blocks(v, radius, nb))
    logits = jnp.einsum("BCWKGH,BCSKH->BKGCWS", qb, kb).astype(jnp.float32) * h**-0.5
    q_pos = jnp.arange(nb)[:, None] * radius + jnp.arange(radius)[None]  # [nb, W]
    k_pos = jnp.arange(nb)[:, None] * radius + jnp.arange(-radius, 2 * radius)[None]  # [nb, 3W]
    offset = q_pos[:, :, None] - k_pos[:, None, :]  # [nb, W, 3W]
    mask = (jnp.abs(offset) <= radius) & (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] < length)
    if causal:
        mask = mask & (offset >= 0)
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0).astype(v.dtype)
    out = jnp.einsum("BKGCWS,BCSKH->BCWKGH", probs, vb)
    return out.reshape(b, nb * radius, n, v.shape[-1])[:, :length]  # [B, L, N, H]
