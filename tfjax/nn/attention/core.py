"""Attention math as pure functions: score functions, the masked softmax, dot-product attention.

`dot_product_attention` is the one place where masks and biases are applied; it dispatches to
`jax.nn.dot_product_attention` (XLA, or cuDNN's fused attention) for the dot scores, to
`chunked.chunked_attention` when asked (implementation="chunked") and to the einsum reference
written here otherwise. The score functions and dropout live in `primitives` (re-exported
here).

Sources:
- scaled dot-product attention: Vaswani et al. 2017, "Attention Is All You Need", §3.2.1 (Eq. 1);
- plain dot and general (bilinear, q^T W k) scores: Luong et al. 2015, §3.1;
- additive scores, v^T tanh(W_q q + W_k k): Bahdanau et al. 2015, Appendix A.1.2;
- multi-query and grouped-query attention: Shazeer 2019; Ainslie et al. 2023 (GQA), §2.
"""

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from tfjax.nn import masking
from tfjax.nn.attention import chunked
from tfjax.nn.attention.primitives import (  # re-exported: core.attention_logits and the rest
    SCORES,  # noqa: F401
    attention_logits,
    check_qkv,
    check_score,  # noqa: F401
    dropout_active,
    probability_dropout,
)

IMPLEMENTATIONS = ("auto", "reference", "xla", "cudnn", "chunked")
_FAST_SCORES = ("scaled_dot", "dot")


@flax.struct.dataclass
class Lengths:
    """A padding (and causal) mask given by lengths: each row one sequence, padded at its end.

    Query i of row b may attend to key j iff i < q_lengths[b], j < kv_lengths[b] and, when
    causal, j <= i (None: no padding on that side). `dot_product_attention(mask=...)` takes it
    in place of the boolean mask it describes (`dense`): cuDNN's fused attention then masks
    from the lengths in the kernel, with no [B, 1, L, S] bias to read, no bias gradient to
    compute and the blocks above the diagonal skipped when causal; every other path builds
    the dense mask. It cannot describe packed rows (several segments in one row).
    """

    q_lengths: Int[Array, " B"] | None = None
    kv_lengths: Int[Array, " B"] | None = None
    causal: bool = flax.struct.field(pytree_node=False, default=False)

    def dense(self, length: int, kv_length: int) -> Bool[Array, "#B 1 L S"] | None:
        """The boolean mask [B|1, 1, L, S] this describes, or None when it masks nothing."""
        return masking.combine_masks(
            masking.causal_mask(length, kv_length) if self.causal else None,
            _valid(self.q_lengths, length, (1, 3)),  # [B, 1, L, 1]
            _valid(self.kv_lengths, kv_length, (1, 2)),  # [B, 1, 1, S]
        )

    def row_valid(self, length: int) -> Bool[Array, "#B #L"] | None:
        """[B, L]: query rows that may attend to some key (None: all of them)."""
        has_key = None if self.kv_lengths is None else (self.kv_lengths > 0)[:, None]
        return masking.combine_masks(_valid(self.q_lengths, length, ()), has_key)


def _valid(lengths: Array | None, length: int, new_axes: tuple[int, ...]) -> Array | None:
    """[B, length] bool: positions before each row's length, with `new_axes` added."""
    if lengths is None:
        return None
    return jnp.expand_dims(masking.lengths_to_segment_ids(lengths, length) != 0, new_axes)


