"""What every attention path shares: the score functions, the input checks, probability dropout.

`core` (dense attention and its dispatch), `chunked` (the blocked online softmax) and `local`
(restricted self-attention) all build on these; `core` re-exports them, so
`core.attention_logits` and the rest keep their old names.

Sources:
- scaled dot-product attention: Vaswani et al. 2017, "Attention Is All You Need", §3.2.1 (Eq. 1);
- plain dot and general (bilinear, q^T W k) scores: Luong et al. 2015, §3.1;
- additive scores, v^T tanh(W_q q + W_k k): Bahdanau et al. 2015, Appendix A.1.2;
- multi-query and grouped-query attention: Shazeer 2019; Ainslie et al. 2023 (GQA), §2.
"""

import numbers

import jax.numpy as jnp
from jaxtyping import Array, Float

from tfjax.nn import prng

SCORES = ("scaled_dot", "dot", "general", "additive")


def check_score(score: str) -> None:
    """ValueError unless `score` is one of `SCORES`."""
    if score not in SCORES:
        raise ValueError(f"score={score!r} is not one of {SCORES}")


def check_qkv(q: Array, k: Array, v: Array) -> None:
    """ValueError unless q [B, L, N, H], k, v [B, S, K, H] fit together with K dividing N."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [B, L, N, H], [B, S, K, H], [B, S, K, H]; got shapes "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    if k.shape != v.shape[:3] + k.shape[3:] or q.shape[0] != k.shape[0]:
        raise ValueError(f"k {k.shape} and v {v.shape} must share [B, S, K]; q is {q.shape}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(
            f"query heads N={q.shape[2]} must be a multiple of kv heads K={k.shape[2]}"
        )


def grouped(q: Float[Array, "B L N H"], num_kv_heads: int) -> Float[Array, "B L K G H"]:
    """[B, L, N, H] -> [B, L, K, G, H]: query head n is group n % G of kv head n // G."""
    b, length, n, h = q.shape
    return q.reshape(b, length, num_kv_heads, n // num_kv_heads, h)  # [B, L, K, G, H]


def attention_logits(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B S K H"],
    *,
    score: str = "scaled_dot",
    score_params: dict[str, Array] | None = None,
) -> Float[Array, "B N L S"]:
    """Unnormalised attention scores in float32.

    Args:
      q: queries [B, L, N, H].
      k: keys [B, S, K, H]; K divides N (query head n uses kv head n // G).
      score: "scaled_dot" (q·k / sqrt(H), Vaswani §3.2.1), "dot" (q·k, Luong §3.1), "general"
        (q^T W k, Luong §3.1; needs `score_params["w"]` [N, H, H]) or "additive"
        (v^T tanh(W_q q + W_k k), Bahdanau A.1.2; needs "w_q" [N, H, A], "w_k" [N, H, A],
        "v" [N, A]). The additive score materialises [B, N, L, S, A]: use it on small inputs.
      score_params: parameters of the general and additive scores.

    Returns:
      float32 logits [B, N, L, S].
    """
    check_score(score)
    b, length, n, h = q.shape
    num_kv = k.shape[2]
    if score == "additive":
        k_full = jnp.repeat(k, n // num_kv, axis=2)  # [B, S, N, H]
        q_a = jnp.einsum("BLNH,NHA->BNLA", q, score_params["w_q"])
        k_a = jnp.einsum("BSNH,NHA->BNSA", k_full, score_params["w_k"])
        hidden = jnp.tanh(q_a[:, :, :, None, :] + k_a[:, :, None, :, :])  # [B, N, L, S, A]
        return jnp.einsum("BNLSA,NA->BNLS", hidden, score_params["v"]).astype(jnp.float32)
    if score == "general":
        q = jnp.einsum("BLNH,NHI->BLNI", q, score_params["w"])  # [B, L, N, H]
    logits = jnp.einsum("BLKGH,BSKH->BKGLS", grouped(q, num_kv), k)
    logits = logits.reshape(b, n, length, k.shape[1]).astype(jnp.float32)  # [B, N, L, S]
    if score == "scaled_dot":
        logits = logits * h**-0.5
    return logits


def dropout_active(rate: float | Array, deterministic: bool) -> bool:
    """Whether probability dropout runs: not `deterministic`, and a rate > 0 or a traced one (a
    vectorised sweep's trials, each with its own rate; a traced 0 keeps every probability)."""
    return not deterministic and (not isinstance(rate, numbers.Real) or rate > 0.0)


def probability_dropout(
    probs: Float[Array, "..."], rate: float | Array, rng: Array | None
) -> Array:
    """Inverted dropout on attention probabilities of any layout: kept with 1 - rate, rescaled."""
    if rng is None:
        raise ValueError("dropout_rng is required when dropout_rate > 0 and not deterministic")
    keep = prng.bernoulli(rng, 1.0 - rate, probs.shape)
    return jnp.where(keep, probs / (1.0 - rate), 0.0)
