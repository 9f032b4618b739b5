"""`MultiHeadAttention`: the Flax module that wires projections, RoPE, the cache and attention.

It owns the parameters (created by `projections`) and calls the pure pieces: `core` for the
attention itself, `local` for restricted self-attention (a `local.Window`), `cache` for
decoding's key/value cache, `positional.apply_rope` for rotary positions.

Sources: multi-head attention, Vaswani et al. 2017, §3.2.2; self- and cross-attention
(encoder-decoder attention): §3.2.3; grouped-query heads: Ainslie et al. 2023 (GQA), §2;
rotary position embeddings: Su et al. 2021 (RoFormer), §3.4.
"""

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from tfjax.nn import positional
from tfjax.nn.attention import cache, core, local, projections

INTERMEDIATES = "intermediates"  # the Flax collection the weights are sown into
ATTENTION_WEIGHTS = "attention_weights"  # their name there: a tuple of [B, N, L, S] arrays


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2.2) with grouped-query heads.

    Self-attention when `inputs_kv` is None (one fused QKV projection by default); otherwise
    cross-attention with queries from `inputs_q` (the decoder) and keys and values from
    `inputs_kv` (the encoder output), §3.2.3.

    Decoding (`decode=True`) keeps a "cache" collection: self-attention holds "cached_key",
    "cached_value" [B, K, max_len, H] and "cache_index" (int32 scalar); cross-attention holds
    "cached_cross_key", "cached_cross_value" [B, K, S, H]. The cache is head-major so that
    `cached_attention` reads it in place at every step (see `attention.cache`).

    Attention weights: when "intermediates" is mutable (`apply(..., mutable=["intermediates"])`,
    or `tfjax.inference.attention_maps.capture`), each call sows its probabilities [B, N, L, S]
    (float32, before dropout; `core.attention_weights` from this call's queries and keys, so
    they exist for the XLA, cuDNN and blocked local paths too, as the reference formula computes
    them) as "attention_weights". Otherwise nothing is computed: the program is unchanged.

    Parameters: "qkv" [D, N + 2K, H] (fused self-attention), or "query" [D, N, H] with "kv"
    [Dkv, 2K, H] (cross-attention) or "key"/"value" [Dkv, K, H] (unfused); "out" [N, H, D].
    With `value_rank` r > 0 the value projection is "value_down" [Dkv, r] · "value_up" [r, K, H]
    (see `attention.projections`).

    Attributes:
      num_heads: N.
      num_kv_heads: K (0 = N; 1 = multi-query).
      head_dim: H (0 = D // N).
      score: one of `SCORES`.
      dropout_rate: attention-probability dropout.
      fused_qkv: one [D, N + 2K, H] projection for self-attention (one matmul instead of three).
      value_rank: rank of a factorised value projection (0 = full rank).
      rotary: apply rotary position embeddings (RoPE) to queries and keys.
      rope_base: RoPE frequency base.
      use_bias: biases in the projections (the paper's and PyTorch's layers have them).
      implementation: see `dot_product_attention`.
      cross: this is a cross-attention layer; while decoding it may be called without
        `inputs_kv` and then reads the encoder keys/values from the cache.
      dtype: computation dtype; param_dtype: parameter dtype.
    """

    num_heads: int
    num_kv_heads: int = 0
    head_dim: int = 0
    score: str = "scaled_dot"
    dropout_rate: float | Array = 0.0  # an Array: traced (vectorised sweeps)
    fused_qkv: bool = True
    value_rank: int = 0
    rotary: bool = False
    rope_base: float = 10000.0
    use_bias: bool = True
    implementation: str = "auto"
    cross: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.xavier_uniform()
    query_scale: float = 1.0

    def _projections(self) -> projections.Projections:
        return projections.Projections(
            fused_qkv=self.fused_qkv,
            value_rank=self.value_rank,
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
        )

    def _rope(self, q, k, q_positions, kv_positions, *, self_attention: bool, decode: bool):
        """RoPE on q [B, L, N, H] and k [B, S, K, H] at the given or the default positions."""
        if q_positions is None:
            q_positions = (
                cache.decode_positions(self, q) if decode else positional.default_positions(q)
            )  # [B, L]
        if kv_positions is None:
            kv_positions = q_positions if self_attention else positional.default_positions(k)
        q = positional.apply_rope(q, q_positions, base=self.rope_base)
        return q, positional.apply_rope(k, kv_positions, base=self.rope_base)

    def _attend(self, q, k, v, restrict, *, n: int, h: int, deterministic: bool, decode: bool):
        """Attention with this module's settings over k, v: [B, S, K, H], or head-major
        [B, K, S, H] from the cache when decoding; returns [B, L, N, H]. `restrict` is a
        `local.Window`, or a (mask, bias) pair. Sows the attention weights when asked."""
        dropout = core.dropout_active(self.dropout_rate, deterministic)
        score_params = projections.score_weights(self, self.score, n, h, self.param_dtype)
        if self.is_mutable_collection(INTERMEDIATES):  # only then: no cost otherwise
            weights = _weights(q, k, restrict, self.score, score_params, decode=decode)
            self.sow(INTERMEDIATES, ATTENTION_WEIGHTS, weights)
        return _attention_fn(restrict, decode)(
            q,
            k,
            v,
            score=self.score,
            score_params=score_params,
            dropout_rate=self.dropout_rate,
            dropout_rng=self.make_rng("dropout") if dropout else None,
            deterministic=deterministic,
            implementation=self.implementation,
        )

    @nn.compact
    def __call__(
        self,
        inputs_q: Float[Array, "B L D"],
        inputs_kv: Float[Array, "B S E"] | None = None,
        *,
        mask: Bool[Array, "#B #N #L #S"] | core.Lengths | None = None,
        bias: Float[Array, "#B #N #L #S"] | None = None,
        window: local.Window | None = None,
        q_positions: Array | None = None,
        kv_positions: Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
    ) -> Float[Array, "B L D"]:
        """Attends `inputs_q` over `inputs_kv` (self-attention when it is None).

        Args:
          inputs_q: [B, L, D] queries' inputs.
          inputs_kv: [B, S, E] keys' and values' inputs (cross-attention), or None.
          mask: bool, True = may attend, broadcastable to [B, N, L, S]. While decoding with
            self-attention S is the cache length and the mask must hide the unwritten slots.
            Outside decoding also a `core.Lengths` (padding and causality as lengths, which
            cuDNN's fused attention applies in its kernel).
          bias: additive logit bias broadcastable to [B, N, L, S] (relative positions, ALiBi).
          window: restricted self-attention (`local.Window`) in place of `mask` and `bias`,
            outside decoding: O(L · r) for the dot scores (see `local.window_attention`).
          q_positions, kv_positions: int32 [B, L] / [B, S] positions for RoPE (default
            0..L-1, or cache_index.. while decoding; for packed rows pass per-segment positions).
          deterministic: disables attention dropout.
          decode: use the "cache" collection. Self-attention writes the L new keys/values at
            `cache_index` (created as zeros the first time, at full length) and attends over
            the whole cache [B, K, max_len, H]. Cross-attention (`cross=True`) projects
            `inputs_kv` once into the cache, or reads it back when `inputs_kv` is None.

        Returns:
          [B, L, D] in the compute dtype.

        Raises:
          ValueError: for a cross-attention module called without `inputs_kv` outside decoding,
            a `window` with cross-attention, decoding, a mask or a bias, a `core.Lengths` mask
            while decoding, or a decoding step whose shapes do not fit the cache.
        """
        core.check_score(self.score)
        if decode and isinstance(mask, core.Lengths):
            raise ValueError("decode=True takes a boolean mask over the cache, not core.Lengths")
        _check_window(window, inputs_kv, mask, bias, decode)
        width = inputs_q.shape[-1]
        n, kv, h = projections.head_sizes(width, self.num_heads, self.num_kv_heads, self.head_dim)
        if self.cross and inputs_kv is None and not decode:
            raise ValueError("cross-attention needs inputs_kv unless decode=True")
        project = self._projections()
        if self.cross and decode:
            q = project.query(inputs_q, n, h)  # [B, L, N, H]
            new_kv = None if inputs_kv is None else project.key_value(inputs_kv, kv, h)
            k, v = cache.cross_attention_kv(self, new_kv)  # [B, K, S, H]
        else:
            q, k, v = project.qkv(inputs_q, inputs_kv, n, kv, h)
        if self.rotary:
            self_attention = inputs_kv is None
            q, k = self._rope(
                q, k, q_positions, kv_positions, self_attention=self_attention, decode=decode
            )
        if self.query_scale != 1.0:  # μP's logits ∝ 1/head_dim (`tfjax.models.mup`)
            q = q * jnp.asarray(self.query_scale, q.dtype)
        if decode and not self.cross:
            k, v = cache.self_attention_kv(self, k, v)  # [B, K, max_len, H]
        restrict = (mask, bias) if window is None else window
        out = self._attend(q, k, v, restrict, n=n, h=h, deterministic=deterministic, decode=decode)
        return project.output(out, width)  # [B, L, D]


def _weights(q, k, restrict, score: str, score_params, *, decode: bool) -> Array:
    """The attention probabilities [B, N, L, S] in float32 (`core.attention_weights`), for any
    path: the cache's keys are head-major, a `local.Window` becomes its dense mask and bias."""
    if decode:
        k = cache.seq_major(k)  # [B, S, K, H]
        rows = cache.shared_rows(q, k)  # > 1: a cache shared by the beams of a source
        k = k if rows == 1 else jnp.repeat(k, rows, axis=0)
    if isinstance(restrict, local.Window):
        mask, bias = local.dense_mask_and_bias(restrict, q.shape[1])
    else:
        mask, bias = restrict
    if isinstance(mask, core.Lengths):
        mask = mask.dense(q.shape[1], k.shape[1])
    return core.attention_weights(
        q, k, mask=mask, bias=bias, score=score, score_params=score_params
    )


def _attention_fn(restrict, decode: bool):
    """The attention function for a `local.Window` or a (mask, bias) pair, those bound."""
    if isinstance(restrict, local.Window):
        return functools.partial(local.window_attention, window=restrict)
    mask, bias = restrict
    attend = cache.attend_over_cache if decode else core.dot_product_attention
    return functools.partial(attend, mask=mask, bias=bias)


def _check_window(window, inputs_kv, mask, bias, decode: bool) -> None:
    """ValueError unless `window` is None or comes alone, with uncached self-attention."""
    if window is None:
        return
    given = [
        name
        for name, x in (("inputs_kv", inputs_kv), ("mask", mask), ("bias", bias))
        if x is not None
    ]
    given += ["decode=True"] if decode else []
    if given:
        raise ValueError(
            "window= restricts uncached self-attention and replaces mask= and bias=; it came "
            f"with {', '.join(given)}"
        )
