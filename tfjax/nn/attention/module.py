"""`MultiHeadAttention`: the Flax module with projections, RoPE, the KV cache and dispatch.

Sources: multi-head attention, Vaswani et al. 2017, §3.2.2; self- and cross-attention
(encoder-decoder attention): §3.2.3; grouped-query heads: Ainslie et al. 2023 (GQA), §2;
low-rank value projection: the value matrix factorised as W_down [D, r] · W_up [r, K·H].
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from tfjax.nn import linear, positional
from tfjax.nn.attention import cache, core


def _seq_major_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[2], shape[1], shape[3])


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2.2) with grouped-query heads.

    Self-attention when `inputs_kv` is None (one fused QKV projection by default); otherwise
    cross-attention with queries from `inputs_q` (the decoder) and keys and values from
    `inputs_kv` (the encoder output), §3.2.3.

    Decoding (`decode=True`) keeps a "cache" collection: self-attention holds "cached_key",
    "cached_value" [B, K, max_len, H] and "cache_index" (int32 scalar); cross-attention holds
    "cached_cross_key", "cached_cross_value" [B, K, S, H]. The cache is head-major so that
    `cached_attention` reads it in place at every step.

    Parameters: "qkv" [D, N + 2K, H] (fused self-attention), or "query" [D, N, H] with "kv"
    [Dkv, 2K, H] (cross-attention) or "key"/"value" [Dkv, K, H] (unfused); "out" [N, H, D].
    With `value_rank` r > 0 the value projection is "value_down" [Dkv, r] · "value_up" [r, K, H].

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
    dropout_rate: float = 0.0
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

    def _sizes(self, width: int) -> tuple[int, int, int]:
        n = self.num_heads
        kv = self.num_kv_heads or n
        if n <= 0 or n % kv:
            raise ValueError(f"num_heads={n} must be a positive multiple of num_kv_heads={kv}")
        h = self.head_dim or width // n
        if not self.head_dim and width % n:
            raise ValueError(f"model width {width} is not divisible by num_heads={n}")
        return n, kv, h

    def _dense(self, features, name: str, axis=-1, use_bias=None):
        return nn.DenseGeneral(
            features,
            axis=axis,
            use_bias=self.use_bias if use_bias is None else use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            dot_general=linear.dense_dot_general,
            name=name,
        )

    def _project_kv(self, x_kv: Array, kv: int, h: int) -> tuple[Array, Array]:
        """Returns k, v [B, S, K, H] from the separate "kv" (or "key"/"value") projections."""
        low_rank = self.value_rank > 0
        if self.fused_qkv and not low_rank:
            kv_proj = self._dense((2 * kv, h), "kv")(x_kv)  # [B, S, 2K, H]
            return kv_proj[:, :, :kv], kv_proj[:, :, kv:]
        k = self._dense((kv, h), "key")(x_kv)  # [B, S, K, H]
        if low_rank:
            return k, self._low_rank_value(x_kv, kv, h)
        return k, self._dense((kv, h), "value")(x_kv)  # [B, S, K, H]

    def _low_rank_value(self, x_kv: Array, kv: int, h: int) -> Array:
        v = self._dense(self.value_rank, "value_down", use_bias=False)(x_kv)  # [B, S, r]
        return self._dense((kv, h), "value_up")(v)  # [B, S, K, H]

    def _project(self, x_q: Array, x_kv: Array | None, n: int, kv: int, h: int):
        """Returns q [B, L, N, H], k [B, S, K, H], v [B, S, K, H]."""
        if x_kv is None and self.fused_qkv:
            low_rank = self.value_rank > 0
            width = n + kv + (0 if low_rank else kv)
            qkv = self._dense((width, h), "qkv")(x_q)  # [B, L, N + 2K, H]
            q, k = qkv[:, :, :n], qkv[:, :, n : n + kv]
            v = self._low_rank_value(x_q, kv, h) if low_rank else qkv[:, :, n + kv :]
            return q, k, v
        q = self._dense((n, h), "query")(x_q)  # [B, L, N, H]
        k, v = self._project_kv(x_q if x_kv is None else x_kv, kv, h)
        return q, k, v

    def _self_cache(self, k: Array, v: Array) -> tuple[Array, Array]:
        """Writes the new keys/values [B, L, K, H] at `cache_index`; returns the whole cache,
        head-major [B, K, max_len, H].

        When the cache does not exist yet (`model.init` with decode=True on full-length inputs),
        it is created with zeros of the inputs' shape, head-major, and k, v pass through.
        """
        k, v = cache.head_major(k), cache.head_major(v)  # [B, K, L, H]
        exists = self.has_variable("cache", "cached_key")
        cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
        if not exists:
            return k, v
        b, num_kv, max_len, h = cached_k.value.shape
        if k.shape[:2] != (b, num_kv) or k.shape[3] != h or k.shape[2] > max_len:
            raise ValueError(
                f"new keys {_seq_major_shape(k.shape)} [B, L, K, H] do not fit the cache "
                f"[B, K, max_len, H] = {cached_k.value.shape}"
            )
        start = (0, 0, index.value, 0)
        update = jax.lax.dynamic_update_slice
        cached_k.value = update(cached_k.value, k.astype(cached_k.value.dtype), start)
        cached_v.value = update(cached_v.value, v.astype(cached_v.value.dtype), start)
        index.value = index.value + k.shape[2]
        return cached_k.value, cached_v.value

    def _cross_cache(self, inputs_kv: Array | None, kv: int, h: int) -> tuple[Array, Array]:
        """Encoder keys/values, head-major [B, K, S, H], projected once per source and kept in
        the cache."""
        if inputs_kv is not None:
            k, v = map(cache.head_major, self._project_kv(inputs_kv, kv, h))  # [B, K, S, H]
            self.put_variable("cache", "cached_cross_key", k)
            self.put_variable("cache", "cached_cross_value", v)
            return k, v
        if not self.has_variable("cache", "cached_cross_key"):
            raise ValueError(
                "cross-attention with decode=True and inputs_kv=None reads the cached encoder "
                "keys, but the cache has none: pass the encoder output once first"
            )
        return (
            self.get_variable("cache", "cached_cross_key"),
            self.get_variable("cache", "cached_cross_value"),
        )

    def _attend(self, q, k, v, mask, bias, n: int, h: int, deterministic: bool) -> Array:
        """`dot_product_attention` with this module's settings; k, v [B, S, K, H]."""
        dropout = self.dropout_rate > 0.0 and not deterministic
        return core.dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            score=self.score,
            score_params=self._score_params(n, h),
            dropout_rate=self.dropout_rate,
            dropout_rng=self.make_rng("dropout") if dropout else None,
            deterministic=deterministic,
            implementation=self.implementation,
        )  # [B, L, N, H]

    def _attend_cache(self, q, k, v, mask, bias, n: int, h: int, deterministic: bool) -> Array:
        """Attention over the head-major cached k, v [B, K, S, H]; returns [B, L, N, H]."""
        dropout = self.dropout_rate > 0.0 and not deterministic
        if core.use_fast_path(self.score, self.implementation, dropout):
            scale = h**-0.5 if self.score == "scaled_dot" else 1.0
            return cache.cached_attention(q, k, v, mask=mask, bias=bias, scale=scale)
        return self._attend(
            q, cache.seq_major(k), cache.seq_major(v), mask, bias, n, h, deterministic
        )

    def _decode_positions(self, q: Array) -> Array:
        """Default RoPE positions while decoding: cache_index, cache_index + 1, ... [B, L]."""
        start = 0
        if self.has_variable("cache", "cached_key"):
            start = self.get_variable("cache", "cache_index")
        return positional.default_positions(q) + start

    def _score_params(self, n: int, h: int) -> dict[str, Array] | None:
        if self.score == "general":
            eye = lambda key, shape, dtype: jnp.broadcast_to(jnp.eye(h, dtype=dtype), shape)  # noqa: E731
            return {"w": self.param("score_w", eye, (n, h, h), self.param_dtype)}
        if self.score == "additive":
            init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
            return {
                "w_q": self.param("score_w_q", init, (n, h, h), self.param_dtype),
                "w_k": self.param("score_w_k", init, (n, h, h), self.param_dtype),
                "v": self.param(
                    "score_v", nn.initializers.normal(h**-0.5), (n, h), self.param_dtype
                ),
            }
        return None

    @nn.compact
    def __call__(
        self,
        inputs_q: Float[Array, "B L D"],
        inputs_kv: Float[Array, "B S E"] | None = None,
        *,
        mask: Bool[Array, "#B #N #L #S"] | None = None,
        bias: Float[Array, "#B #N #L #S"] | None = None,
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
          bias: additive logit bias broadcastable to [B, N, L, S] (relative positions, ALiBi).
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
            or a decoding step whose shapes do not fit the cache.
        """
        core.check_score(self.score)
        width = inputs_q.shape[-1]
        n, kv, h = self._sizes(width)
        if self.cross and inputs_kv is None and not decode:
            raise ValueError("cross-attention needs inputs_kv unless decode=True")
        if self.cross and decode:
            q = self._dense((n, h), "query")(inputs_q)  # [B, L, N, H]
            k, v = self._cross_cache(inputs_kv, kv, h)
        else:
            q, k, v = self._project(inputs_q, inputs_kv, n, kv, h)
        if self.rotary:
            if q_positions is None:
                q_positions = (
                    self._decode_positions(q) if decode else positional.default_positions(q)
                )
            if kv_positions is None:
                kv_positions = q_positions if inputs_kv is None else positional.default_positions(k)
            q = positional.apply_rope(q, q_positions, base=self.rope_base)
            k = positional.apply_rope(k, kv_positions, base=self.rope_base)
        if decode and not self.cross:
            k, v = self._self_cache(k, v)  # [B, K, max_len, H]
        if decode:  # k, v: head-major [B, K, S, H]
            out = self._attend_cache(q, k, v, mask, bias, n, h, deterministic)
        else:
            out = self._attend(q, k, v, mask, bias, n, h, deterministic)  # [B, L, N, H]
        return self._dense(width, "out", axis=(-2, -1))(out)  # [B, L, D]
