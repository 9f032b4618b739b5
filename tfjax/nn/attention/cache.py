"""The key/value cache of autoregressive decoding: its layout and attention over it.

Decoding keeps a flax "cache" collection per attention module. Self-attention holds
"cached_key", "cached_value" [B, K, max_len, H] and "cache_index" (int32 scalar): keys and
values are written one step at a time. Cross-attention holds "cached_cross_key",
"cached_cross_value" [B, K, S, H]: the encoder keys and values, projected once per source
(Vaswani et al. 2017, §3.2.3). The cache is head-major ([B, K, S, H], not [B, S, K, H]) so that
`cached_attention` reads it in place at every step.
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from tfjax.nn.attention import core


def head_major(x: Float[Array, "B S K H"]) -> Float[Array, "B K S H"]:
    """[B, S, K, H] -> the cache layout [B, K, S, H]."""
    return jnp.swapaxes(x, 1, 2)


def seq_major(x: Float[Array, "B K S H"]) -> Float[Array, "B S K H"]:
    """The cache layout [B, K, S, H] -> [B, S, K, H]."""
    return jnp.swapaxes(x, 1, 2)


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
    out = jnp.einsum("BKGLS,BKSH->BLKGH", probs, v)
    return out.reshape(b, length, n, v.shape[-1])  # [B, L, N, H]