def use_fast_path(score: str, implementation: str, dropout: bool) -> bool:
    """Whether `jax.nn.dot_product_attention` runs (dot scores, no probability dropout).

    Raises:
      ValueError: for an unknown `implementation`, or "cudnn" where it cannot run.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}")
    fast = implementation not in ("reference", "chunked")
    fast = fast and score in _FAST_SCORES and not dropout
    if implementation == "cudnn" and not fast:
        raise ValueError(
            f"implementation='cudnn' runs the dot scores without probability dropout; got "
            f"score={score!r}{' with dropout' if dropout else ''}: use implementation='auto'"
        )
    return fast


def masked_softmax(
    logits: Float[Array, "B N L S"], mask: Bool[Array, "#B #N #L #S"] | None = None
) -> Float[Array, "B N L S"]:
    """Softmax over keys in float32 with boolean masking; fully masked rows are all zeros."""
    logits = logits.astype(jnp.float32)
    if mask is None:
        return jax.nn.softmax(logits, axis=-1)
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    return jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0)


def attention_weights(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B S K H"],
    *,
    mask: Bool[Array, "#B #N #L #S"] | None = None,
    bias: Float[Array, "#B #N #L #S"] | None = None,
    score: str = "scaled_dot",
    score_params: dict[str, Array] | None = None,
) -> Float[Array, "B N L S"]:
    """The attention probabilities of Eq. 1, softmax(scores + bias) over the allowed keys.

    What `dot_product_attention` multiplies the values with (before probability dropout),
    whichever path it takes: the reference path computes exactly this, the XLA and cuDNN
    paths the same numbers in their own order. Each row sums to 1 over the keys `mask` allows;
    rows with no allowed key are zeros.

    Args: as `dot_product_attention`.

    Returns:
      float32 [B, N, L, S].
    """
    logits = attention_logits(q, k, score=score, score_params=score_params)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    return masked_softmax(logits, mask)


def _row_has_key(mask: Array, out_shape: tuple[int, ...]) -> Array:
    """[B, L, N|1, 1] bool: whether each query row may attend to at least one key."""
    row = jnp.any(mask, axis=-1)  # [B|1, N|1, L|1]
    row = jnp.broadcast_to(row, (row.shape[0], row.shape[1], out_shape[1]))
    return jnp.swapaxes(row, 1, 2)[..., None]  # [B|1, L, N|1, 1]


def _check_cudnn(q: Array) -> None:
    """cuDNN's fused attention: an NVIDIA GPU and 16-bit inputs, else a clear error."""
    if jax.default_backend() != "gpu":
        raise ValueError(
            f"implementation='cudnn' needs an NVIDIA GPU (JAX's default backend is "
            f"{jax.default_backend()!r}): use implementation='auto'"
        )
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(
            f"implementation='cudnn' takes bfloat16 or float16 inputs, got {q.dtype}: set the "
            f"compute dtype (ModelConfig.dtype) to bfloat16, or use implementation='auto'"
        )


def _jax_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B S K H"],
    v: Float[Array, "B S K H"],
    mask: Bool[Array, "#B #N #L #S"] | Lengths | None,
    bias: Float[Array, "#B #N #L #S"] | None,
    score: str,
    implementation: str,
) -> Float[Array, "B L N H"]:
    """The dot scores through `jax.nn.dot_product_attention` (XLA, or cuDNN when asked), with a
    boolean mask or one given by `Lengths` (cuDNN: applied in the kernel); rows that may attend
    to no key are zeros, as on the reference path."""
    if implementation == "cudnn":
        _check_cudnn(q)
    masks = {"mask": mask}
    if isinstance(mask, Lengths):
        # Empty rows are computed as length 1 (no empty softmax in the kernel), zeroed below.
        q_lengths, kv_lengths = (
            None if n is None else jnp.maximum(n, 1).astype(jnp.int32)
            for n in (mask.q_lengths, mask.kv_lengths)
        )
        masks = dict(
            is_causal=mask.causal, query_seq_lengths=q_lengths, key_value_seq_lengths=kv_lengths
        )
    out = jax.nn.dot_product_attention(
        q,
        k.astype(q.dtype),
        v.astype(q.dtype),
        bias=None if bias is None else bias.astype(q.dtype),
        scale=q.shape[-1] ** -0.5 if score == "scaled_dot" else 1.0,
        implementation="cudnn" if implementation == "cudnn" else None,
        **masks,
    ).astype(v.dtype)
    if isinstance(mask, Lengths):
        valid = mask.row_valid(q.shape[1])
        valid = None if valid is None else valid[:, :, None, None]  # [B, L, 1, 1]
    else:
        valid = None if mask is None else _row_has_key(mask, out.shape)
    return out if valid is None else jnp.where(valid, out, 0).astype(v.dtype)


def dot_product_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B S K H"],
    v: Float[Array, "B S K H"],
    *,
    mask: Bool[Array, "#B #N #L #S"] | Lengths | None = None,
    bias: Float[Array, "#B #N #L #S"] | None = None,
    score: str = "scaled_dot",
    score_params: dict[str, Array] | None = None,
    dropout_rate: float | Array = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    implementation: str = "auto",
) -> Float[Array, "B L N H"]:
    """Attention of queries over keys and values (Vaswani et al. 2017, Eq. 1).

    Args:
      q: queries [B, L, N, H] in the compute dtype.
      k, v: keys and values [B, S, K, H]; K divides N (multi-query K = 1, grouped-query 1 < K < N).
      mask: bool, True = may attend, broadcastable to [B, N, L, S]; or a `Lengths`, which
        cuDNN applies in its kernel (without `bias`) and every other path as its dense mask.
      bias: float additive logit bias broadcastable to [B, N, L, S] (relative positions, ALiBi).
      score: one of `SCORES`; see `attention_logits`.
      score_params: parameters of the "general" and "additive" scores.
      dropout_rate: dropout on the attention probabilities (active when not deterministic).
      dropout_rng: PRNG key for that dropout.
      deterministic: disables dropout.
      implementation: "auto" uses `jax.nn.dot_product_attention`'s XLA path for the dot scores
        without probability dropout, else the reference path; "xla" is "auto" by another name;
        "cudnn" asks `jax.nn.dot_product_attention` for cuDNN's fused (flash) attention, which
        needs an NVIDIA GPU, bf16/fp16 inputs, a dot score and no probability dropout (a
        ValueError says which is missing); "reference" always uses the einsum path written here;
        "chunked" runs `chunked.chunked_attention`: blocks with an online softmax, memory linear
        in L and S in the forward and backward passes, every score, on every platform.

    Returns:
      [B, L, N, H] in the dtype of `v`; rows whose mask is all False are zeros.
    """
    check_qkv(q, k, v)
    dropout = dropout_active(dropout_rate, deterministic)
    if isinstance(mask, Lengths):
        if mask.causal and q.shape[1] != k.shape[1]:
            raise ValueError(
                f"a causal Lengths mask is for self-attention (as many queries as keys), got "
                f"{q.shape[1]} queries and {k.shape[1]} keys: use masking.causal_mask"
            )
        if implementation == "cudnn" and bias is None and use_fast_path(score, "cudnn", dropout):
            return _jax_attention(q, k, v, mask, None, score, implementation)
        mask = mask.dense(q.shape[1], k.shape[1])
    if implementation == "chunked":
        return chunked.chunked_attention(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            score=score,
            score_params=score_params,
            dropout_rate=dropout_rate,
            dropout_rng=dropout_rng,
            deterministic=deterministic,
        )
    if use_fast_path(score, implementation, dropout):
        return _jax_attention(q, k, v, mask, bias, score, implementation)
    probs = attention_weights(q, k, mask=mask, bias=bias, score=score, score_params=score_params)
    if dropout:
        probs = probability_dropout(probs, dropout_rate, dropout_rng)
    b, n, length, s = probs.shape
    num_kv = k.shape[2]
    probs = probs.reshape(b, num_kv, n // num_kv, length, s).astype(v.dtype)  # [B, K, G, L, S]
    out = jnp.einsum("BKGLS,BSKH->BLKGH", probs, v)
    return out.reshape(b, length, n, v.shape[-1])  # [B, L, N, H]
